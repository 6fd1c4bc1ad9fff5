#include "s3/s3_xml.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::s3 {
namespace {

bool IsNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' ||
         c == '-' || c == '.' || c == ':' ||
         (static_cast<unsigned char>(c) & 0x80) != 0;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Parser {
 public:
  explicit Parser(absl::string_view doc) : s_(doc) {}

  absl::StatusOr<XmlElement> Document() {
    if (absl::StartsWith(s_, "\xEF\xBB\xBF")) pos_ = 3;  // UTF-8 BOM
    CKPT_RETURN_IF_ERROR(SkipMisc());
    if (Rest().empty()) return Error("no root element");
    XmlElement root;
    CKPT_RETURN_IF_ERROR(Element(&root, 1));
    CKPT_RETURN_IF_ERROR(SkipMisc());
    if (!Rest().empty()) return Error("content after the root element");
    return root;
  }

 private:
  absl::string_view Rest() const { return s_.substr(pos_); }
  bool Eat(absl::string_view token) {
    if (!absl::StartsWith(Rest(), token)) return false;
    pos_ += token.size();
    return true;
  }
  void SkipSpace() {
    while (pos_ < s_.size() &&
           absl::ascii_isspace(static_cast<unsigned char>(s_[pos_]))) {
      ++pos_;
    }
  }
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed XML at byte ", pos_, ": ", what));
  }
  // Moves past `terminator`, which must come later.
  absl::Status SkipPast(absl::string_view terminator, absl::string_view what) {
    const size_t end = s_.find(terminator, pos_);
    if (end == absl::string_view::npos) {
      return Error(absl::StrCat("unterminated ", what));
    }
    pos_ = end + terminator.size();
    return absl::OkStatus();
  }

  // Whitespace, comments and processing instructions (the XML declaration
  // among them) around the root element.
  absl::Status SkipMisc() {
    while (true) {
      SkipSpace();
      if (Eat("<?")) {
        CKPT_RETURN_IF_ERROR(SkipPast("?>", "processing instruction"));
      } else if (Eat("<!--")) {
        CKPT_RETURN_IF_ERROR(SkipPast("-->", "comment"));
      } else if (absl::StartsWith(Rest(), "<!")) {
        return Error("DOCTYPE and other declarations are not accepted");
      } else {
        return absl::OkStatus();
      }
    }
  }

  absl::StatusOr<std::string> Name() {
    const size_t start = pos_;
    while (pos_ < s_.size() && IsNameChar(s_[pos_])) ++pos_;
    if (pos_ == start) return Error("expected a name");
    return std::string(s_.substr(start, pos_ - start));
  }

  // Skips the attributes of a start tag, up to '>' or "/>".
  absl::Status Attributes() {
    while (true) {
      SkipSpace();
      if (pos_ >= s_.size()) return Error("unterminated start tag");
      const char c = s_[pos_];
      if (c == '>' || c == '/') return absl::OkStatus();
      CKPT_RETURN_IF_ERROR(Name().status());
      SkipSpace();
      if (!Eat("=")) return Error("expected '=' after an attribute name");
      SkipSpace();
      if (pos_ >= s_.size() || (s_[pos_] != '"' && s_[pos_] != '\'')) {
        return Error("expected a quoted attribute value");
      }
      const char quote = s_[pos_++];
      const size_t end = s_.find(quote, pos_);
      if (end == absl::string_view::npos) {
        return Error("unterminated attribute value");
      }
      pos_ = end + 1;
    }
  }

  // A reference after '&' (already consumed), appended decoded to `out`.
  absl::Status Reference(std::string* out) {
    const size_t semi = s_.find(';', pos_);
    if (semi == absl::string_view::npos || semi - pos_ > 10) {
      return Error("unterminated entity reference");
    }
    const absl::string_view ref = s_.substr(pos_, semi - pos_);
    pos_ = semi + 1;
    if (ref == "lt") {
      *out += '<';
    } else if (ref == "gt") {
      *out += '>';
    } else if (ref == "amp") {
      *out += '&';
    } else if (ref == "quot") {
      *out += '"';
    } else if (ref == "apos") {
      *out += '\'';
    } else if (absl::StartsWith(ref, "#")) {
      uint32_t cp = 0;
      const bool hex = absl::StartsWith(ref, "#x");
      const absl::string_view digits = ref.substr(hex ? 2 : 1);
      bool ok = !digits.empty() && (hex ? absl::SimpleHexAtoi(digits, &cp)
                                        : absl::SimpleAtoi(digits, &cp));
      ok = ok && cp != 0 && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
      if (!ok) return Error(absl::StrCat("bad character reference &", ref));
      AppendUtf8(cp, out);
    } else {
      return Error(absl::StrCat("unknown entity &", ref, ";"));
    }
    return absl::OkStatus();
  }

  // An element starting at '<'; `depth` counts this one.
  absl::Status Element(XmlElement* e, int depth) {
    if (depth > kMaxXmlDepth) {
      return Error(absl::StrCat("elements nested deeper than ", kMaxXmlDepth));
    }
    if (!Eat("<")) return Error("expected '<'");
    CKPT_ASSIGN_OR_RETURN(std::string qname, Name());
    CKPT_RETURN_IF_ERROR(Attributes());
    const size_t colon = qname.rfind(':');
    e->name = colon == std::string::npos ? qname : qname.substr(colon + 1);
    if (Eat("/>")) return absl::OkStatus();
    if (!Eat(">")) return Error("expected '>'");
    while (true) {
      if (pos_ >= s_.size()) {
        return Error(absl::StrCat("<", qname, "> is not closed"));
      }
      const char c = s_[pos_];
      if (c == '&') {
        ++pos_;
        CKPT_RETURN_IF_ERROR(Reference(&e->text));
      } else if (c != '<') {
        e->text += c;
        ++pos_;
      } else if (Eat("</")) {
        CKPT_ASSIGN_OR_RETURN(std::string end, Name());
        SkipSpace();
        if (end != qname || !Eat(">")) {
          return Error(
              absl::StrCat("</", end, "> does not close <", qname, ">"));
        }
        return absl::OkStatus();
      } else if (Eat("<![CDATA[")) {
        const size_t end = s_.find("]]>", pos_);
        if (end == absl::string_view::npos) return Error("unterminated CDATA");
        e->text.append(s_.data() + pos_, end - pos_);
        pos_ = end + 3;
      } else if (Eat("<!--")) {
        CKPT_RETURN_IF_ERROR(SkipPast("-->", "comment"));
      } else if (Eat("<?")) {
        CKPT_RETURN_IF_ERROR(SkipPast("?>", "processing instruction"));
      } else if (absl::StartsWith(Rest(), "<!")) {
        return Error("declarations are not accepted inside elements");
      } else {
        e->children.emplace_back();
        CKPT_RETURN_IF_ERROR(Element(&e->children.back(), depth + 1));
      }
    }
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

const XmlElement* XmlElement::Child(absl::string_view child) const {
  for (const XmlElement& c : children) {
    if (c.name == child) return &c;
  }
  return nullptr;
}

std::string XmlElement::ChildText(absl::string_view child) const {
  const XmlElement* c = Child(child);
  return c == nullptr ? std::string() : c->text;
}

std::vector<const XmlElement*> XmlElement::Children(
    absl::string_view child) const {
  std::vector<const XmlElement*> out;
  for (const XmlElement& c : children) {
    if (c.name == child) out.push_back(&c);
  }
  return out;
}

absl::StatusOr<XmlElement> ParseXml(absl::string_view doc) {
  return Parser(doc).Document();
}

std::string XmlEscape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
          absl::StrAppend(&out, "&#", static_cast<int>(c), ";");
        } else if (c == '\r') {
          out += "&#13;";  // a raw CR would be normalised away
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

}  // namespace ckpt::s3

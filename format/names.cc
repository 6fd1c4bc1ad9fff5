#include "ckpt/format/names.h"

#include "absl/strings/str_cat.h"
#include "ckpt/format/format_constants.h"

namespace ckpt::format {
namespace {

absl::Status Bad(absl::string_view what, absl::string_view name,
                 absl::string_view why) {
  std::string shown(name.substr(0, 80));
  return absl::InvalidArgumentError(
      absl::StrCat("invalid ", what, " '", EscapeText(shown),
                   name.size() > 80 ? "..." : "", "': ", why));
}

// The length of the well-formed UTF-8 sequence that starts at s[i] (1 to
// 4), or 0 if none does: a stray continuation byte, a truncated sequence,
// an overlong encoding, a surrogate or a value past U+10FFFF.
size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  const unsigned char c = s[i];
  size_t n;
  uint32_t cp;
  if (c < 0x80) {
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    n = 1;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 2;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 3;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (n >= s.size() - i) return 0;
  for (size_t k = 1; k <= n; ++k) {
    const unsigned char cc = s[i + k];
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) ||
      (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    return 0;
  }
  return n + 1;
}

}  // namespace

bool IsValidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string EscapeText(absl::string_view s, LineBreaks line_breaks) {
  static constexpr char kHex[] = "0123456789abcdef";
  auto append_escape = [](std::string* out, const char* prefix,
                          unsigned char byte) {
    absl::StrAppend(out, prefix, absl::string_view(&kHex[byte >> 4], 1),
                    absl::string_view(&kHex[byte & 0xF], 1));
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 2 && c == 0xC2 && static_cast<unsigned char>(s[i + 1]) <= 0x9F) {
      // A C1 control character, U+0080..U+009F (U+009B is CSI).
      append_escape(&out, "\\u00", s[i + 1]);
    } else if (n > 1) {
      out.append(s.data() + i, n);
    } else if (n == 1 && c >= 0x20 && c != 0x7F) {
      out += static_cast<char>(c);
    } else if (n == 1 && line_breaks == LineBreaks::kKeep &&
               (c == '\n' || c == '\t')) {
      out += static_cast<char>(c);
    } else {
      // A C0 control, DEL, or a byte that is not part of valid UTF-8.
      append_escape(&out, "\\x", c);
      i += 1;
      continue;
    }
    i += n;
  }
  return out;
}

absl::Status ValidateEntryName(absl::string_view name) {
  if (name.empty()) return Bad("name", name, "empty");
  if (name.size() > kMaxNameLength) {
    return Bad(
        "name", name,
        absl::StrCat(name.size(), " bytes, the limit is ", kMaxNameLength));
  }
  for (char ch : name) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7F) return Bad("name", name, "control character");
    if (c == '/' || c == '\\') return Bad("name", name, "path separator");
  }
  if (name.find("..") != absl::string_view::npos) {
    return Bad("name", name, "contains '..'");
  }
  if (!IsValidUtf8(name)) return Bad("name", name, "not valid UTF-8");
  return absl::OkStatus();
}

absl::Status ValidateFileName(absl::string_view name) {
  if (name.empty()) return Bad("file name", name, "empty");
  if (name.size() > kMaxFileNameLength)
    return Bad("file name", name, "too long");
  if (name[0] == '.') return Bad("file name", name, "starts with '.'");
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return Bad("file name", name, "character outside [A-Za-z0-9._-]");
  }
  return absl::OkStatus();
}

}  // namespace ckpt::format

#include "reshard/overrides.h"

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/format_constants.h"
#include "nlohmann/json.hpp"

namespace ckpt::tools {
namespace {

using ops::kSplitForms;

std::string Quote(absl::string_view s) { return ops::QuotedForMessage(s); }

// Builds Overrides from SAX events, checking the document's shape as it
// goes; the first problem stops the parse (the handler returns false).
//   depth 0: before the document    depth 2: inside "entries"
//   depth 1: the top-level object   depth 3: inside one entry's object
class Handler {
 public:
  using json = nlohmann::json;

  bool null() { return Value("null"); }
  bool boolean(bool) { return Value("a boolean"); }
  bool number_integer(json::number_integer_t) { return Value("a number"); }
  bool number_unsigned(json::number_unsigned_t) { return Value("a number"); }
  bool number_float(json::number_float_t, const std::string&) {
    return Value("a number");
  }
  bool binary(json::binary_t&) { return Value("binary data"); }
  bool start_array(std::size_t) { return Value("an array"); }
  bool end_array() { return Fail("unexpected end of array"); }

  bool string(std::string& s) {
    if (depth_ == 3 && key_ == "split") {
      auto split = ParseSplit(s);
      if (!split.ok()) {
        return Fail(absl::StrCat(EntryPath(), ".split: expected ", kSplitForms,
                                 ", got ", Quote(s)));
      }
      split_ = *split;
      has_split_ = true;
      return true;
    }
    return Value("a string");
  }

  bool start_object(std::size_t) {
    switch (depth_) {
      case 0:
        break;
      case 1:
        if (key_ != "entries") return Value("an object");
        has_entries_ = true;
        break;
      case 2:
        entry_ = key_;
        has_split_ = false;
        break;
      default:
        return Value("an object");
    }
    ++depth_;
    keys_.emplace_back();
    key_.clear();
    return true;
  }

  bool key(std::string& k) {
    if (!keys_.back().insert(k).second) {
      return Fail(absl::StrCat(Where(), ": duplicate key ", Quote(k)));
    }
    if (depth_ == 1 && k != "entries") {
      return Fail(absl::StrCat("top level: unknown key ", Quote(k),
                               " (expected \"entries\")"));
    }
    if (depth_ == 2) {
      if (k.empty()) return Fail("entries: empty entry name or pattern");
      if (k.size() > format::kMaxNameLength) {
        return Fail(absl::StrCat("entries: key of ", k.size(),
                                 " bytes is longer than ",
                                 format::kMaxNameLength, " (", Quote(k), ")"));
      }
    }
    if (depth_ == 3 && k != "split") {
      return Fail(absl::StrCat(EntryPath(), ": unknown key ", Quote(k),
                               " (expected \"split\")"));
    }
    key_ = k;
    return true;
  }

  bool end_object() {
    switch (depth_) {
      case 1:
        if (!has_entries_) return Fail("top level: missing key \"entries\"");
        break;
      case 3:
        if (!has_split_)
          return Fail(absl::StrCat(EntryPath(), ": missing key \"split\""));
        result_.rules.push_back(OverrideRule{entry_, split_});
        key_.clear();
        break;
      default:
        break;
    }
    --depth_;
    keys_.pop_back();
    if (depth_ == 2) key_.clear();
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const json::exception& ex) {
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..."
    absl::string_view what = ex.what();
    size_t at = what.find("at line ");
    if (at != absl::string_view::npos) {
      what.remove_prefix(at + 3);
    } else if (absl::StartsWith(what, "[json.exception.")) {
      what.remove_prefix(what.find(']') + 1);
    }
    return Fail(std::string(absl::StripAsciiWhitespace(what)));
  }

  const std::string& error() const { return error_; }
  Overrides& result() { return result_; }

 private:
  // A value other than an object or a split string, where `got` was found.
  bool Value(const char* got) {
    switch (depth_) {
      case 0:
        return Fail(absl::StrCat("top level: expected an object, got ", got));
      case 1:
        return Fail(absl::StrCat("entries: expected an object, got ", got));
      case 2:
        return Fail(absl::StrCat("entries.", Quote(key_),
                                 ": expected an object, got ", got));
      default:
        return Fail(
            absl::StrCat(EntryPath(), ".split: expected a string, got ", got));
    }
  }
  std::string EntryPath() const {
    return absl::StrCat("entries.", Quote(entry_));
  }
  std::string Where() const {
    switch (depth_) {
      case 1:
        return "top level";
      case 2:
        return "entries";
      default:
        return EntryPath();
    }
  }
  bool Fail(std::string msg) {
    if (error_.empty()) error_ = std::move(msg);
    return false;
  }

  int depth_ = 0;
  std::vector<std::set<std::string>> keys_;  // keys seen, per open object
  std::string key_;                          // the last key at this depth
  std::string entry_;                        // the entry being read (depth 3)
  bool has_entries_ = false;
  bool has_split_ = false;
  Split split_;
  Overrides result_;
  std::string error_;
};

}  // namespace

absl::StatusOr<Overrides> ParseOverrides(absl::string_view text) {
  Handler h;
  const bool ok = nlohmann::json::sax_parse(
      text.begin(), text.end(), &h, nlohmann::json::input_format_t::json,
      /*strict=*/true, /*ignore_comments=*/false);
  if (!ok || !h.error().empty()) {
    return absl::InvalidArgumentError(h.error().empty() ? "invalid JSON"
                                                        : h.error());
  }
  return std::move(h.result());
}

}  // namespace ckpt::tools

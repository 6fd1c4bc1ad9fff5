#include "ckpt/interop/strict_json.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/names.h"

namespace ckpt::interop {
namespace {

bool AllStringsValid(const nlohmann::ordered_json& v) {
  if (v.is_string()) return IsValidUtf8(v.get_ref<const std::string&>());
  if (v.is_object()) {
    for (const auto& [k, x] : v.items()) {
      if (!IsValidUtf8(k) || !AllStringsValid(x)) return false;
    }
  } else if (v.is_array()) {
    for (const auto& x : v) {
      if (!AllStringsValid(x)) return false;
    }
  }
  return true;
}

// Bytes counted for what a parse keeps, from above: a value (a json node);
// a container's storage, or a string's (a std::string of its own); an
// object member (a node of the object's map and of the key set of the
// duplicate check); text beyond the small-string buffer, once in each.
constexpr uint64_t kValueBytes = 16;
constexpr uint64_t kContainerBytes = 64;
constexpr uint64_t kStringBytes = 48;
constexpr uint64_t kMemberBytes = 176;
uint64_t TextBytes(size_t n) { return n > 15 ? n + 1 : 0; }

// Counts the bytes a parse keeps against a limit; once past it, Charge
// returns false from then on.
class JsonBudget {
 public:
  explicit JsonBudget(uint64_t limit) : limit_(limit) {}
  bool Charge(uint64_t bytes) {
    if (over_ || bytes > limit_ - used_) {
      over_ = true;
      return false;
    }
    used_ += bytes;
    return true;
  }
  bool over() const { return over_; }
  uint64_t limit() const { return limit_; }

 private:
  uint64_t limit_, used_ = 0;
  bool over_ = false;
};

// What an event of the parse keeps.
uint64_t EventBytes(nlohmann::json::parse_event_t event,
                    const nlohmann::json& parsed) {
  using E = nlohmann::json::parse_event_t;
  switch (event) {
    case E::object_start:
    case E::array_start:
      return kValueBytes + kContainerBytes;
    case E::key:
      return kMemberBytes +
             2 * TextBytes(parsed.is_string()
                               ? parsed.get_ref<const std::string&>().size()
                               : 0);
    case E::value:
      return kValueBytes +
             (parsed.is_string()
                  ? kStringBytes +
                        TextBytes(parsed.get_ref<const std::string&>().size())
                  : 0);
    case E::object_end:
    case E::array_end:
      break;
  }
  return 0;
}

}  // namespace

bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    int n;                               // continuation bytes
    unsigned char lo = 0x80, hi = 0xbf;  // range of the first continuation byte
    if (c < 0x80) {
      n = 0;
    } else if (c >= 0xc2 && c <= 0xdf) {
      n = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 2;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return false;
    }
    if (s.size() - i <= static_cast<size_t>(n)) return false;
    for (int k = 1; k <= n; ++k) {
      const unsigned char b = s[i + k];
      if (k == 1 ? (b < lo || b > hi) : (b >> 6) != 2) return false;
    }
    i += n + 1;
  }
  return true;
}

absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text,
                                               absl::string_view what) {
  return ParseStrictJson(text, what,
                         kJsonBudgetPerByte * text.size() + kJsonBudgetFixed);
}

absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text,
                                               absl::string_view what,
                                               uint64_t memory_budget) {
  // nlohmann's lexer takes a NUL byte for the end of the input, so that
  // "{...}\0<anything>" would parse as "{...}". A raw NUL is never valid
  // JSON (inside a string it must be escaped), and the reference
  // implementation of safetensors (serde_json) rejects it.
  if (size_t nul = text.find('\0'); nul != absl::string_view::npos) {
    return absl::DataLossError(absl::StrCat(
        what, " is not well-formed UTF-8 JSON: a NUL byte at offset ", nul));
  }
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  bool too_deep = false;
  JsonBudget budget(memory_budget);
  auto callback = [&](int depth, nlohmann::json::parse_event_t event,
                      nlohmann::json& parsed) -> bool {
    using E = nlohmann::json::parse_event_t;
    // Past the budget every value is discarded: nothing more is kept.
    if (!budget.Charge(EventBytes(event, parsed))) return false;
    if (event == E::object_start || event == E::array_start) {
      if (depth >= kMaxJsonDepth) too_deep = true;
      if (event == E::object_start) keys.emplace_back();
      return !too_deep;
    }
    if (event == E::object_end && !keys.empty()) keys.pop_back();
    if (event == E::key && !keys.empty() && parsed.is_string()) {
      if (!keys.back().insert(parsed.get<std::string>()).second &&
          duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
    }
    return true;
  };
  nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(), callback,
                                             /*allow_exceptions=*/false);
  if (too_deep) {
    return absl::DataLossError(
        absl::StrCat(what, " nests deeper than ", kMaxJsonDepth, " levels"));
  }
  if (budget.over()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " of ", text.size(), " bytes would take more than ",
        budget.limit(), " bytes of memory to parse; metadata needs far less"));
  }
  if (doc.is_discarded()) {
    return absl::DataLossError(
        absl::StrCat(what, " is not well-formed UTF-8 JSON"));
  }
  if (!duplicate.empty()) {
    return absl::DataLossError(absl::StrCat(
        what, " has the key '", format::EscapeText(duplicate), "' twice"));
  }
  return doc;
}

absl::StatusOr<std::string> DumpStrictJson(const nlohmann::ordered_json& doc,
                                           int indent) {
  if (!AllStringsValid(doc)) {
    return absl::InvalidArgumentError(
        "a name or metadata string is not valid UTF-8");
  }
  return doc.dump(indent, ' ', false,
                  nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace ckpt::interop

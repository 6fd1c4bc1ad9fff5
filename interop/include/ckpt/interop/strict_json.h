// JSON as the foreign formats' strict readers need it: parsing that rejects
// duplicate keys, invalid UTF-8 and deep nesting, without exceptions.
#ifndef CKPT_INTEROP_STRICT_JSON_H_
#define CKPT_INTEROP_STRICT_JSON_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ckpt::interop {

// The deepest nesting of arrays and objects accepted.
inline constexpr int kMaxJsonDepth = 64;
// The memory a parse may build: kJsonBudgetPerByte bytes per byte of the
// text + kJsonBudgetFixed (a JSON value of 2 or 3 bytes, "0," or "[],",
// becomes a node of 16 to 80 bytes).
inline constexpr uint64_t kJsonBudgetPerByte = 16;
inline constexpr uint64_t kJsonBudgetFixed = 64ull << 20;

// Parses `text` (`what` names it in errors: "header", "index"). DataLoss for
// malformed JSON or invalid UTF-8 (a raw NUL byte anywhere included), a key
// that occurs twice in one object (naming it), or nesting deeper than
// kMaxJsonDepth. ResourceExhausted when the document would take more than
// its budget (above) of memory, estimated from above as it is parsed: once
// past it nothing more is kept.
absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text,
                                               absl::string_view what);
// The same within `memory_budget` bytes instead.
absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text,
                                               absl::string_view what,
                                               uint64_t memory_budget);

// True iff `s` is well-formed UTF-8.
bool IsValidUtf8(absl::string_view s);

// `doc` as compact JSON (indent < 0) or indented. InvalidArgument if a
// string in it is not valid UTF-8.
absl::StatusOr<std::string> DumpStrictJson(const nlohmann::ordered_json& doc,
                                           int indent);

}  // namespace ckpt::interop

#endif  // CKPT_INTEROP_STRICT_JSON_H_

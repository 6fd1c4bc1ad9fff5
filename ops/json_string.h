// Internal to ckpt_ops: a string as a JSON string literal, for messages
// that quote text read from a JSON file.
#ifndef CKPT_OPS_JSON_STRING_H_
#define CKPT_OPS_JSON_STRING_H_

#include <string>

#include "absl/strings/string_view.h"

namespace ckpt::ops::internal {

// `s` as a JSON string literal in ASCII only, byte for byte what
// nlohmann::json(s).dump(-1, ' ', /*ensure_ascii=*/true,
// error_handler_t::replace) writes (the tools' JsonText): '"', '\\' and
// the control characters \b \f \n \r \t escaped as such, every other code
// point below 0x20 or from 0x7f on as \uXXXX (lowercase hex; a UTF-16
// surrogate pair above 0xffff), and each invalid UTF-8 sequence replaced by
// \ufffd at the byte where the decoder rejects it (that byte is read again
// as the start of a sequence when it is not the sequence's first).
std::string JsonStringLiteral(absl::string_view s);

}  // namespace ckpt::ops::internal

#endif  // CKPT_OPS_JSON_STRING_H_

// Validation of entry names and file names (spec/FORMAT.md §8.1, §11), and
// the one escaping of text read from a file for display (SECURITY.md).
#ifndef CKPT_FORMAT_NAMES_H_
#define CKPT_FORMAT_NAMES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ckpt::format {

// An entry name is 1..kMaxNameLength bytes of valid UTF-8 with no NUL, no
// control character (0x00-0x1F, 0x7F), no '/' or '\\', and no "..".
// InvalidArgument naming the problem and the (escaped) name otherwise.
absl::Status ValidateEntryName(absl::string_view name);

// Well-formed UTF-8: no overlong encodings, surrogates or code points past
// U+10FFFF. (NUL bytes are valid UTF-8; callers that forbid them check.)
bool IsValidUtf8(absl::string_view s);

// Whether EscapeText keeps newline and tab bytes.
enum class LineBreaks {
  kEscape,  // a field on one line: a string read from a file
  kKeep,    // a whole message or output line built of escaped fields
};

// `s`, bytes read from a file (an entry name, a metadata key or value, a
// writer string, a foreign format's tensor name or dtype string), as text
// that is safe to print: valid UTF-8 without control characters, so that
// it can carry no terminal escape sequence (spec/FORMAT.md §11, SECURITY.md
// "Names"). Every tool prints such strings, in its output and in its error
// messages, through this function.
//   - a C0 control byte 0x00-0x1F (NUL, ESC, CR; tab and newline too unless
//     `line_breaks` is kKeep) or DEL 0x7F         -> \xHH   ("\x1b")
//   - a C1 control character U+0080-U+009F      -> \u00HH ("\u009b")
//   - each byte that is not part of well-formed
//     UTF-8 (as IsValidUtf8 defines it)         -> \xHH   ("\xff")
//   - everything else (printable ASCII, '\' included, and every other
//     character) is kept as it is.
// For reading, not for parsing back: '\' is not escaped, so "\x1b" in the
// result may also be four characters of `s`. In exchange escaping is
// idempotent (EscapeText(EscapeText(s)) == EscapeText(s)), so a message
// that quotes escaped names can be escaped again whole.
std::string EscapeText(absl::string_view s,
                       LineBreaks line_breaks = LineBreaks::kEscape);

// A file name stored in metadata: 1..kMaxFileNameLength bytes from
// [A-Za-z0-9._-], not "." or "..", not starting with '.'. Such a name can
// never resolve outside the checkpoint directory.
absl::Status ValidateFileName(absl::string_view name);

// A metadata key: same rules as an entry name.
inline absl::Status ValidateMetadataKey(absl::string_view key) {
  return ValidateEntryName(key);
}

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_NAMES_H_

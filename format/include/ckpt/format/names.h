// Validation of entry names and file names (spec/FORMAT.md §8.1, §11).
#ifndef CKPT_FORMAT_NAMES_H_
#define CKPT_FORMAT_NAMES_H_

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

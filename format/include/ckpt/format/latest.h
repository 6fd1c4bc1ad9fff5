// The `latest` pointer of a checkpoint root (spec/FORMAT.md §4.2): one line
// "ckpt-latest v1 <dir> <xxh3-hex>\n" naming the committed checkpoint
// directory, replaced atomically by rename.
#ifndef CKPT_FORMAT_LATEST_H_
#define CKPT_FORMAT_LATEST_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::format {

// REQUIRES: `dir_name` passes ValidateFileName.
std::string EncodeLatest(absl::string_view dir_name);
// Returns the directory name. DataLoss for anything but exactly one valid
// line with a matching checksum and a valid file name; the checksum field is
// exactly 16 lowercase hex digits (no "0x", sign, space or upper case).
absl::StatusOr<std::string> DecodeLatest(absl::string_view bytes);

// "step-00000100". Steps beyond 8 digits use as many digits as they need.
std::string StepDirName(uint64_t step);
// Parses "step-<digits>"; false for anything else.
bool ParseStepDirName(absl::string_view name, uint64_t* step);

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_LATEST_H_

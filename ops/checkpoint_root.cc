#include "ckpt/ops/checkpoint_root.h"

#include "absl/strings/str_cat.h"
#include "ckpt/format/latest.h"

namespace ckpt::ops {

absl::Status CheckRootIsDirectoryOrAbsent(Storage* storage,
                                          const std::string& root) {
  absl::StatusOr<FileInfo> info = storage->Stat(root);
  if (info.ok() && !info->is_dir) {
    return absl::FailedPreconditionError(absl::StrCat(
        root, ": exists and is not a directory (a checkpoint root)"));
  }
  return absl::OkStatus();
}

absl::Status CheckStepIsFree(Storage* storage, const std::string& root,
                             uint64_t step, bool overwrite) {
  const std::string step_dir = JoinPath(root, format::StepDirName(step));
  if (!overwrite && storage->Stat(step_dir).ok()) {
    return absl::AlreadyExistsError(
        absl::StrCat(step_dir, ": a checkpoint of step ", step,
                     " already exists (use --force to replace it)"));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::ops

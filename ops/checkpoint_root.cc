#include "ckpt/ops/checkpoint_root.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/status_macros.h"
#include "storage/checkpoint_dir.h"

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

absl::StatusOr<std::vector<uint64_t>> CommittedSteps(Storage* storage,
                                                     const std::string& root) {
  CKPT_ASSIGN_OR_RETURN(internal::RootListing listing,
                        internal::ListRoot(storage, root));
  std::vector<uint64_t> steps;
  for (const auto& [step, name] : listing.committed) steps.push_back(step);
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace ckpt::ops

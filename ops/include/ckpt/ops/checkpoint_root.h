// What an import checks of a checkpoint root before it writes a checkpoint
// into it (ckpt-convert --from hdf5, safetensors and dcp), through Storage,
// so that a refusal comes before any work and names the path; and the
// committed checkpoints of a root (ckpt.torch.Checkpointer.steps).
#ifndef CKPT_OPS_CHECKPOINT_ROOT_H_
#define CKPT_OPS_CHECKPOINT_ROOT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/storage.h"

namespace ckpt::ops {

// `root` is a directory or does not exist yet: FailedPrecondition
// "ROOT: exists and is not a directory (a checkpoint root)" when it is
// anything else. `storage` is borrowed.
absl::Status CheckRootIsDirectoryOrAbsent(Storage* storage,
                                          const std::string& root);

// No checkpoint directory of `step` exists under `root`, unless
// `overwrite`: AlreadyExists "ROOT/step-NNNNNNNN: a checkpoint of step N
// already exists (use --force to replace it)". `storage` is borrowed.
absl::Status CheckStepIsFree(Storage* storage, const std::string& root,
                             uint64_t step, bool overwrite);

// The steps of the committed checkpoints under `root` (step-NNNNNNNN
// directories or prefixes holding MANIFEST, spec/FORMAT.md §4 and §4.3),
// ascending; uncommitted ones and other names are left out. A root that
// does not exist has none on an object store; on a file system it is
// NotFound naming it. `storage` is borrowed.
absl::StatusOr<std::vector<uint64_t>> CommittedSteps(Storage* storage,
                                                     const std::string& root);

}  // namespace ckpt::ops

#endif  // CKPT_OPS_CHECKPOINT_ROOT_H_

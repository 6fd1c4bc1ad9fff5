// ckpt-diff across formats: a foreign side (ckpt/interop/io/foreign.h) is
// converted, as ckpt-convert --from would, into a temporary checkpoint,
// removed afterwards, and compared as any checkpoint; the output names the
// original path and its format.
#ifndef CKPT_TOOLS_DIFF_FOREIGN_DIFF_H_
#define CKPT_TOOLS_DIFF_FOREIGN_DIFF_H_

#include <ostream>

#include "absl/status/statusor.h"
#include "diff/diff.h"

namespace ckpt::tools {

// RunDiff when both sides are ckpt checkpoints (or unrecognized); else the
// conversion above, then RunDiff with the temporary paths replaced by
// "<path> [dcp]" or "<path> [safetensors]" in the output.
absl::StatusOr<int> RunDiffAnyFormat(const DiffOptions& options, bool json,
                                     std::ostream& out);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_DIFF_FOREIGN_DIFF_H_

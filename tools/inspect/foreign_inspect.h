// ckpt-inspect of foreign inputs (ckpt/interop/io/foreign.h): a PyTorch
// DCP directory (Megatron torch_dist included), a safetensors file or a
// Hugging Face index. The formats of the text and JSON are in
// tools/README.md.
#ifndef CKPT_TOOLS_INSPECT_FOREIGN_INSPECT_H_
#define CKPT_TOOLS_INSPECT_FOREIGN_INSPECT_H_

#include <ostream>

#include "absl/status/statusor.h"
#include "inspect/inspect.h"

namespace ckpt::tools {

// The format, producer and entries of the input at options.path (--entry:
// the entry's chunks and where they are stored). Exit 0, or the error of
// opening it.
absl::StatusOr<int> InspectDcp(const InspectOptions& options,
                               std::ostream& out);
absl::StatusOr<int> InspectSafetensors(const InspectOptions& options,
                                       std::ostream& out);

// ckpt-inspect of any input: a ckpt checkpoint, or anything unrecognized,
// goes to RunInspect unchanged; a foreign input to the functions above
// (--stats is InvalidArgument for it: convert first).
absl::StatusOr<int> RunInspectAnyFormat(const InspectOptions& options,
                                        std::ostream& out);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_INSPECT_FOREIGN_INSPECT_H_

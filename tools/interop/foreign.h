// The entry points through which ckpt-inspect, ckpt-validate and ckpt-diff
// accept foreign checkpoints wherever they accept a ckpt checkpoint:
// a PyTorch DCP directory (Megatron torch_dist included), a safetensors
// file, or a Hugging Face index (file or directory). The format is detected
// from the path (DetectFormat) and said in the output; a ckpt checkpoint,
// or anything unrecognized, goes to the tool's own function unchanged.
#ifndef CKPT_TOOLS_INTEROP_FOREIGN_H_
#define CKPT_TOOLS_INTEROP_FOREIGN_H_

#include <memory>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"

namespace ckpt::tools {

// tools/inspect/inspect.h, tools/validate/validate.h, tools/diff/diff.h
// (not included together: inspect.h and diff.h both define a
// CheckpointSummary).
struct InspectOptions;
struct ValidateOptions;
struct DiffOptions;

enum class InputFormat { kCkpt, kSafetensors, kDcp };

// kDcp: a directory holding ".metadata" or the rank-local "__0.metadata";
// kSafetensors: a file named *.safetensors or *.safetensors.index.json, or
// a directory holding an index or one .safetensors file and no MANIFEST or
// `latest`; kCkpt otherwise.
InputFormat DetectFormat(const std::string& path);

// ckpt-inspect: for a foreign input, its format, producer and entries
// (--entry: the entry's chunks and where they are stored); --stats is
// InvalidArgument (convert first). Exit 0, or the error of opening it.
absl::StatusOr<int> RunInspectAnyFormat(const InspectOptions& options,
                                        std::ostream& out);

// ckpt-validate: for a foreign input, every structural check of OpenDcp /
// OpenSafetensors, then (DCP) every record read, parsed, CRC-32 verified
// and checked against the metadata. Problems are findings (exit 1).
absl::StatusOr<int> RunValidateAnyFormat(const ValidateOptions& options,
                                         bool json, std::ostream& out);

// ckpt-diff: a foreign side is converted (ckpt-convert --from ...) into a
// temporary checkpoint, removed afterwards, and compared as any checkpoint;
// the output names the original path and its format.
absl::StatusOr<int> RunDiffAnyFormat(const DiffOptions& options, bool json,
                                     std::ostream& out);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_INTEROP_FOREIGN_H_

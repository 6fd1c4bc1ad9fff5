// The safetensors and DCP directions of ckpt-convert (RunConvert dispatches
// here for --to safetensors, --from safetensors and --from dcp; the
// conversions themselves are in interop/io/).
#ifndef CKPT_TOOLS_CONVERT_CONVERT_INTEROP_H_
#define CKPT_TOOLS_CONVERT_CONVERT_INTEROP_H_

#include <ostream>

#include "absl/status/statusor.h"
#include "ckpt/format/format_constants.h"
#include "convert/convert.h"

namespace ckpt::tools {

// Checks the options of the safetensors and dcp modes (InvalidArgument for
// a flag of another mode, naming the flag and its mode).
absl::Status CheckInteropOptions(const ConvertOptions& options);

// The option checks every mode shares (InvalidArgument):
// "FLAG applies to MODE only";
absl::Status OnlyFor(const char* flag, const char* mode);
// an unknown --codec (imports);
absl::Status CheckCodec(const ConvertOptions& options);
// --threads below 0.
absl::Status CheckThreads(const ConvertOptions& options);

// Sets what every import (HDF5, safetensors, DCP) takes from the command
// line: --step, --force, --codec and --threads; and the storage.
template <typename ImportOptions>
void SetCommonImportOptions(const ConvertOptions& o, ImportOptions* io) {
  io->step = o.step;
  io->overwrite = o.force;
  io->codec = o.codec == "zstd" ? format::Codec::kZstd : format::Codec::kNone;
  if (o.threads > 0) io->io_threads = o.threads;
  io->storage = o.storage;
}

// The conversions and their human or JSON reports.
absl::StatusOr<int> RunSafetensorsExport(const ConvertOptions& options,
                                         std::ostream& out);
absl::StatusOr<int> RunSafetensorsImport(const ConvertOptions& options,
                                         std::ostream& out);
absl::StatusOr<int> RunDcpImport(const ConvertOptions& options,
                                 std::ostream& out);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_CONVERT_CONVERT_INTEROP_H_

// ckpt-convert: converts between ckpt checkpoints and other formats.
//
//   ckpt-convert SRC OUT.h5 --to hdf5     checkpoint -> one HDF5 file
//   ckpt-convert IN.h5 DST --from hdf5    HDF5 file -> one-rank checkpoint
//   ckpt-convert SRC OUT --to safetensors [--max-shard-size 5GB]
//   ckpt-convert IN DST --from safetensors [--ranks N]
//   ckpt-convert DIR DST --from dcp        PyTorch DCP / Megatron torch_dist
//
// HDF5: ckpt/interop/hdf5/hdf5_export.h, hdf5_import.h; safetensors and DCP:
// convert_interop.h and interop/io/ (the mappings are documented in
// tools/README.md (ckpt-convert)). RunConvert holds the
// logic of main(): it checks the option combination, runs the conversion
// and prints the human or JSON report.
#ifndef CKPT_TOOLS_CONVERT_CONVERT_H_
#define CKPT_TOOLS_CONVERT_CONVERT_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/storage.h"

namespace ckpt::tools {

struct ConvertOptions {
  std::string source;       // checkpoint (export) or HDF5 file (import)
  std::string destination;  // HDF5 file (export) or checkpoint root (import)
  std::string to;           // "hdf5": export; empty if not given
  std::string from;         // "hdf5": import; empty if not given
  bool force = false;  // replace the output file / the checkpoint of that step
  bool json = false;
  bool verbose = false;  // list every entry
  int threads = 0;       // checkpoint I/O and compression threads; 0 = default
  // Where the checkpoint side (SRC of an export, DST of an import) is read
  // or written: not owned; null = POSIX. The other side is always local.
  Storage* storage = nullptr;
  // Export only (empty / -1: not given).
  std::string compression;  // "none" | "deflate" (default)
  int level = -1;           // deflate level 0..9 (default 4)
  // Import only.
  std::optional<uint64_t> step;  // default: the file's ckpt_step, else 0
  bool skip_unsupported = false;
  std::string codec;  // checkpoint codec "none" (default) | "zstd"
  // safetensors and dcp (convert_interop.h).
  std::string max_shard_size;  // --to safetensors: "5GB" etc.; "" = one file
  std::vector<std::string> include;  // --to safetensors: entry globs
  std::vector<std::string> exclude;
  int ranks = 0;  // --from safetensors: 0 = not given (1 rank)
};

// Runs the conversion and writes its report to `out`. Returns kExitOk, or
// an error (main prints it and exits 2): InvalidArgument for a bad option
// combination ("--step applies to --from hdf5 only"), an unknown format
// ("unknown format 'x' for --to; supported: hdf5"), and the errors of
// ExportHdf5 / ImportHdf5.
absl::StatusOr<int> RunConvert(const ConvertOptions& options,
                               std::ostream& out);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_CONVERT_CONVERT_H_

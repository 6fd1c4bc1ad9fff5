// ckpt-convert SRC OUT --to safetensors: writes a committed checkpoint as one
// safetensors file, or (max_shard_bytes > 0) as a directory of Hugging Face
// shards "model-0000i-of-0000N.safetensors" plus
// "model.safetensors.index.json" (tools/README.md (ckpt-convert)).
//
// Every selected entry becomes one tensor at its global shape, whatever the
// checkpoint's sharding; objects become 1-d U8 tensors listed in
// "__metadata__" (safetensors_meta.h), so an import gives back the same
// checkpoint. Shards are planned as transformers' save_pretrained plans
// them (huggingface_hub 2.4's split_state_dict_into_shards_factory), in
// entry order: an entry starts a new shard when it would take the current
// one past the limit; an entry larger than the limit gets a shard of its
// own where it is reached, and the entries after it go on filling the
// current shard.
//
// Memory stays bounded: the data section is loaded with ckpt::Reader in
// windows of consecutive tensor bytes (whole tensors or flat pieces of
// them) of at most min(`slab_bytes`, 4 MiB), each ending at a boundary of
// the stored blocks where the chunks allow it (a chunk that is one run of
// the tensor's flattening, as a Shard(0) piece is), so that each block is
// read and verified once; three buffers of a window
// reused from first to last, while a second thread appends the windows
// loaded before to the file; objects are read whole, one at a time.
// Files are written under temporary names (a sharded export into a
// temporary directory) and renamed into place when complete; on error
// nothing is left at `output`. With `overwrite`, an existing shard
// directory is replaced whole, so it must hold only the files a sharded
// export writes (shards and index): a directory with any other file is
// refused, naming the file, and left as it is.
#ifndef CKPT_INTEROP_IO_SAFETENSORS_EXPORT_H_
#define CKPT_INTEROP_IO_SAFETENSORS_EXPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/format/records.h"
#include "ckpt/storage.h"
#include "ckpt/types.h"

namespace ckpt::interop {

struct SafetensorsExportOptions {
  uint64_t max_shard_bytes = 0;      // 0: one file
  std::vector<std::string> include;  // fnmatch globs; empty = every entry
  std::vector<std::string> exclude;  // fnmatch globs
  bool overwrite = false;
  uint64_t slab_bytes = 64ull << 20;  // most bytes of a window (above)
  int io_threads = 4;
  // Where the checkpoint is read from (not owned; null = POSIX); the
  // safetensors output is always local.
  Storage* storage = nullptr;
  std::function<void(uint64_t bytes, uint64_t total)> progress;
};

struct SafetensorsExportedEntry {
  std::string name;
  format::EntryKind kind = format::EntryKind::kTensor;
  DType dtype = DType::kUInt8;  // objects: uint8
  Shape shape;                  // objects: {byte length}
  std::string file;             // the file name it is in
  uint64_t bytes = 0;
};

struct SafetensorsExportResult {
  std::string checkpoint_dir;
  std::string output;
  format::CheckpointInfo info;
  size_t metadata_count = 0;                      // user metadata keys
  std::vector<SafetensorsExportedEntry> entries;  // in checkpoint order
  size_t excluded = 0;  // entries left out by the globs
  std::vector<std::pair<std::string, uint64_t>> files;  // name, size
  uint64_t total_size = 0;  // tensor bytes (the index's total_size)
};

// Exports `source` (a checkpoint directory or a root) to `output`.
// Errors: those of ckpt::Reader; AlreadyExists if `output` exists and
// !overwrite; FailedPrecondition for a partial entry, an output that is
// a directory (single file) / a file (shards), or (overwrite) a shard
// directory holding a file other than shards and the index; InvalidArgument if
// the globs select nothing or a name or metadata string cannot be JSON (objects
// aside, names must be UTF-8).
absl::StatusOr<SafetensorsExportResult> ExportSafetensors(
    const std::string& source, const std::string& output,
    const SafetensorsExportOptions& options);

// True iff `name` is selected by `include` (empty: everything) and not by
// `exclude` (fnmatch globs, '*' matching '.' too).
bool SelectedByGlobs(const std::string& name,
                     const std::vector<std::string>& include,
                     const std::vector<std::string>& exclude);

}  // namespace ckpt::interop

#endif  // CKPT_INTEROP_IO_SAFETENSORS_EXPORT_H_

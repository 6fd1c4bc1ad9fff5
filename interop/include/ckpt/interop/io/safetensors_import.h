// ckpt-convert IN DST --from safetensors: reads a safetensors file, or a
// Hugging Face index ("model.safetensors.index.json", or a directory
// holding it) and its shards, into a checkpoint (tools/README.md
// (ckpt-convert)).
//
// Every header is validated as strictly as the reference implementation
// does (interop/safetensors.h); an index must map every tensor of its
// shards to the shard that holds it, and its file names must be plain
// names inside its directory. Tensors become whole-tensor entries; the
// ones that "__metadata__" lists in "ckpt.objects" become objects again;
// the metadata becomes user metadata (safetensors_meta.h). Data is read
// with pread in the pieces ckpt::Writer asks for (bounded memory).
#ifndef CKPT_INTEROP_IO_SAFETENSORS_IMPORT_H_
#define CKPT_INTEROP_IO_SAFETENSORS_IMPORT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/interop/io/file_io.h"
#include "ckpt/interop/io/safetensors_meta.h"
#include "ckpt/interop/safetensors.h"
#include "ckpt/writer.h"

namespace ckpt::interop {

// An opened and validated safetensors input.
struct SafetensorsInput {
  std::string path;    // as given
  bool index = false;  // an HF index and its shards
  std::string index_path;
  interop::HfIndex hf_index;
  std::vector<InputFile> files;
  std::vector<interop::SafetensorsHeader> headers;  // headers[i] of files[i]
  StringPairs metadata;  // "__metadata__" of the first file
  // Every tensor: file index and its place in that file's header, by name.
  struct Ref {
    std::string name;
    size_t file = 0;
    const interop::SafetensorsTensor* tensor = nullptr;
  };
  std::vector<Ref> tensors;  // sorted by name
};

// Opens `path`: a .safetensors file, an index file, or a directory holding
// an index (or one model.safetensors). Errors name the file: NotFound,
// DataLoss for any violation of the format (a tensor in two shards, a
// weight_map entry whose shard lacks it or names a file outside the
// directory), FailedPrecondition for a dtype ckpt has no type for.
absl::StatusOr<SafetensorsInput> OpenSafetensors(const std::string& path);

// True iff `path` looks like a safetensors input (by name or content),
// without validating it.
bool LooksLikeSafetensors(const std::string& path);

struct SafetensorsImportOptions {
  std::optional<uint64_t> step;  // default: "ckpt.step" of the metadata, else 0
  int ranks = 1;                 // > 1: resharded as ckpt-reshard --to N does
  bool overwrite = false;
  format::Codec codec = format::Codec::kNone;
  int io_threads = 4;
  Storage* storage =
      nullptr;  // of the checkpoint root; not owned; null = POSIX
  std::function<void(uint64_t bytes, uint64_t total)> progress;
};

struct SafetensorsImportedEntry {
  std::string name;
  bool object = false;
  DType dtype = DType::kUInt8;
  Shape shape;
  std::string file;
  uint64_t bytes = 0;
};

struct SafetensorsImportResult {
  std::string input;
  std::string checkpoint;  // the committed checkpoint directory
  uint64_t step = 0;
  int ranks = 1;
  size_t files = 0;
  std::vector<SafetensorsImportedEntry> entries;  // sorted by name
  size_t metadata_keys = 0;
  uint64_t logical_bytes = 0;
};

// Imports `input` into the checkpoint root `root`. Errors: those of
// OpenSafetensors; DataLoss if "ckpt.objects" names a tensor that is not
// 1-d U8; AlreadyExists if the step exists and !overwrite; the Writer's
// and (ranks > 1) ckpt-reshard's errors.
absl::StatusOr<SafetensorsImportResult> ImportSafetensors(
    const std::string& input, const std::string& root,
    const SafetensorsImportOptions& options);

}  // namespace ckpt::interop

#endif  // CKPT_INTEROP_IO_SAFETENSORS_IMPORT_H_

// ckpt-convert SRC OUT.h5 --to hdf5: writes a committed checkpoint as one
// consolidated HDF5 file (tools/README.md (ckpt-convert)).
//
// Every entry becomes one dataset at its global shape, whatever the
// checkpoint's sharding; names map to groups as hdf5_names.h says and types
// as hdf5_types.h says; objects are 1-d uint8 datasets with the attribute
// ckpt_kind = "object"; the checkpoint's info and user metadata are
// attributes of the root group. Datasets are chunked (about `chunk_bytes`
// per chunk) and deflate-compressed by default, so a stock h5py reads them.
//
// Memory stays bounded: tensors are loaded with ckpt::Reader in batches of
// slabs of at most `slab_bytes` that are whole rows of HDF5 chunks (two
// batches in flight: one loading, one being written). With compression the
// chunks of a batch are shuffled and deflated on `compress_threads` threads
// and stored with H5Dwrite_chunk (hdf5_chunks.h); without, each slab is one
// hyperslab write. Objects are read whole. Peak memory is about three
// batches: 2 x 64 MiB loaded plus the compressed chunks of one.
#ifndef CKPT_INTEROP_HDF5_HDF5_EXPORT_H_
#define CKPT_INTEROP_HDF5_HDF5_EXPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/format/records.h"
#include "ckpt/storage.h"
#include "ckpt/types.h"

namespace ckpt::interop {

enum class Hdf5Compression { kNone, kDeflate };

struct Hdf5ExportOptions {
  Hdf5Compression compression = Hdf5Compression::kDeflate;
  int level = 4;  // deflate level, 0..9
  bool shuffle =
      true;  // byte shuffle before deflate (elements wider than a byte)
  bool overwrite = false;             // replace an existing output file
  uint64_t chunk_bytes = 1ull << 20;  // target bytes per HDF5 chunk
  uint64_t slab_bytes = 64ull
                        << 20;  // most bytes loaded at once (>= chunk_bytes)
  int io_threads = 4;           // ckpt::Reader threads
  // Where the checkpoint is read from (not owned; null = POSIX). The HDF5
  // file is always local.
  Storage* storage = nullptr;
  // Threads that shuffle and deflate chunks (HDF5 itself would use one);
  // 0 = one per hardware thread.
  int compress_threads = 0;
  // Called (from the calling thread) after each slab or object is written,
  // with its bytes and the total bytes of the export.
  std::function<void(uint64_t bytes, uint64_t total)> progress;
};

struct Hdf5ExportedEntry {
  std::string name;
  format::EntryKind kind = format::EntryKind::kTensor;
  DType dtype = DType::kFloat32;
  Shape shape;       // objects: {byte length}
  std::string path;  // HDF5 dataset path
  Dims chunk;  // HDF5 chunk shape; empty = contiguous (scalars, empty data, no
               // compression)
  uint64_t bytes = 0;
};

struct Hdf5ExportResult {
  std::string checkpoint_dir;  // the checkpoint read (after following `latest`)
  std::string output;
  format::CheckpointInfo info;
  uint16_t minor_version = 0;
  size_t metadata_count = 0;
  std::vector<Hdf5ExportedEntry> entries;  // in manifest order
  uint64_t logical_bytes = 0;              // tensor and object bytes
  uint64_t file_bytes = 0;                 // size of the HDF5 file
};

// Exports the checkpoint at `source` (a checkpoint directory or a root whose
// `latest` is followed) to the HDF5 file `output`. The file is written under
// a temporary name in the same directory and renamed into place when
// complete; on any error nothing is left at `output`.
// Errors: those of ckpt::Reader::Open/Load (NotFound, DataLoss, ...);
// AlreadyExists if `output` exists and !overwrite; FailedPrecondition for a
// partial entry (its chunks do not cover the tensor, so there is no full
// dataset to write); InvalidArgument for bad options; HDF5 failures
// (Internal) naming the file and dataset.
absl::StatusOr<Hdf5ExportResult> ExportHdf5(const std::string& source,
                                            const std::string& output,
                                            const Hdf5ExportOptions& options);

// The HDF5 chunk shape for a dataset of `shape`: the trailing dims whole and
// one dim cut so that a chunk holds at most max(1 element, target_bytes).
// Empty (contiguous layout) for a scalar or a shape with no elements.
Dims ChunkShape(const Shape& shape, int elem_size, uint64_t target_bytes);

// The slab shape used to stream a dataset of `shape` chunked as `chunk`
// (ChunkShape): whole chunks only (the dataset's edge aside), at most
// max(one chunk, max_bytes) bytes: dims after some dim k whole, dim k a
// multiple of its chunk dim, dims before k one. REQUIRES: shape has
// elements; `chunk` empty or of the same rank.
Dims SlabShape(const Shape& shape, const Dims& chunk, int elem_size,
               uint64_t max_bytes);

}  // namespace ckpt::interop

#endif  // CKPT_INTEROP_HDF5_HDF5_EXPORT_H_

// Planning the import of an HDF5 file (ckpt-convert --from hdf5) and
// reading its data: everything of the import that touches HDF5 metadata,
// without libckpt, so that a fuzz target can run it on file images
// (hdf5_plan_fuzz.cc).
//
// The file is distrusted: PlanImport checks every name, type, shape and
// attribute against the format's limits before any data is read, refuses
// raw data in external files and virtual datasets (they would read other
// files), and never follows soft or external links; HDF5 filter plugins
// are never loaded (hdf5::Hdf5Lock).
#ifndef CKPT_INTEROP_HDF5_HDF5_PLAN_H_
#define CKPT_INTEROP_HDF5_HDF5_PLAN_H_

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/records.h"
#include "ckpt/interop/hdf5/hdf5_types.h"
#include "ckpt/interop/hdf5/hdf5_util.h"
#include "ckpt/types.h"

namespace ckpt::interop {

// Limits of the import beyond those of the format (spec/FORMAT.md §10).
inline constexpr uint64_t kMaxImportObjectBytes =
    1ull << 30;  // objects are held in memory
inline constexpr uint64_t kMaxImportChunkBytes =
    256ull << 20;  // one HDF5 chunk, decompressed
inline constexpr uint64_t kMaxRootAttributes = format::kMaxMetadataEntries + 64;
inline constexpr uint64_t kMaxVisitedObjects = format::kMaxEntries * 2;

struct ImportPlanEntry {
  std::string path;  // HDF5 dataset path, "/a/b"
  std::string name;  // entry name
  format::EntryKind kind = format::EntryKind::kTensor;
  DType dtype = DType::kFloat32;  // objects: uint8
  Shape shape;                    // objects: {byte length}
  hdf5::MemKind mem = hdf5::MemKind::kU8;
  uint64_t bytes = 0;
};

struct ImportSkipped {
  std::string what;    // "/a/b" (a dataset) or "/@attr" (a root attribute)
  std::string reason;  // the error that --skip-unsupported turned into a skip
};

struct ImportPlan {
  std::vector<ImportPlanEntry> entries;  // by path
  format::Metadata metadata;  // in attribute creation order when tracked
  // Root attributes written by ckpt-convert --to hdf5, when present.
  std::optional<uint64_t> step;
  std::optional<uint64_t> world_size;
  std::optional<std::string> checkpoint_id;
  std::optional<std::string> format_version;
  std::vector<ImportSkipped> skipped;
  uint64_t logical_bytes = 0;
};

struct PlanOptions {
  // Datasets and root attributes that cannot be imported (unsupported type
  // or shape, a name that is no valid entry name, two datasets with one
  // entry name, a bad ckpt_* attribute) are listed in ImportPlan::skipped
  // instead of failing the plan. I/O errors and limits still fail it.
  bool skip_unsupported = false;
};

// Plans the import of the open HDF5 file `file` without reading any
// dataset's data. Errors: InvalidArgument naming the dataset path (or root
// attribute) and the problem, e.g. "dataset '/x': unsupported HDF5 type
// compound (2 members)"; FailedPrecondition for a ckpt_format_version with
// another major version; DataLoss when HDF5 cannot read the file's
// metadata. Safe on any file (a fuzz target calls it on file images).
// REQUIRES: the lock of hdf5::Hdf5Lock() is held.
absl::StatusOr<ImportPlan> PlanImport(hid_t file,
                                      const PlanOptions& options = {});

// Opens the HDF5 file `path` read-only. NotFound if it does not exist;
// InvalidArgument if it is not an HDF5 file. REQUIRES: lock held.
absl::StatusOr<hdf5::Handle> OpenHdf5File(const std::string& path);
// Opens an in-memory HDF5 file image (copied) read-only, e.g. fuzzer input.
// InvalidArgument if it is not an HDF5 file. REQUIRES: lock held.
absl::StatusOr<hdf5::Handle> OpenHdf5Image(absl::string_view bytes);

// Reads elements [start, start + count) of the row-major flattening of the
// tensor dataset of `entry` into `dst` (count * DTypeSize(entry.dtype)
// bytes). DataLoss for HDF5 read errors and for a bool that is not 0 or 1.
// REQUIRES: lock held; the range lies inside the dataset.
absl::Status ReadElements(hid_t file, const ImportPlanEntry& entry,
                          uint64_t start, uint64_t count, void* dst);
// Reads the bytes of the object dataset of `entry`. REQUIRES: lock held.
absl::StatusOr<std::string> ReadObjectBytes(hid_t file,
                                            const ImportPlanEntry& entry);

// The boxes, in row-major order, whose union is elements [start, start +
// count) of the row-major flattening of `shape` (at most 2 * ndim - 1).
// REQUIRES: the range lies inside the tensor; ndim >= 1.
std::vector<Box> FlatRangeBoxes(const Shape& shape, uint64_t start,
                                uint64_t count);

}  // namespace ckpt::interop

#endif  // CKPT_INTEROP_HDF5_HDF5_PLAN_H_

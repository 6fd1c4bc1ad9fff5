// How ckpt entry names map to HDF5 dataset paths and back, and the names of
// the root attributes (tools/README.md (ckpt-convert), "Names", "Root
// attributes"). Pure string logic: no HDF5 calls.
//
// Export: an entry name is split at '.' and each part becomes one link name,
// so "layers.0.attn.w" is the dataset /layers/0/attn/w inside groups
// /layers, /layers/0 and /layers/0/attn. Two reserved link names, which an
// entry name can never produce because they contain a '.', keep the mapping
// one-to-one:
//   - ".self": an entry that is also the group of other entries ("w" next to
//     "w.exp_avg", as optimizer state is named) is stored as /w/.self, with
//     /w/exp_avg beside it;
//   - ".empty": the empty part of a name that begins or ends with '.'
//     (".a" is /.empty/a, "a." is /a/.empty).
//
// Import: a dataset path maps back by the inverse rule: link names joined
// with '.', a final ".self" dropped, ".empty" read as an empty part. Link
// names that contain '.' (as plain h5py files may have) are kept as they
// are, so "/model/emb.weight" becomes "model.emb.weight". The result must be
// a valid entry name (format/names.h).
#ifndef CKPT_INTEROP_HDF5_HDF5_NAMES_H_
#define CKPT_INTEROP_HDF5_HDF5_NAMES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::interop::hdf5 {

inline constexpr char kSelfLink[] = ".self";
inline constexpr char kEmptyLink[] = ".empty";

// Root attributes of the exported file (user metadata keys are attributes
// of their own name; a key that begins with "ckpt_" gets one more "ckpt_"
// in front, so "ckpt_x" is stored as "ckpt_ckpt_x").
inline constexpr char kAttrFormatVersion[] = "ckpt_format_version";  // "1.0"
inline constexpr char kAttrStep[] = "ckpt_step";                     // uint64
inline constexpr char kAttrWorldSize[] = "ckpt_world_size";          // uint32
inline constexpr char kAttrCheckpointId[] =
    "ckpt_checkpoint_id";  // 32 hex digits
inline constexpr char kAttrCreatedUnixNs[] = "ckpt_created_unix_ns";  // int64
inline constexpr char kAttrWriter[] = "ckpt_writer";  // "ckpt 0.1.0"
inline constexpr char kReservedAttrPrefix[] = "ckpt_";

// The dataset path ("/a/b") of each of `names`, in the same order.
// InvalidArgument for an invalid entry name (format::ValidateEntryName) or a
// name given twice.
absl::StatusOr<std::vector<std::string>> DatasetPaths(
    const std::vector<std::string>& names);

// The entry name of the dataset at `path` ("/a/b" or "a/b", as H5Ovisit
// reports it). InvalidArgument naming the path when the result is not a
// valid entry name.
absl::StatusOr<std::string> EntryNameOfPath(absl::string_view path);

}  // namespace ckpt::interop::hdf5

#endif  // CKPT_INTEROP_HDF5_HDF5_NAMES_H_

// How ckpt's checkpoint info, user metadata and objects are carried in a
// safetensors "__metadata__" map (tools/README.md (ckpt-convert)):
//
//   "format": "pt"                    what transformers expects (unless the
//                                     user metadata has its own "format")
//   "ckpt.step", "ckpt.world_size", "ckpt.checkpoint_id"
//   "ckpt.objects": JSON array of the names of entries that are objects
//                   (exported as 1-d U8 tensors)
//   "ckpt.user_metadata": JSON array of [hex key, hex value] pairs: the user
//                   metadata exactly, in order, binary values included
//   every user key that is UTF-8 (with a UTF-8 value), not "format" and not
//   beginning with "ckpt.", also as itself, for readers other than ckpt.
#ifndef CKPT_INTEROP_IO_SAFETENSORS_META_H_
#define CKPT_INTEROP_IO_SAFETENSORS_META_H_

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/format/records.h"

namespace ckpt::interop {

using StringPairs = std::vector<std::pair<std::string, std::string>>;

// The "__metadata__" map of an export.
StringPairs ExportMetadata(const format::CheckpointInfo& info,
                           const format::Metadata& user,
                           const std::vector<std::string>& object_names);

// What an import takes from a "__metadata__" map.
struct ImportedMetadata {
  std::optional<uint64_t> step;
  std::set<std::string> objects;
  // "ckpt.user_metadata" decoded when present; otherwise every key that
  // does not begin with "ckpt.", in key order.
  format::Metadata user;
};

// DataLoss naming the key if a ckpt.* value is malformed.
absl::StatusOr<ImportedMetadata> ImportMetadata(const StringPairs& metadata);

}  // namespace ckpt::interop

#endif  // CKPT_INTEROP_IO_SAFETENSORS_META_H_

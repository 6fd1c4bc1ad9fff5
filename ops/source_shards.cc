#include "ckpt/ops/source_shards.h"

#include "ckpt/format/status_macros.h"
#include "read/index_check.h"
#include "read/shard_file.h"

namespace ckpt::ops {

absl::Status CheckSourceShards(Storage* storage, const std::string& dir,
                               const format::Manifest& manifest) {
  const ::ckpt::internal::ManifestIndex index(manifest);
  for (const format::ShardInfo& info : manifest.shards) {
    const std::string path = JoinPath(dir, info.file_name);
    auto file =
        ::ckpt::internal::OpenShardFile(storage, path, info, manifest.info.id);
    if (!file.ok()) return Annotate(file.status(), path);
    CKPT_RETURN_IF_ERROR(::ckpt::internal::CheckShardIndex(index, info.shard_id,
                                                           path, file->index)
                             .status());
  }
  return absl::OkStatus();
}

}  // namespace ckpt::ops

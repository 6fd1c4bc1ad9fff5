// Internal: writes one shard file (spec/FORMAT.md §5) with several threads,
// computing block checksums as the data is written.
#ifndef CKPT_LIBCKPT_SAVE_SHARD_WRITER_H_
#define CKPT_LIBCKPT_SAVE_SHARD_WRITER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/format/records.h"
#include "ckpt/storage.h"
#include "ckpt/types.h"
#include "ckpt/writer.h"
#include "save/save_messages.h"
#include "save/save_plan.h"
#include "staging/save_stager.h"

namespace ckpt::internal {

struct WriteItem {
  const LocalItem* item;  // geometry
  const void* data;       // region-sized bytes
  MemoryKind memory = MemoryKind::kHost;
  int device = 0;
  const TensorSource* source =
      nullptr;  // if set, bytes come from here, not `data`
  // If set, the bytes were staged by a SaveStager (staging/save_stager.h) and
  // come from here, not from `data` or `source`.
  StagedBytes* staged = nullptr;
};

// The shard writer asks for an item's bytes in ranges that never cross a
// multiple of this (a multiple of options.block_size): the segment size a
// SaveStager must use for items written with `options`.
uint64_t StagingSegmentBytes(const SaveOptions& options);

struct ShardWriteResult {
  format::ShardIndex index;  // with block tables
  uint64_t file_size = 0;
  uint64_t stored_bytes = 0;
};

// Creates `path` (must not exist) and writes, in this order: the header;
// the payloads (options.io_threads threads, checksumming each block as it
// is written; device memory staged through `device_memory`, sources read
// through their TensorSource); the index and tail; then fsyncs and closes
// the file. The directory entry is not fsynced: the caller's commit does
// that for the whole directory. The bytes behind `items` must stay
// unmodified until it returns. On error the partial file is left for the
// caller to remove with its directory.
absl::StatusOr<ShardWriteResult> WriteShardFile(
    Storage* storage, const std::string& path,
    const format::ShardHeader& header, const format::CheckpointInfo& info,
    const format::Metadata& metadata, const std::vector<WriteItem>& items,
    const SaveOptions& options, DeviceMemory* device_memory);

// WriteShardFile of rank `rank`'s shard of the save whose CHECKPOINT_INFO
// is `info`: tmp_dir/shard-<rank>.ckpt.
absl::StatusOr<ShardWriteResult> WriteRankShard(
    Storage* storage, const std::string& tmp_dir, uint32_t rank,
    const format::CheckpointInfo& info, const std::vector<WriteItem>& items,
    const SaveOptions& options, DeviceMemory* device_memory);

// What a rank reports to the coordinator of the shard it wrote: the file's
// size and the manifest view of its entries (no block tables).
ShardReport ReportOf(ShardWriteResult written);

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_SAVE_SHARD_WRITER_H_

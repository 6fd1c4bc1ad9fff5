// read/: reading verified blocks out of shard files, shared by the loads of
// load/ and by the tools. This header: opening a shard file and checking it
// against the manifest's record of it (spec/FORMAT.md §5.6 steps 1-4), and
// reading and verifying blocks (§5.3). The Reader stops at the first
// problem; ckpt-validate collects them all. Both call these functions, so
// every check and every message exists once. The checks of a shard's index
// against the manifest are index_check.h's.
//
// Messages of the functions here name no file: the caller knows the path
// and adds it (the Reader with Annotate, ckpt-validate in Finding::file).
// Errors of the storage are passed on as they are.
#ifndef CKPT_LIBCKPT_READ_SHARD_FILE_H_
#define CKPT_LIBCKPT_READ_SHARD_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/format/block_codec.h"
#include "ckpt/format/records.h"
#include "ckpt/storage.h"

namespace ckpt::internal {

// "FILE: block 3 of chunk 1 [4:8, 0:8] of 'w'", most specific first; the
// parts that are empty or negative are left out ("FILE: entry 'w'"). The
// entry name is shown through format::EscapeText.
std::string LocationText(absl::string_view file, absl::string_view entry,
                         int64_t chunk, absl::string_view region,
                         int64_t block);

// The bytes of a shard file that OpenShardFile reads to decode it (its
// size, header, tail and index), so that a rank that read them can share
// them with the ranks of a cooperative load instead of each reading them.
struct ShardMetaBytes {
  uint64_t file_size = 0;
  std::string head, tail, index;
};

// A shard file whose header, tail and index decoded and whose ids and size
// match the manifest (§5.6 steps 1-4 and the first two checks of step 5).
struct ShardFile {
  std::unique_ptr<File> file;  // null when made by DecodeShardMeta
  format::ShardHeader header;
  format::ShardIndex index;
  ShardMetaBytes meta;  // what was read
};

// Opens the shard file at `path` for reading, nothing more: DataLoss
// "shard file is missing (shard N in the manifest)" when absent, other
// storage errors as they are.
absl::StatusOr<std::unique_ptr<File>> OpenShardHandle(
    Storage* storage, const std::string& path, const format::ShardInfo& info,
    const OpenOptions& options = {});

// Opens the shard at `path` that the manifest's SHARDS record `info`
// describes, in a checkpoint of id `id`. Checks, in this order: presence
// (DataLoss "shard file is missing (shard N in the manifest)"), the
// header, "checkpoint id A != manifest's B: this shard belongs to another
// checkpoint", "shard id A != B in the manifest", "file is S bytes, the
// manifest says F (truncated|extended)", the tail and the index (their
// decoders' DataLoss / FailedPrecondition).
absl::StatusOr<ShardFile> OpenShardFile(Storage* storage,
                                        const std::string& path,
                                        const format::ShardInfo& info,
                                        const format::CheckpointId& id,
                                        const OpenOptions& options = {});

// The checks of OpenShardFile after its reads, on bytes another rank read
// (ShardFile::meta of its OpenShardFile): the same checks in the same
// order with the same messages, and DataLoss "index is N bytes, the tail
// says M" for bytes of inconsistent size. The result has no file.
absl::StatusOr<ShardFile> DecodeShardMeta(ShardMetaBytes meta,
                                          const format::ShardInfo& info,
                                          const format::CheckpointId& id);

// Raw (decoded) payload bytes of chunk `c` of entry `e`.
uint64_t ChunkRawBytes(const format::EntryRecord& e,
                       const format::ChunkRecord& c);

// Reads exactly `n` bytes at `offset` of `file` into `out`. DataLoss
// "reading bytes [A, B): file ends at offset C" for a short read; a storage
// error keeps its code, its message prefixed with "reading bytes [A, B)".
absl::Status ReadExactly(File& file, uint64_t offset, uint64_t n, char* out);

// Verifies block `b` of chunk `c` (an index record, with its block table)
// of entry `e` from its stored bytes `stored`, and returns its raw bytes:
// `stored` itself for codec none, else `raw_out`, decoded into. REQUIRES:
// stored.size() == c.blocks[b].stored_size; with a codec, raw_out has room
// for the block's raw size. DataLoss "checksum A != B (stored != computed)",
// the decoder's message, or CheckBoolBytes's for a bool entry.
absl::StatusOr<const char*> VerifyBlock(const format::EntryRecord& e,
                                        const format::ChunkRecord& c,
                                        uint64_t b, absl::string_view stored,
                                        format::BlockDecoder* decoder,
                                        char* raw_out);

// §9: every byte of bool elements is 0x00 or 0x01. DataLoss "bool element
// N of the chunk is 0x02, not 0x00 or 0x01 (spec/FORMAT.md §9)", N counted
// from `first_element`.
absl::Status CheckBoolBytes(absl::string_view raw, uint64_t first_element);

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_READ_SHARD_FILE_H_

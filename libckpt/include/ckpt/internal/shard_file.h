// Internal to ckpt, shared by ckpt::Reader and the tools (not part of the
// installed API): opening a shard file and checking it against the
// manifest (spec/FORMAT.md §5.6, §8.6), and reading and verifying blocks
// (§5.3). The Reader stops at the first problem; ckpt-validate collects
// them all. Both call these functions, so every check and every message
// exists once.
//
// Messages of the functions here name no file: the caller knows the path
// and adds it (the Reader with Annotate, ckpt-validate in Finding::file).
// Errors of the storage are passed on as they are.
#ifndef CKPT_INTERNAL_SHARD_FILE_H_
#define CKPT_INTERNAL_SHARD_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
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

// A manifest chunk and, once matched, its shard-index record.
struct ChunkRef {
  uint32_t entry = 0;  // index in Manifest::entries
  uint32_t chunk = 0;  // index in that entry's chunks
  // The record in the shard's index, with the block table; null until
  // matched. Points into a ShardIndex, which must outlive it.
  const format::ChunkRecord* indexed = nullptr;
};

// Lookups over a manifest, built once in O(entries + chunks). The manifest
// must outlive it. Thread-compatible (const methods are thread-safe).
class ManifestIndex {
 public:
  explicit ManifestIndex(const format::Manifest& manifest);
  const format::Manifest& manifest() const { return *manifest_; }
  // Index of entry `name` in manifest().entries, or -1.
  int64_t Find(absl::string_view name) const;
  // The chunks stored in shard `shard`, grouped by entry, in manifest
  // order; empty for a shard id without chunks.
  const std::vector<ChunkRef>& ChunksOf(uint32_t shard) const;

 private:
  const format::Manifest* manifest_;
  absl::flat_hash_map<absl::string_view, uint32_t> by_name_;
  std::vector<std::vector<ChunkRef>> by_shard_;
};

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

// §5.6 step 5: the index's CHECKPOINT_INFO equals the manifest's. DataLoss
// "CHECKPOINT_INFO differs from the manifest's: step 5 != 7, ... (index !=
// manifest)".
absl::Status CheckIndexInfo(const format::ShardIndex& index,
                            const format::Manifest& manifest);

// §5.6 step 5: a METADATA section present in the index (even with no
// pairs) equals the manifest's. DataLoss "METADATA differs from the
// manifest's (N pairs in the index, M in the manifest)".
absl::Status CheckIndexMetadata(const format::ShardIndex& index,
                                const format::Manifest& manifest);

// One disagreement between a shard index and the manifest.
struct IndexProblem {
  std::string entry;   // entry name
  int64_t chunk = -1;  // manifest chunk index, or -1
  std::string message;
};

// §8.6: matches the chunks of `index` with the manifest chunks of shard
// `shard` (index.ChunksOf(shard)), by (data_offset, region) with
// data_offset ignored when stored_length is 0; the other fields
// (stored_length, codec, block_size) must then be equal. Returns the
// matched chunks (ChunkRef::indexed set), sorted by data_offset, and
// appends to `problems` one item per index entry unknown to the manifest
// or described differently, per manifest chunk missing from the index or
// described differently, and per index chunk the manifest does not list:
// at most 100 of them, the rest counted in one last item (entry "", chunk
// -1), so that the list never grows with what a hostile file declares.
// FindPayloadOverlaps lists as many. `shard_index` must outlive the result.
std::vector<ChunkRef> MatchIndexChunks(const ManifestIndex& manifest,
                                       uint32_t shard,
                                       const format::ShardIndex& shard_index,
                                       std::vector<IndexProblem>* problems);

// §5.6 step 5 and §8.6 on the index of the shard file at `path`: its
// CHECKPOINT_INFO and METADATA (CheckIndexInfo, CheckIndexMetadata) and its
// chunks (MatchIndexChunks against index.ChunksOf(shard)), stopping at the
// first problem: DataLoss naming the file and, where one is concerned, the
// entry and chunk. Returns the matched chunks; `shard_index` must outlive
// them. What a load checks before it reads a shard, and what a tool that
// sizes work from the manifest checks first (tools/common/source_shards.h).
absl::StatusOr<std::vector<ChunkRef>> CheckShardIndex(
    const ManifestIndex& index, uint32_t shard, const std::string& path,
    const format::ShardIndex& shard_index);

// §5.2: appends a problem for each chunk of `matched` (sorted by
// data_offset, as MatchIndexChunks returns them) whose payload overlaps an
// earlier one.
void FindPayloadOverlaps(const format::Manifest& manifest,
                         const std::vector<ChunkRef>& matched,
                         std::vector<IndexProblem>* problems);

// §5.7: an entry with no chunk in any shard MUST be listed, with zero
// chunks, by some shard index. Returns the manifest entries that break
// this rule, given the indexes of all shards (sorted by entry index).
std::vector<uint32_t> UnindexedChunklessEntries(
    const format::Manifest& manifest,
    const std::vector<const format::ShardIndex*>& indexes);
// The problem of such an entry: DataLoss "has no chunk in any shard, and no
// shard index lists it with zero chunks (spec/FORMAT.md §5.7)"; the
// caller names the entry.
absl::Status ChunklessEntryNotIndexed();

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

#endif  // CKPT_INTERNAL_SHARD_FILE_H_

// The checks of a shard's index against the manifest (spec/FORMAT.md §5.6
// step 5, §8.6, §5.2, §5.7), shared by the Reader, which stops at the first
// problem, and ckpt-validate, which collects them all.
//
// Messages name no file unless they say so: the caller knows the path and
// adds it.
#ifndef CKPT_LIBCKPT_READ_INDEX_CHECK_H_
#define CKPT_LIBCKPT_READ_INDEX_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/format/records.h"

namespace ckpt::internal {

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

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_READ_INDEX_CHECK_H_

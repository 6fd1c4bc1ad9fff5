// Internal to ckpt (not part of the installed API): which blocks of which
// shards a set of requested regions needs, and where each byte goes. Pure
// functions of the manifest, the shard indexes' block tables and the
// requests: no I/O, no threads, deterministic, so that they can be tested
// on their own and reused where a different party does the reading (a
// cooperative multi-rank load in which one rank reads each block and sends
// the bytes to the ranks whose requests need them: the plan names, for
// every read, every destination by request index).
//
// Two stages, so that a load fails on a bad request before any I/O:
//  1. PairRequests (manifest only): every request with the stored chunks
//     it intersects, as byte copies; checks that each request is covered.
//  2. PlanBlockReads (with the block tables of the chunks concerned): per
//     shard, the block ranges to read, merged across requests and cut into
//     reads of bounded size, each with the copies it feeds.
#ifndef CKPT_LIBCKPT_READ_READ_PLAN_H_
#define CKPT_LIBCKPT_READ_READ_PLAN_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "ckpt/format/records.h"

namespace ckpt::internal {

// Region `region` of manifest entry `entry`; its destination is
// RegionElements(region) elements of the entry's dtype, row-major in the
// region's own layout. The dtype is the entry's: a load converts nothing,
// and the caller rejects a request of another dtype before planning
// (Reader: CheckRequest). REQUIRES: region valid for the entry's shape.
struct PlanRequest {
  uint32_t entry = 0;
  Region region;
};

// Bytes [src, src + bytes) of a chunk's raw (decoded) payload go to bytes
// [dst, dst + bytes) of the destination of request `request`.
struct Copy {
  uint32_t request = 0;
  uint64_t src = 0, dst = 0, bytes = 0;
  friend bool operator==(const Copy& a, const Copy& b) {
    return a.request == b.request && a.src == b.src && a.dst == b.dst &&
           a.bytes == b.bytes;
  }
};

// The copies of a piece or a read: one inline, as almost every small
// entry has (a load of 2^20 scalar entries holds 2^20 pieces and reads at
// once, so a heap block each would cost 48 bytes more per request).
using Copies = absl::InlinedVector<Copy, 1>;

// The copies from one stored chunk (chunk `chunk` of manifest entry
// `entry`) to one request, sorted by src. Never empty.
struct ChunkPiece {
  uint32_t request = 0;
  uint32_t entry = 0;
  uint32_t chunk = 0;
  Copies copies;
};

// Stage 1: pairs every request with the chunks of its entry that it
// intersects. DataLoss "entry 'NAME': requested region R is not covered by
// the checkpoint: N of M elements missing" for the first request that the
// chunks do not cover (a partial entry, or a region outside its chunks).
// Pieces come out by request, then by chunk order.
absl::StatusOr<std::vector<ChunkPiece>> PairRequests(
    const format::Manifest& manifest, const std::vector<PlanRequest>& requests);

// The shard ids that `pieces` read from, sorted, unique.
std::vector<uint32_t> ShardsOf(const format::Manifest& manifest,
                               const std::vector<ChunkPiece>& pieces);

// One read: blocks [b0, b1) of one stored chunk, which are stored bytes
// [offset, offset + length) of its shard file and raw bytes
// [raw_begin, raw_end) of the chunk, and the copies out of those raw bytes
// (clipped to them, sorted by src then request).
struct BlockRead {
  uint32_t entry = 0;                            // manifest entry
  uint32_t chunk = 0;                            // manifest chunk
  const format::ChunkRecord* indexed = nullptr;  // with the block table
  uint64_t b0 = 0, b1 = 0;
  uint64_t offset = 0, length = 0;
  uint64_t raw_begin = 0, raw_end = 0;
  Copies copies;
};

// The reads of one shard file, in file order.
struct ShardReads {
  uint32_t shard = 0;
  std::vector<BlockRead> reads;
};

struct ReadPlan {
  std::vector<ShardReads> shards;  // by shard id
  uint64_t stored_bytes = 0;       // sum of BlockRead::length
};

// Returns the shard-index record (with its block table) of chunk `chunk`
// of manifest entry `entry`; never null for a chunk of a piece.
using BlockTableLookup =
    std::function<const format::ChunkRecord*(uint32_t entry, uint32_t chunk)>;

// Stage 2: for every stored chunk that `pieces` touch, the blocks any of
// its pieces needs (each block read once however many requests it feeds),
// merged into contiguous spans and cut into reads of at most
// max(1, max_read_bytes / block_size) blocks. REQUIRES: pieces from
// PairRequests for this manifest; lookup returns records whose block
// tables match them (as MatchIndexChunks guarantees).
ReadPlan PlanBlockReads(const format::Manifest& manifest,
                        const std::vector<ChunkPiece>& pieces,
                        const BlockTableLookup& lookup,
                        uint64_t max_read_bytes);

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_READ_READ_PLAN_H_

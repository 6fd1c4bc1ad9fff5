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

#include <algorithm>
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

// Bytes of a chunk's raw (decoded) payload that go to the destination of
// request `request`: `rows` runs of `run` bytes, run k from raw byte
// src + k * src_pitch to destination byte dst + k * dst_pitch. A contiguous
// piece is one run; a column band of a row-major chunk is one copy of a run
// per row (PairRequests joins runs of equal length at constant pitches), so
// that a load by columns plans a copy per chunk and request, not one per
// row. Runs never overlap: with rows > 1, both pitches are at least `run`;
// with one row, both are 0.
struct Copy {
  uint32_t request = 0;
  uint32_t rows = 1;
  uint64_t src = 0, dst = 0, run = 0;
  uint64_t src_pitch = 0, dst_pitch = 0;

  Copy() = default;
  // One run of `bytes` bytes.
  Copy(uint32_t request, uint64_t src, uint64_t dst, uint64_t bytes)
      : request(request), src(src), dst(dst), run(bytes) {}
  // `rows` runs (pitches ignored for one).
  static Copy Rows(uint32_t request, uint64_t src, uint64_t dst, uint64_t run,
                   uint32_t rows, uint64_t src_pitch, uint64_t dst_pitch) {
    Copy c(request, src, dst, run);
    c.rows = rows;
    if (rows > 1) {
      c.src_pitch = src_pitch;
      c.dst_pitch = dst_pitch;
    }
    return c;
  }
  uint64_t bytes() const { return uint64_t{rows} * run; }  // of every run
  uint64_t src_end() const { return src + (rows - 1) * src_pitch + run; }
  uint64_t dst_end() const { return dst + (rows - 1) * dst_pitch + run; }
  friend bool operator==(const Copy& a, const Copy& b) {
    return a.request == b.request && a.rows == b.rows && a.src == b.src &&
           a.dst == b.dst && a.run == b.run && a.src_pitch == b.src_pitch &&
           a.dst_pitch == b.dst_pitch;
  }
};

// Calls fn(src, dst, n) for each part of `c`'s runs that lies in raw bytes
// [lo, hi), in order: n bytes from raw byte src to destination byte dst.
template <typename Fn>
void ForEachRunIn(const Copy& c, uint64_t lo, uint64_t hi, Fn&& fn) {
  // Run k0 is the first that may end after lo (runs before it end at or
  // before the start of the next, at or before lo).
  uint64_t k = c.rows > 1 && lo > c.src ? (lo - c.src) / c.src_pitch : 0;
  for (; k < c.rows; ++k) {
    const uint64_t s = c.src + k * c.src_pitch;
    if (s >= hi) break;
    const uint64_t a = std::max(lo, s), z = std::min(hi, s + c.run);
    if (a < z) fn(a, c.dst + k * c.dst_pitch + (a - s), z - a);
  }
}

// Calls emit(copy) for the copies that take the bytes of `c` in raw bytes
// [lo, hi): at most three (a run cut at lo, the whole runs between as one
// copy, a run cut at hi), in source order; O(1) however many runs.
template <typename Emit>
void ClipCopy(const Copy& c, uint64_t lo, uint64_t hi, Emit&& emit) {
  if (c.rows == 1) {
    const uint64_t a = std::max(lo, c.src), z = std::min(hi, c.src + c.run);
    if (a < z) emit(Copy(c.request, a, c.dst + (a - c.src), z - a));
    return;
  }
  const uint64_t p = c.src_pitch;
  auto start = [&](uint64_t k) { return c.src + k * p; };
  // Runs [k0, k1) are those that overlap [lo, hi).
  uint64_t k0 = lo > c.src ? (lo - c.src) / p : 0;
  if (k0 < c.rows && start(k0) + c.run <= lo) ++k0;
  const uint64_t k1 =
      hi > c.src ? std::min<uint64_t>(c.rows, (hi - c.src + p - 1) / p) : 0;
  if (k0 >= k1) return;
  uint64_t f = k0, l = k1;  // whole runs [f, l)
  auto part = [&](uint64_t k) {
    const uint64_t s = start(k);
    const uint64_t a = std::max(lo, s), z = std::min(hi, s + c.run);
    emit(Copy(c.request, a, c.dst + k * c.dst_pitch + (a - s), z - a));
  };
  if (start(f) < lo || start(f) + c.run > hi) part(f++);
  const bool cut_last = l > f && start(l - 1) + c.run > hi;
  if (cut_last) --l;
  if (f < l) {
    emit(Copy::Rows(c.request, start(f), c.dst + f * c.dst_pitch, c.run,
                    static_cast<uint32_t>(l - f), p, c.dst_pitch));
  }
  if (cut_last) part(l);
}

// Calls fn(first, end) for block spans [first, end) of block size `bs`
// that together are exactly the blocks `c` reads, in order: one span
// unless whole blocks lie between its runs.
template <typename Fn>
void ForEachBlockSpan(const Copy& c, uint64_t bs, Fn&& fn) {
  if (c.rows == 1 || c.src_pitch - c.run < bs) {
    fn(c.src / bs, (c.src_end() + bs - 1) / bs);
    return;
  }
  for (uint64_t k = 0; k < c.rows; ++k) {  // rows <= blocks here
    const uint64_t s = c.src + k * c.src_pitch;
    fn(s / bs, (s + c.run + bs - 1) / bs);
  }
}

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

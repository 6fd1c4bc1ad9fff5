#include "read/read_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckpt/format/names.h"

namespace ckpt::internal {

// A load holds one piece and one read per small request while it plans
// (ResourceBounds: a load's memory per request).
static_assert(sizeof(ChunkPiece) <= 72, "ChunkPiece grew");
static_assert(sizeof(BlockRead) <= 120, "BlockRead grew");

namespace {

using format::ChunkRecord;
using format::EntryRecord;

// Block span [first, second) of a chunk.
using Span = std::pair<uint64_t, uint64_t>;

// The order of a read's copies: by src, then request.
bool SrcThenRequest(const Copy& x, const Copy& y) {
  return std::tie(x.src, x.request) < std::tie(y.src, y.request);
}

// The copies of `pieces` (of one chunk), sorted by src then request. Each
// piece's copies come sorted (ForEachRun walks a region in order), so
// they are merged, not sorted: the pieces of one chunk are few (one per
// request that intersects it) and their copies may be many (a 3-d band of
// a row-major chunk is a copy per plane).
std::vector<Copy> SortedCopies(const std::vector<const ChunkPiece*>& pieces) {
  const auto less = SrcThenRequest;
  size_t total = 0;
  for (const ChunkPiece* p : pieces) total += p->copies.size();
  std::vector<Copy> all;
  all.reserve(total);
  std::vector<size_t> ends;  // of each piece's run in `all`
  bool runs_sorted = true;
  for (const ChunkPiece* p : pieces) {
    all.insert(all.end(), p->copies.begin(), p->copies.end());
    runs_sorted =
        runs_sorted && std::is_sorted(p->copies.begin(), p->copies.end(), less);
    ends.push_back(all.size());
  }
  if (!runs_sorted) {
    std::sort(all.begin(), all.end(), less);
    return all;
  }
  // Pairwise merges of neighbouring runs until one is left.
  for (size_t width = 1; width < ends.size(); width *= 2) {
    for (size_t i = 0; i + width < ends.size(); i += 2 * width) {
      const size_t begin = i == 0 ? 0 : ends[i - 1];
      const size_t mid = ends[i + width - 1];
      const size_t end = ends[std::min(i + 2 * width, ends.size()) - 1];
      std::inplace_merge(all.begin() + begin, all.begin() + mid,
                         all.begin() + end, less);
    }
  }
  return all;
}

// Joins span `s` to the last of `merged` (sorted, disjoint) where they
// overlap or touch, else appends it; false if `s` starts before that last
// span (out of order: not added).
bool MergeSpan(const Span& s, std::vector<Span>* merged) {
  if (!merged->empty() && s.first < merged->back().first) return false;
  if (!merged->empty() && s.first <= merged->back().second) {
    merged->back().second = std::max(merged->back().second, s.second);
  } else {
    merged->push_back(s);
  }
  return true;
}

// The blocks of block size `bs` that `copies` (sorted by src) read,
// merged into sorted, disjoint spans (adjacent spans are joined).
std::vector<Span> BlockSpans(const std::vector<Copy>& copies, uint64_t bs) {
  std::vector<Span> merged, late;
  for (const Copy& c : copies) {
    ForEachBlockSpan(c, bs, [&](uint64_t first, uint64_t end) {
      if (!MergeSpan(Span(first, end), &merged)) late.emplace_back(first, end);
    });
  }
  if (late.empty()) return merged;
  // The runs of a strided copy past the start of the next copy (blocks
  // between its runs that another copy reads): merged again, sorted.
  late.insert(late.end(), merged.begin(), merged.end());
  std::sort(late.begin(), late.end());
  merged.clear();
  for (const Span& s : late) MergeSpan(s, &merged);
  return merged;
}

// Cuts `spans` of chunk `c` (raw size raw_total) into reads of at most
// `per_read` blocks, with their stored and raw byte ranges.
std::vector<BlockRead> CutReads(const std::vector<Span>& spans,
                                const ChunkRecord& c, uint64_t raw_total,
                                uint64_t per_read) {
  std::vector<uint64_t> stored(c.blocks.size() + 1);  // prefix sums
  stored[0] = c.data_offset;
  for (size_t b = 0; b < c.blocks.size(); ++b) {
    stored[b + 1] = stored[b] + c.blocks[b].stored_size;
  }
  std::vector<BlockRead> reads;
  for (const Span& s : spans) {
    for (uint64_t b = s.first; b < s.second; b += per_read) {
      BlockRead& r = reads.emplace_back();  // in place: no copies to move
      r.indexed = &c;
      r.b0 = b;
      r.b1 = std::min(s.second, b + per_read);
      r.offset = stored[r.b0];
      r.length = stored[r.b1] - stored[r.b0];
      r.raw_begin = r.b0 * c.block_size;
      r.raw_end = std::min(r.b1 * c.block_size, raw_total);
    }
  }
  return reads;
}

// Gives each read (sorted, disjoint) the parts of `copies` (sorted by src
// then request) that lie in its raw bytes (ClipCopy), sorted by src then
// request.
void AssignCopies(const std::vector<Copy>& copies,
                  std::vector<BlockRead>* reads) {
  auto first = reads->begin();  // the first read that ends past c.src
  for (const Copy& c : copies) {
    while (first != reads->end() && first->raw_end <= c.src) ++first;
    for (auto it = first; it != reads->end() && it->raw_begin < c.src_end();
         ++it) {
      ClipCopy(c, it->raw_begin, it->raw_end,
               [&](const Copy& part) { it->copies.push_back(part); });
    }
  }
  // A strided copy's later runs come after the start of the next copy.
  for (BlockRead& r : *reads) {
    if (!std::is_sorted(r.copies.begin(), r.copies.end(), SrcThenRequest)) {
      std::sort(r.copies.begin(), r.copies.end(), SrcThenRequest);
    }
  }
}

// Appends run `c` to `copies`, as one more run of the last copy where it
// continues that copy's runs: the same length at constant pitches.
void AppendRun(Copies* copies, const Copy& c) {
  if (!copies->empty()) {
    Copy& last = copies->back();
    const bool follows = last.run == c.run && last.rows < UINT32_MAX &&
                         c.src >= last.src_end() && c.dst >= last.dst_end();
    if (follows && last.rows == 1) {
      last = Copy::Rows(last.request, last.src, last.dst, last.run, 2,
                        c.src - last.src, c.dst - last.dst);
      return;
    }
    if (follows && c.src == last.src + last.rows * last.src_pitch &&
        c.dst == last.dst + last.rows * last.dst_pitch) {
      ++last.rows;
      return;
    }
  }
  copies->push_back(c);
}

}  // namespace

absl::StatusOr<std::vector<ChunkPiece>> PairRequests(
    const format::Manifest& manifest,
    const std::vector<PlanRequest>& requests) {
  std::vector<ChunkPiece> pieces;
  pieces.reserve(requests.size());  // one at least per non-empty request
  for (size_t i = 0; i < requests.size(); ++i) {
    const PlanRequest& r = requests[i];
    const EntryRecord& e = manifest.entries[r.entry];
    const uint64_t es = DTypeSize(e.dtype);
    const uint64_t want = RegionElements(r.region);
    if (want == 0) continue;
    uint64_t covered = 0;
    for (size_t c = 0; c < e.chunks.size(); ++c) {
      ChunkPiece p{
          static_cast<uint32_t>(i), r.entry, static_cast<uint32_t>(c), {}};
      covered += ForEachRun(
          e.shape, e.chunks[c].region, r.region,
          [&](uint64_t s, uint64_t d, uint64_t k) {
            AppendRun(&p.copies, Copy(p.request, s * es, d * es, k * es));
          });
      if (!p.copies.empty()) pieces.push_back(std::move(p));
    }
    if (covered != want) {
      return absl::DataLossError(absl::StrCat(
          "entry '", format::EscapeText(e.name), "': requested region ",
          RegionToString(r.region), " is not covered by the checkpoint: ",
          want - covered, " of ", want, " elements missing"));
    }
  }
  return pieces;
}

std::vector<uint32_t> ShardsOf(const format::Manifest& manifest,
                               const std::vector<ChunkPiece>& pieces) {
  std::set<uint32_t> ids;
  for (const ChunkPiece& p : pieces) {
    ids.insert(manifest.entries[p.entry].chunks[p.chunk].shard);
  }
  return {ids.begin(), ids.end()};
}

namespace {

std::pair<uint32_t, uint32_t> ChunkKey(const ChunkPiece& p) {
  return {p.entry, p.chunk};
}

// The indexes of `pieces` sorted by stored chunk (entry, chunk), in
// manifest order for a deterministic plan: 4 bytes a piece (a map of
// groups took a tree node and a vector per chunk).
std::vector<uint32_t> ByChunk(const std::vector<ChunkPiece>& pieces) {
  std::vector<uint32_t> order(pieces.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
  auto by_key = [&](uint32_t a, uint32_t b) {
    return ChunkKey(pieces[a]) < ChunkKey(pieces[b]);
  };
  if (!std::is_sorted(order.begin(), order.end(), by_key)) {
    std::stable_sort(order.begin(), order.end(), by_key);
  }
  return order;
}

// One read per chunk at least (most small chunks have exactly one):
// reserved in each shard's reads, so that they are not held twice while
// growing.
void ReserveReads(const format::Manifest& manifest,
                  const std::vector<ChunkPiece>& pieces,
                  const std::vector<uint32_t>& order,
                  std::map<uint32_t, ShardReads>* by_shard) {
  std::map<uint32_t, size_t> chunks;
  for (size_t g = 0; g < order.size(); ++g) {
    const ChunkPiece& p = pieces[order[g]];
    if (g > 0 && ChunkKey(p) == ChunkKey(pieces[order[g - 1]])) continue;
    ++chunks[manifest.entries[p.entry].chunks[p.chunk].shard];
  }
  for (const auto& [shard, n] : chunks) (*by_shard)[shard].reads.reserve(n);
}

// Moves each shard's reads into `plan`, by shard id, each sorted by offset.
void AddByOffset(std::map<uint32_t, ShardReads>* by_shard, ReadPlan* plan) {
  auto by_offset = [](const BlockRead& x, const BlockRead& y) {
    return x.offset < y.offset;
  };
  for (auto& [id, sr] : *by_shard) {
    // Chunks in manifest order usually are in file order already: no sort
    // (nor its buffer of half the reads).
    if (!std::is_sorted(sr.reads.begin(), sr.reads.end(), by_offset)) {
      std::stable_sort(sr.reads.begin(), sr.reads.end(), by_offset);
    }
    plan->shards.push_back(std::move(sr));
  }
}

}  // namespace

ReadPlan PlanBlockReads(const format::Manifest& manifest,
                        const std::vector<ChunkPiece>& pieces,
                        const BlockTableLookup& lookup,
                        uint64_t max_read_bytes) {
  std::vector<uint32_t> order = ByChunk(pieces);
  std::map<uint32_t, ShardReads> by_shard;
  ReserveReads(manifest, pieces, order, &by_shard);
  ReadPlan plan;
  std::vector<const ChunkPiece*> group;
  for (size_t g = 0; g < order.size();) {
    const std::pair<uint32_t, uint32_t> key = ChunkKey(pieces[order[g]]);
    group.clear();
    for (; g < order.size() && ChunkKey(pieces[order[g]]) == key; ++g) {
      group.push_back(&pieces[order[g]]);
    }
    const EntryRecord& e = manifest.entries[key.first];
    const ChunkRecord& c = *lookup(key.first, key.second);
    const uint64_t per_read =
        std::max<uint64_t>(1, max_read_bytes / c.block_size);
    const std::vector<Copy> copies = SortedCopies(group);
    std::vector<BlockRead> reads =
        CutReads(BlockSpans(copies, c.block_size), c,
                 RegionElements(c.region) * DTypeSize(e.dtype), per_read);
    AssignCopies(copies, &reads);
    ShardReads& sr = by_shard[c.shard];
    sr.shard = c.shard;
    for (BlockRead& r : reads) {
      r.entry = key.first;
      r.chunk = key.second;
      plan.stored_bytes += r.length;
      sr.reads.push_back(std::move(r));
    }
  }
  std::vector<uint32_t>().swap(order);
  AddByOffset(&by_shard, &plan);
  return plan;
}

}  // namespace ckpt::internal

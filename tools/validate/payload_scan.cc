// The payload pass of ckpt-validate: every block of every matched chunk is
// read and verified against its checksum.
//
// Speed: the payloads of a shard are read in file order, in granules of
// about kGranuleBytes that span chunk boundaries (small alignment padding
// is read through), so the disk sees large sequential reads even when
// chunks are tiny. A granule is verified right after it is read, while it
// is still in cache. Threads take tasks of several consecutive granules,
// so each thread also reads sequentially.
#include <algorithm>
#include <atomic>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "format/block_codec.h"
#include "format/checksum.h"
#include "format/geometry.h"
#include "libckpt/thread_pool.h"
#include "tools/common/tool_util.h"
#include "tools/validate/validate_internal.h"
#include "tools/validate/values.h"

namespace ckpt::tools::internal {
namespace {

using format::ChunkRecord;
using format::EntryRecord;

constexpr uint64_t kGranuleBytes = 1ull << 20;
constexpr uint64_t kTaskBytes = 8ull << 20;
// Padding between two chunks up to this size is read rather than skipped.
constexpr uint64_t kMaxGapBytes = 64ull << 10;

// Blocks [b0, b1) of one chunk; block b0 starts at file offset `offset`.
struct Piece {
  const ChunkRef* ref;
  uint64_t b0, b1;
  uint64_t offset;
};

// Bytes [lo, hi) of one shard file and the blocks in them.
struct Granule {
  OpenedShard* shard;
  uint64_t lo = 0, hi = 0;
  std::vector<Piece> pieces;
};

// NaN/Inf found in one chunk, summed over its blocks.
struct NonFiniteChunk {
  const OpenedShard* shard = nullptr;
  uint64_t nan = 0, inf = 0;
  uint64_t first = std::numeric_limits<uint64_t>::max();  // element index in the chunk
};

std::vector<Granule> BuildGranules(const ValidateOptions& options,
                                   const format::Manifest& manifest,
                                   const std::vector<OpenedShard*>& shards) {
  std::vector<Granule> out;
  for (OpenedShard* s : shards) {
    Granule cur;
    cur.shard = s;
    auto flush = [&] {
      if (!cur.pieces.empty()) out.push_back(std::move(cur));
      cur = Granule();
      cur.shard = s;
    };
    for (const ChunkRef& r : s->chunks) {
      const EntryRecord& e = manifest.entries[r.entry];
      const ChunkRecord& c = *r.indexed;
      if (c.stored_length == 0) continue;
      if (options.entry_filter && !options.entry_filter(e.name)) continue;
      const uint64_t es = DTypeSize(e.dtype);
      uint64_t off = c.data_offset;
      for (uint64_t b = 0; b < c.blocks.size(); ++b) {
        const uint64_t size = c.blocks[b].stored_size;
        // Inside a chunk, cut only where an element starts (always, unless
        // block_size is not a multiple of the element size).
        const bool can_cut = b == 0 || (b * c.block_size) % es == 0;
        if (!cur.pieces.empty()) {
          const bool adjacent = off >= cur.hi && off - cur.hi <= kMaxGapBytes;
          if (!adjacent || (can_cut && off + size - cur.lo > kGranuleBytes)) flush();
        }
        if (cur.pieces.empty()) cur.lo = off;
        Piece* last = cur.pieces.empty() ? nullptr : &cur.pieces.back();
        if (last != nullptr && last->ref == &r && last->b1 == b) {
          ++last->b1;
        } else {
          cur.pieces.push_back(Piece{&r, b, b + 1, off});
        }
        off += size;
        cur.hi = off;
      }
    }
    flush();
  }
  return out;
}

}  // namespace

std::string ElementCoordinates(const Shape& shape, const Region& region, uint64_t index) {
  Dims coords(shape.size());
  if (const Box* box = std::get_if<Box>(&region)) {
    for (size_t d = shape.size(); d-- > 0;) {
      coords[d] = box->offset[d] + (box->size[d] == 0 ? 0 : index % box->size[d]);
      if (box->size[d] != 0) index /= box->size[d];
    }
  } else {
    uint64_t g = std::get<FlatRange>(region).start + index;
    for (size_t d = shape.size(); d-- > 0;) {
      coords[d] = shape[d] == 0 ? 0 : g % shape[d];
      if (shape[d] != 0) g /= shape[d];
    }
  }
  return ShapeToString(coords);
}

PayloadResult ScanPayload(const ValidateOptions& options, const format::Manifest& manifest,
                          const std::vector<OpenedShard*>& shards, int threads,
                          FindingList* findings) {
  std::vector<Granule> granules = BuildGranules(options, manifest, shards);
  // Tasks: runs of consecutive granules of one shard, about kTaskBytes each.
  std::vector<std::pair<size_t, size_t>> tasks;
  uint64_t total = 0;
  for (size_t g = 0; g < granules.size(); ++g) {
    total += granules[g].hi - granules[g].lo;
    if (!tasks.empty() && granules[tasks.back().first].shard == granules[g].shard &&
        granules[g].lo - granules[tasks.back().first].lo < kTaskBytes) {
      tasks.back().second = g + 1;
    } else {
      tasks.emplace_back(g, g + 1);
    }
  }

  struct Scratch {
    std::string buf;
    std::string raw;
    format::BlockDecoder decoder;
  };
  const int n_threads = std::max(1, std::min<int>(threads, static_cast<int>(tasks.size())));
  std::vector<Scratch> scratch(n_threads);
  std::atomic<uint64_t> blocks_verified{0}, bytes_verified{0};
  absl::Mutex mu;
  std::map<const ChunkRef*, NonFiniteChunk> non_finite;  // guarded by mu
  std::unique_ptr<Progress> progress;
  if (options.progress) progress = std::make_unique<Progress>("verifying", total);

  auto chunk_finding = [&](const OpenedShard& s, const ChunkRef& r, int64_t block,
                           std::string message) {
    const EntryRecord& e = manifest.entries[r.entry];
    Finding f;
    f.file = s.path;
    f.entry = e.name;
    f.chunk = r.chunk;
    f.region = RegionToString(e.chunks[r.chunk].region);
    f.block = block;
    f.message = std::move(message);
    findings->Add(std::move(f));
  };

  // Values of verified raw bytes [offset, offset + n) of a chunk.
  auto values = [&](const OpenedShard& s, const ChunkRef& r, uint64_t offset, const char* p,
                    uint64_t n) {
    const EntryRecord& e = manifest.entries[r.entry];
    const uint64_t es = DTypeSize(e.dtype);
    // Whole elements only (a run can start mid-element only after a bad
    // block, when block_size is not a multiple of the element size).
    uint64_t skip = (es - offset % es) % es;
    if (skip >= n) return;
    offset += skip;
    p += skip;
    n = (n - skip) / es * es;
    if (n == 0) return;
    if (options.on_data) options.on_data(r.entry, e, r.chunk, offset, absl::string_view(p, n));
    if (options.check_finite && e.kind == format::EntryKind::kTensor &&
        IsFloatingPoint(e.dtype)) {
      NonFiniteCount nf = CountNonFinite(e.dtype, p, n / es);
      if (nf.nan + nf.inf > 0) {
        absl::MutexLock l(&mu);
        NonFiniteChunk& agg = non_finite[&r];
        agg.shard = &s;
        agg.nan += nf.nan;
        agg.inf += nf.inf;
        agg.first = std::min<uint64_t>(agg.first, offset / es + nf.first);
      }
    }
  };

  auto verify = [&](int t, const Granule& g) {
    Scratch& sc = scratch[t];
    const OpenedShard& s = *g.shard;
    const uint64_t n = g.hi - g.lo;
    if (sc.buf.size() < n) sc.buf.resize(n);
    auto got = s.file->PRead(g.lo, n, sc.buf.data());
    if (!got.ok() || *got != n) {
      std::string why = got.ok() ? absl::StrCat("file ends at offset ", g.lo + *got)
                                 : std::string(got.status().message());
      size_t chunks = 0;
      for (size_t i = 0; i < g.pieces.size(); ++i) {
        chunks += i == 0 || g.pieces[i].ref != g.pieces[i - 1].ref;
      }
      chunk_finding(s, *g.pieces[0].ref, g.pieces[0].b0,
                    absl::StrCat("reading bytes [", g.lo, ", ", g.hi, "): ", why,
                                 chunks > 1 ? absl::StrCat(" (", chunks, " chunks not verified)")
                                            : ""));
      return;
    }
    uint64_t good_blocks = 0, good_bytes = 0;
    for (const Piece& piece : g.pieces) {
      const ChunkRef& r = *piece.ref;
      const ChunkRecord& c = *r.indexed;
      const uint64_t bs = c.block_size;
      const uint64_t raw_total =
          RegionElements(c.region) * DTypeSize(manifest.entries[r.entry].dtype);
      const char* p = sc.buf.data() + (piece.offset - g.lo);
      if (c.codec == format::Codec::kNone) {
        // Verify in place; hand on runs of good blocks.
        uint64_t run = piece.b0;
        const char* run_p = p;
        for (uint64_t b = piece.b0; b < piece.b1; ++b) {
          const uint64_t size = c.blocks[b].stored_size;
          const uint64_t sum = format::Checksum(p, size);
          if (sum != c.blocks[b].checksum) {
            chunk_finding(s, r, b,
                          std::string(format::ChecksumMismatch(c.blocks[b].checksum, sum)
                                          .message()));
            if (b > run) values(s, r, run * bs, run_p, b * bs - run * bs);
            run = b + 1;
            run_p = p + size;
          } else {
            ++good_blocks;
            good_bytes += size;
          }
          p += size;
        }
        if (piece.b1 > run) {
          values(s, r, run * bs, run_p, std::min(piece.b1 * bs, raw_total) - run * bs);
        }
      } else {
        for (uint64_t b = piece.b0; b < piece.b1; ++b) {
          const uint64_t size = c.blocks[b].stored_size;
          const uint64_t raw = std::min(bs, raw_total - b * bs);
          if (sc.raw.size() < raw) sc.raw.resize(raw);
          absl::Status st = sc.decoder.Decode(c.codec, absl::string_view(p, size),
                                              c.blocks[b].checksum, raw, sc.raw.data());
          if (!st.ok()) {
            chunk_finding(s, r, b, std::string(st.message()));
          } else {
            ++good_blocks;
            good_bytes += size;
            values(s, r, b * bs, sc.raw.data(), raw);
          }
          p += size;
        }
      }
    }
    blocks_verified += good_blocks;
    bytes_verified += good_bytes;
    if (progress != nullptr) {
      absl::MutexLock l(&mu);
      progress->Add(n);
    }
  };

  (void)::ckpt::internal::ParallelFor(n_threads, tasks.size(), [&](int t, size_t i) {
    for (size_t g = tasks[i].first; g < tasks[i].second; ++g) verify(t, granules[g]);
    return absl::OkStatus();
  });
  if (progress != nullptr) progress->Finish();

  for (const auto& [ref, agg] : non_finite) {
    const EntryRecord& e = manifest.entries[ref->entry];
    const ChunkRecord& c = e.chunks[ref->chunk];
    const uint64_t es = DTypeSize(e.dtype);
    chunk_finding(
        *agg.shard, *ref, static_cast<int64_t>(agg.first * es / c.block_size),
        absl::StrCat("non-finite values: ", agg.nan, " NaN, ", agg.inf, " Inf; the first at ",
                     ElementCoordinates(e.shape, c.region, agg.first)));
  }
  return PayloadResult{blocks_verified.load(), bytes_verified.load()};
}

}  // namespace ckpt::tools::internal

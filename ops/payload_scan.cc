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
#include "ckpt/format/block_codec.h"
#include "ckpt/format/geometry.h"
#include "ckpt/ops/values.h"
#include "progress_reporter.h"
#include "read/index_check.h"
#include "read/scratch_budget.h"
#include "read/shard_file.h"
#include "util/mutex.h"
#include "util/parallel_for.h"
#include "validate_internal.h"

namespace ckpt::ops::internal {
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
  uint64_t first =
      std::numeric_limits<uint64_t>::max();  // element index in the chunk
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
          if (!adjacent || (can_cut && off + size - cur.lo > kGranuleBytes))
            flush();
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

std::string ElementCoordinates(const Shape& shape, const Region& region,
                               uint64_t index) {
  Dims coords(shape.size());
  if (const Box* box = std::get_if<Box>(&region)) {
    for (size_t d = shape.size(); d-- > 0;) {
      coords[d] =
          box->offset[d] + (box->size[d] == 0 ? 0 : index % box->size[d]);
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

namespace {

// Tasks: runs of consecutive granules of one shard, about kTaskBytes each,
// as [first, last) granule indexes.
std::vector<std::pair<size_t, size_t>> GroupTasks(
    const std::vector<Granule>& granules) {
  std::vector<std::pair<size_t, size_t>> tasks;
  for (size_t g = 0; g < granules.size(); ++g) {
    if (!tasks.empty() &&
        granules[tasks.back().first].shard == granules[g].shard &&
        granules[g].lo - granules[tasks.back().first].lo < kTaskBytes) {
      tasks.back().second = g + 1;
    } else {
      tasks.emplace_back(g, g + 1);
    }
  }
  return tasks;
}

// One payload pass. Run() verifies every granule on several threads; the
// other methods are its phases, called from those threads.
class PayloadScan {
 public:
  PayloadScan(const ValidateOptions& options, const format::Manifest& manifest,
              const std::vector<OpenedShard*>& shards, int threads,
              FindingList* findings)
      : options_(options),
        manifest_(manifest),
        findings_(findings),
        granules_(BuildGranules(options, manifest, shards)),
        tasks_(GroupTasks(granules_)),
        threads_(std::max(
            1, std::min<int>(threads, static_cast<int>(tasks_.size())))),
        scratch_(threads_) {}

  PayloadResult Run();

 private:
  struct Scratch {
    std::string buf;
    std::string raw;
    format::BlockDecoder decoder;
  };

  void ChunkFinding(const OpenedShard& s, const ChunkRef& r, int64_t block,
                    std::string message);
  void Values(const OpenedShard& s, const ChunkRef& r, uint64_t offset,
              const char* p, uint64_t n);
  void VerifyGranule(Scratch& sc, const Granule& g);
  uint64_t RawScratch(const Granule& g) const;
  void VerifyPiece(Scratch& sc, const OpenedShard& s, const Piece& piece,
                   const char* p);
  void ReportNonFinite();

  const ValidateOptions& options_;
  const format::Manifest& manifest_;
  FindingList* findings_;
  const std::vector<Granule> granules_;
  const std::vector<std::pair<size_t, size_t>> tasks_;
  const int threads_;
  std::vector<Scratch> scratch_;  // one per thread
  std::atomic<uint64_t> blocks_verified_{0}, bytes_verified_{0};
  Mutex mu_;
  std::map<const ChunkRef*, NonFiniteChunk> non_finite_ ABSL_GUARDED_BY(mu_);
  // Set by Run before the threads start.
  std::unique_ptr<ProgressReporter> progress_;
};

void PayloadScan::ChunkFinding(const OpenedShard& s, const ChunkRef& r,
                               int64_t block, std::string message) {
  const EntryRecord& e = manifest_.entries[r.entry];
  Finding f;
  f.file = s.path;
  f.entry = e.name;
  f.chunk = r.chunk;
  f.region = RegionToString(e.chunks[r.chunk].region);
  f.block = block;
  f.message = std::move(message);
  findings_->Add(std::move(f));
}

// Hands verified raw bytes [offset, offset + n) of a chunk to on_data and
// counts their NaN and Inf (with check_finite). Whole elements only: a run
// can start mid-element only after a bad block, when block_size is not a
// multiple of the element size.
void PayloadScan::Values(const OpenedShard& s, const ChunkRef& r,
                         uint64_t offset, const char* p, uint64_t n) {
  const EntryRecord& e = manifest_.entries[r.entry];
  const uint64_t es = DTypeSize(e.dtype);
  uint64_t skip = (es - offset % es) % es;
  if (skip >= n) return;
  offset += skip;
  p += skip;
  n = (n - skip) / es * es;
  if (n == 0) return;
  if (options_.on_data)
    options_.on_data(r.entry, e, r.chunk, offset, absl::string_view(p, n));
  if (!options_.check_finite || e.kind != format::EntryKind::kTensor ||
      !IsFloatingPoint(e.dtype)) {
    return;
  }
  NonFiniteCount nf = CountNonFinite(e.dtype, p, n / es);
  if (nf.nan + nf.inf == 0) return;
  MutexLock l(&mu_);
  NonFiniteChunk& agg = non_finite_[&r];
  agg.shard = &s;
  agg.nan += nf.nan;
  agg.inf += nf.inf;
  agg.first = std::min<uint64_t>(agg.first, offset / es + nf.first);
}

// Reads granule g in one read and verifies its pieces; a failed read is one
// finding for the whole granule.
void PayloadScan::VerifyGranule(Scratch& sc, const Granule& g) {
  const OpenedShard& s = *g.shard;
  const uint64_t n = g.hi - g.lo;
  ::ckpt::internal::ScratchLease lease(n + RawScratch(g));
  if (sc.buf.size() < n) sc.buf.resize(n);
  absl::Status read =
      ::ckpt::internal::ReadExactly(*s.file.file, g.lo, n, sc.buf.data());
  if (!read.ok()) {
    size_t chunks = 0;
    for (size_t i = 0; i < g.pieces.size(); ++i) {
      chunks += i == 0 || g.pieces[i].ref != g.pieces[i - 1].ref;
    }
    ChunkFinding(s, *g.pieces[0].ref, g.pieces[0].b0,
                 absl::StrCat(read.message(),
                              chunks > 1 ? absl::StrCat(" (", chunks,
                                                        " chunks not verified)")
                                         : ""));
    return;
  }
  for (const Piece& piece : g.pieces) {
    VerifyPiece(sc, s, piece, sc.buf.data() + (piece.offset - g.lo));
  }
  ::ckpt::internal::ReleaseLargeScratch(sc.buf);
  ::ckpt::internal::ReleaseLargeScratch(sc.raw);
  if (progress_ != nullptr) progress_->Add(n);
}

// The scratch that decoding the largest zstd block of `g` takes.
uint64_t PayloadScan::RawScratch(const Granule& g) const {
  uint64_t most = 0;
  for (const Piece& piece : g.pieces) {
    const ChunkRecord& c = *piece.ref->indexed;
    if (c.codec == format::Codec::kNone) continue;
    const uint64_t raw_total =
        ::ckpt::internal::ChunkRawBytes(manifest_.entries[piece.ref->entry], c);
    most = std::max(
        most, std::min(c.block_size, raw_total - piece.b0 * c.block_size));
  }
  return most;
}

// Verifies the blocks of `piece`, whose stored bytes start at `p`: a
// finding per bad block; the raw bytes of good blocks go to Values, in runs
// of consecutive good blocks (so that elements across block boundaries are
// seen whole).
void PayloadScan::VerifyPiece(Scratch& sc, const OpenedShard& s,
                              const Piece& piece, const char* p) {
  const ChunkRef& r = *piece.ref;
  const ChunkRecord& c = *r.indexed;
  const uint64_t bs = c.block_size;
  const uint64_t raw_total =
      ::ckpt::internal::ChunkRawBytes(manifest_.entries[r.entry], c);
  const bool in_place = c.codec == format::Codec::kNone;
  uint64_t run = piece.b0;  // first block of the current run of good blocks
  const char* run_p = p;
  uint64_t good_blocks = 0, good_bytes = 0;
  for (uint64_t b = piece.b0; b < piece.b1; ++b) {
    const uint64_t size = c.blocks[b].stored_size;
    const uint64_t raw_size = std::min(bs, raw_total - b * bs);
    if (!in_place && sc.raw.size() < raw_size) sc.raw.resize(raw_size);
    auto raw = ::ckpt::internal::VerifyBlock(manifest_.entries[r.entry], c, b,
                                             absl::string_view(p, size),
                                             &sc.decoder, sc.raw.data());
    if (!raw.ok()) {
      ChunkFinding(s, r, b, std::string(raw.status().message()));
      if (in_place && b > run) Values(s, r, run * bs, run_p, b * bs - run * bs);
      run = b + 1;
      run_p = p + size;
    } else {
      ++good_blocks;
      good_bytes += size;
      if (!in_place) Values(s, r, b * bs, *raw, raw_size);
    }
    p += size;
  }
  if (in_place && piece.b1 > run) {
    Values(s, r, run * bs, run_p,
           std::min(piece.b1 * bs, raw_total) - run * bs);
  }
  blocks_verified_ += good_blocks;
  bytes_verified_ += good_bytes;
}

// One finding per chunk that holds NaN or Inf, at its first such element.
void PayloadScan::ReportNonFinite() {
  MutexLock l(&mu_);
  for (const auto& [ref, agg] : non_finite_) {
    const EntryRecord& e = manifest_.entries[ref->entry];
    const ChunkRecord& c = e.chunks[ref->chunk];
    const uint64_t es = DTypeSize(e.dtype);
    ChunkFinding(
        *agg.shard, *ref, static_cast<int64_t>(agg.first * es / c.block_size),
        absl::StrCat("non-finite values: ", agg.nan, " NaN, ", agg.inf,
                     " Inf; the first at ",
                     ElementCoordinates(e.shape, c.region, agg.first)));
  }
}

PayloadResult PayloadScan::Run() {
  if (options_.on_progress) {
    uint64_t total = 0;
    for (const Granule& g : granules_) total += g.hi - g.lo;
    progress_ = std::make_unique<ProgressReporter>(options_.on_progress,
                                                   kPhaseVerifying, total);
  }
  (void)::ckpt::internal::ParallelFor(
      threads_, tasks_.size(), [&](int t, size_t i) {
        for (size_t g = tasks_[i].first; g < tasks_[i].second; ++g) {
          VerifyGranule(scratch_[t], granules_[g]);
        }
        return absl::OkStatus();
      });
  if (progress_ != nullptr) progress_->Finish();
  ReportNonFinite();
  return PayloadResult{blocks_verified_.load(), bytes_verified_.load()};
}

}  // namespace

PayloadResult ScanPayload(const ValidateOptions& options,
                          const format::Manifest& manifest,
                          const std::vector<OpenedShard*>& shards, int threads,
                          FindingList* findings) {
  return PayloadScan(options, manifest, shards, threads, findings).Run();
}

}  // namespace ckpt::ops::internal

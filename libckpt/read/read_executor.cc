#include "read/read_executor.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "read/scratch_budget.h"

namespace ckpt::internal {

using format::ChunkRecord;
using format::EntryRecord;

std::string ReadExecutor::Where(const OpenShard& shard, const EntryRecord& e,
                                const BlockRead& read, uint64_t b) const {
  return internal::LocationText(shard.path, e.name, read.chunk,
                                RegionToString(read.indexed->region),
                                static_cast<int64_t>(b));
}

void ReadExecutor::Finish(uint32_t request, uint64_t bytes) {
  if (bytes != 0 && (remaining_[request] -= bytes) == 0 &&
      reqs_[request].on_complete) {
    reqs_[request].on_complete();
  }
}

void ReadExecutor::Tally::Add(uint32_t request, uint64_t bytes) {
  for (int i = used_ - 1; i >= 0; --i) {  // the latest first
    if (request_[i] == request) {
      bytes_[i] += bytes;
      return;
    }
  }
  if (used_ == kRequests) Flush();
  request_[used_] = request;
  bytes_[used_++] = bytes;
}

void ReadExecutor::Tally::Flush() {
  for (int i = 0; i < used_; ++i) run_->Finish(request_[i], bytes_[i]);
  used_ = 0;
}

// Uncompressed, one host destination taking every byte of the read: the
// bytes can be read straight into it.
bool ReadExecutor::IsDirect(const BlockRead& read) const {
  if (read.indexed->codec != format::Codec::kNone || read.copies.size() != 1) {
    return false;
  }
  const Copy& c = read.copies[0];
  return reqs_[c.request].memory == MemoryKind::kHost && c.rows == 1 &&
         c.src == read.raw_begin && c.run == read.raw_end - read.raw_begin;
}

// Reads a direct read into its destination a granule at a time and
// verifies each granule while it is still in cache.
absl::Status ReadExecutor::ReadDirect(const OpenShard& shard, File& file,
                                      const EntryRecord& e,
                                      const BlockRead& read) {
  const ChunkRecord& c = *read.indexed;
  const uint64_t bs = c.block_size;
  const Copy& copy = read.copies[0];
  char* out = static_cast<char*>(reqs_[copy.request].data) + copy.dst;
  const uint64_t per_granule = std::max<uint64_t>(1, kGranuleBytes / bs);
  for (uint64_t g0 = read.b0; g0 < read.b1; g0 += per_granule) {
    const uint64_t g1 = std::min(read.b1, g0 + per_granule);
    const uint64_t lo = g0 * bs - read.raw_begin;
    const uint64_t n = std::min(g1 * bs, read.raw_end) - g0 * bs;
    absl::Status st =
        internal::ReadExactly(file, read.offset + lo, n, out + lo);
    if (!st.ok()) return Annotate(st, Where(shard, e, read, g0));
    for (uint64_t b = g0; b < g1; ++b) {
      absl::string_view stored(out + (b * bs - read.raw_begin),
                               c.blocks[b].stored_size);
      auto raw = internal::VerifyBlock(e, c, b, stored, nullptr, nullptr);
      if (!raw.ok()) return Annotate(raw.status(), Where(shard, e, read, b));
    }
  }
  bytes_read_ += read.length;
  blocks_verified_ += read.b1 - read.b0;
  Finish(copy.request, copy.run);
  return absl::OkStatus();
}

bool ReadExecutor::ToDevice(const BlockRead& read) const {
  for (const Copy& c : read.copies) {
    if (reqs_[c.request].memory == MemoryKind::kCuda) return true;
  }
  return false;
}

absl::Status ReadExecutor::Run(int t, const OpenShard& shard, File& file,
                               const EntryRecord& e, const BlockRead& read) {
  if (IsDirect(read)) return ReadDirect(shard, file, e, read);
  // A granule of blocks at a time, so that the bytes stay in cache from
  // read through verification to the copies out.
  const uint64_t per_granule =
      std::max<uint64_t>(1, kGranuleBytes / read.indexed->block_size);
  size_t cursor = 0;  // first copy not yet done with
  for (uint64_t b0 = read.b0; b0 < read.b1; b0 += per_granule) {
    CKPT_RETURN_IF_ERROR(ReadGranule(scratch_[t], shard, file, e, read, b0,
                                     std::min(read.b1, b0 + per_granule),
                                     &cursor));
  }
  Scratch& s = scratch_[t];
  if (s.uploader != nullptr && ToDevice(read)) return s.uploader->Drain();
  return absl::OkStatus();
}

absl::Status ReadExecutor::VerifyBlocks(Scratch& s, const OpenShard& shard,
                                        const EntryRecord& e,
                                        const BlockRead& read, uint64_t b0,
                                        uint64_t b1, const char* stored,
                                        char* raw) {
  const ChunkRecord& c = *read.indexed;
  const char* p = stored;
  for (uint64_t b = b0; b < b1; ++b) {
    const uint64_t size = c.blocks[b].stored_size;
    auto verified = internal::VerifyBlock(
        e, c, b, absl::string_view(p, size), &s.decoder,
        raw != nullptr ? raw + (b - b0) * c.block_size : nullptr);
    if (!verified.ok()) {
      return Annotate(verified.status(), Where(shard, e, read, b));
    }
    p += size;
  }
  return absl::OkStatus();
}

// Blocks [b0, b1) of `read`: read, verify (and decode), copy out.
// `cursor` carries CopyOut's position from one granule to the next.
absl::Status ReadExecutor::ReadGranule(Scratch& s, const OpenShard& shard,
                                       File& file, const EntryRecord& e,
                                       const BlockRead& read, uint64_t b0,
                                       uint64_t b1, size_t* cursor) {
  const ChunkRecord& c = *read.indexed;
  const uint64_t bs = c.block_size;
  const uint64_t lo = b0 * bs, hi = std::min(b1 * bs, read.raw_end);
  uint64_t stored_size = 0, first = read.offset;
  for (uint64_t b = read.b0; b < b1; ++b) {
    (b < b0 ? first : stored_size) += c.blocks[b].stored_size;
  }
  const bool decode = c.codec != format::Codec::kNone;
  char* pinned = nullptr;  // the granule's pinned buffer (device copies)
  if (s.uploader != nullptr && ToDevice(read)) {
    CKPT_ASSIGN_OR_RETURN(pinned,
                          s.uploader->Next(std::max(hi - lo, stored_size)));
  }
  // A zstd granule that one host destination takes whole is decoded into
  // it: no scratch for its raw bytes (a block may be 1 GiB).
  const Copy* whole =
      decode && pinned == nullptr ? TakesWhole(read, lo, hi, *cursor) : nullptr;
  const bool raw_scratch = decode && pinned == nullptr && whole == nullptr;
  ScratchLease lease((pinned == nullptr || decode ? stored_size : 0) +
                     (raw_scratch ? hi - lo : 0));
  char* stored = pinned;
  if (pinned == nullptr || decode) {
    s.stored.resize(stored_size);
    stored = s.stored.data();
  }
  absl::Status st = internal::ReadExactly(file, first, stored_size, stored);
  if (!st.ok()) return Annotate(st, Where(shard, e, read, b0));
  char* bytes = decode ? pinned : stored;  // the raw bytes, once decoded
  if (whole != nullptr) {
    bytes = static_cast<char*>(reqs_[whole->request].data) + whole->dst +
            (lo - whole->src);
  } else if (raw_scratch) {
    s.raw.resize(hi - lo);
    bytes = s.raw.data();
  }
  CKPT_RETURN_IF_ERROR(VerifyBlocks(s, shard, e, read, b0, b1, stored,
                                    decode ? bytes : nullptr));
  bytes_read_ += stored_size;
  blocks_verified_ += b1 - b0;
  ReleaseLargeScratch(s.stored);
  if (whole != nullptr) {
    Finish(whole->request, hi - lo);
    return absl::OkStatus();
  }
  internal::LoadStager* uploader = pinned ? s.uploader.get() : nullptr;
  absl::Status copied = CopyOut(read, lo, hi, bytes, cursor, uploader);
  ReleaseLargeScratch(s.raw);
  CKPT_RETURN_IF_ERROR(copied);
  return uploader != nullptr ? uploader->Submit() : absl::OkStatus();
}

// The copy that takes every raw byte of [lo, hi) of `read` when it is the
// only one to take any of them and its destination is host memory; null
// otherwise. Copies before `cursor` end before `lo`.
const Copy* ReadExecutor::TakesWhole(const BlockRead& read, uint64_t lo,
                                     uint64_t hi, size_t cursor) const {
  const Copy* only = nullptr;
  for (size_t i = cursor; i < read.copies.size() && read.copies[i].src < hi;
       ++i) {
    const Copy& c = read.copies[i];
    if (c.src_end() <= lo) continue;
    if (only != nullptr) return nullptr;
    only = &c;
  }
  if (only == nullptr || only->rows != 1 || only->src > lo ||
      only->src + only->run < hi ||
      reqs_[only->request].memory != MemoryKind::kHost) {
    return nullptr;
  }
  return only;
}

// Copies the raw bytes [lo, hi) of the read's chunk, at `raw`, to the
// destinations of the copies that overlap them.
absl::Status ReadExecutor::CopyOut(const BlockRead& read, uint64_t lo,
                                   uint64_t hi, const char* raw, size_t* cursor,
                                   internal::LoadStager* uploader) {
  // Runs of consecutive copies into one device destination: one batch, in
  // which equal rows at constant pitches become one strided copy.
  std::vector<internal::CopyRun> runs;
  uint32_t run_request = 0;
  uint64_t run_bytes = 0;
  auto flush = [&]() -> absl::Status {
    if (runs.empty()) return absl::OkStatus();
    const LoadRequest& r = reqs_[run_request];
    absl::Status st = uploader->Copy(
        r.device, internal::CoalesceRuns(runs, raw, static_cast<char*>(r.data)),
        run_request, run_bytes);
    runs.clear();
    run_bytes = 0;
    return st;
  };
  Tally written(this);
  const Copies& copies = read.copies;
  // Copies are sorted by src: skip those that end before `lo`.
  while (*cursor < copies.size() && copies[*cursor].src_end() <= lo) {
    ++*cursor;
  }
  absl::Status st;
  for (size_t i = *cursor; i < copies.size() && copies[i].src < hi; ++i) {
    const Copy& c = copies[i];
    const LoadRequest& r = reqs_[c.request];
    const bool staged = r.memory == MemoryKind::kCuda && uploader != nullptr;
    if (staged && !runs.empty() && run_request != c.request) {
      CKPT_RETURN_IF_ERROR(flush());
    }
    ForEachRunIn(c, lo, hi, [&](uint64_t a, uint64_t dst, uint64_t n) {
      if (!st.ok()) return;
      char* out = static_cast<char*>(r.data) + dst;
      if (staged) {
        run_request = c.request;
        runs.push_back({a - lo, dst, n});
        run_bytes += n;  // Finish()ed by the uploader once the copy completed
        return;
      }
      if (r.memory == MemoryKind::kHost) {
        std::memcpy(out, raw + (a - lo), n);
      } else {
        st = dm_->CopyFromHost(out, raw + (a - lo), n, r.device);
        if (!st.ok()) return;
      }
      written.Add(c.request, n);
    });
    CKPT_RETURN_IF_ERROR(st);
  }
  return flush();
}

absl::Status ReadExecutor::Deliver(uint32_t request, uint64_t dst,
                                   const char* bytes, uint64_t n,
                                   Tally* tally) {
  const LoadRequest& r = reqs_[request];
  char* out = static_cast<char*>(r.data) + dst;
  if (r.memory == MemoryKind::kHost) {
    std::memcpy(out, bytes, n);
  } else {
    CKPT_RETURN_IF_ERROR(dm_->CopyFromHost(out, bytes, n, r.device));
  }
  tally->Add(request, n);
  return absl::OkStatus();
}

absl::Status ReadExecutor::CheckAllWritten() const {
  for (size_t i = 0; i < reqs_.size(); ++i) {
    if (remaining_[i] != 0) {
      return absl::InternalError(
          absl::StrCat("entry '", format::EscapeText(reqs_[i].name),
                       "': ", remaining_[i].load(), " bytes were not loaded"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckpt::internal

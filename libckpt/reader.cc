#include "ckpt/reader.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/format/block_codec.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/internal/checkpoint_dir.h"
#include "ckpt/internal/read_plan.h"
#include "ckpt/internal/shard_file.h"
#include "ckpt/internal/thread_pool.h"
#include "ckpt/mutex.h"
#include "device_upload.h"
#include "staging_pool.h"

namespace ckpt {
namespace {

using format::ChunkRecord;
using format::EntryRecord;
using internal::BlockRead;
using internal::Copy;

constexpr uint64_t kTaskBytes = 8ull << 20;     // largest read of one task
constexpr uint64_t kGranuleBytes = 1ull << 20;  // read-then-verify granule

// A shard file opened for reading and checked against the manifest.
struct OpenShard {
  std::string path;
  internal::ShardFile file;
  // (entry << 32 | chunk) of a manifest chunk -> its index record.
  absl::flat_hash_map<uint64_t, const ChunkRecord*> indexed;
};

uint64_t ChunkKey(uint32_t entry, uint32_t chunk) {
  return uint64_t{entry} << 32 | chunk;
}

// The requests of one Load after CheckRequest, objects turned into 1-d
// uint8 requests into their strings.
struct Prepared {
  std::vector<LoadRequest> reqs;
  std::vector<uint32_t> entry;  // manifest entry of each request
};

// The state of one Load while its reads run on several threads. With a
// staging `pool` (device destinations), a read with device destinations
// goes through pinned buffers of its thread's DeviceUploader: the copies to
// the device of one granule run while the next is read, after `after` (the
// caller's event, may be null).
class LoadRun {
 public:
  LoadRun(const Prepared& p, DeviceMemory* dm, internal::StagingPool* pool,
          DeviceEvent* after, int threads)
      : reqs_(p.reqs), dm_(dm), remaining_(p.reqs.size()), scratch_(threads) {
    for (size_t i = 0; i < reqs_.size(); ++i) {
      const LoadRequest& r = reqs_[i];
      remaining_[i] = RegionElements(r.region) * DTypeSize(r.dtype);
    }
    if (pool == nullptr) return;
    for (Scratch& s : scratch_) {
      s.uploader = std::make_unique<internal::DeviceUploader>(
          pool, dm, after,
          [this](size_t request, uint64_t bytes) { Finish(request, bytes); });
    }
  }

  // Calls on_complete of the requests with nothing to load.
  void CompleteEmpty() {
    for (size_t i = 0; i < reqs_.size(); ++i) {
      if (remaining_[i] == 0 && reqs_[i].on_complete) reqs_[i].on_complete();
    }
  }

  // Reads, verifies and copies out one read of the plan; thread `t`.
  absl::Status Run(int t, const OpenShard& shard, const EntryRecord& e,
                   const BlockRead& read);

  // InternalError naming a request that was not completely written.
  absl::Status CheckAllWritten() const;
  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t blocks_verified() const { return blocks_verified_; }

 private:
  struct Scratch {
    std::string stored, raw;
    format::BlockDecoder decoder;
    std::unique_ptr<internal::DeviceUploader> uploader;  // device destinations
  };
  bool IsDirect(const BlockRead& read) const;
  bool ToDevice(const BlockRead& read) const;
  absl::Status ReadDirect(const OpenShard& shard, const EntryRecord& e,
                          const BlockRead& read);
  absl::Status ReadGranule(Scratch& s, const OpenShard& shard,
                           const EntryRecord& e, const BlockRead& read,
                           uint64_t b0, uint64_t b1, size_t* cursor);
  // `uploader`: copies to device destinations go through it (raw is in
  // its pinned buffer); null: synchronous DeviceMemory::CopyFromHost.
  absl::Status CopyOut(const BlockRead& read, uint64_t lo, uint64_t hi,
                       const char* raw, size_t* cursor,
                       internal::DeviceUploader* uploader);
  void Finish(uint32_t request, uint64_t bytes);
  std::string Where(const OpenShard& shard, const EntryRecord& e,
                    const BlockRead& read, uint64_t b) const;

  const std::vector<LoadRequest>& reqs_;
  DeviceMemory* dm_;
  std::vector<std::atomic<uint64_t>> remaining_;
  std::vector<Scratch> scratch_;
  std::atomic<uint64_t> bytes_read_{0}, blocks_verified_{0};
};

std::string LoadRun::Where(const OpenShard& shard, const EntryRecord& e,
                           const BlockRead& read, uint64_t b) const {
  return internal::LocationText(shard.path, e.name, read.chunk,
                                RegionToString(read.indexed->region),
                                static_cast<int64_t>(b));
}

void LoadRun::Finish(uint32_t request, uint64_t bytes) {
  if (bytes != 0 && (remaining_[request] -= bytes) == 0 &&
      reqs_[request].on_complete) {
    reqs_[request].on_complete();
  }
}

// Uncompressed, one host destination taking every byte of the read: the
// bytes can be read straight into it.
bool LoadRun::IsDirect(const BlockRead& read) const {
  if (read.indexed->codec != format::Codec::kNone || read.copies.size() != 1) {
    return false;
  }
  const Copy& c = read.copies[0];
  return reqs_[c.request].memory == MemoryKind::kHost &&
         c.src == read.raw_begin && c.bytes == read.raw_end - read.raw_begin;
}

// Reads a direct read into its destination a granule at a time and
// verifies each granule while it is still in cache.
absl::Status LoadRun::ReadDirect(const OpenShard& shard, const EntryRecord& e,
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
        internal::ReadExactly(*shard.file.file, read.offset + lo, n, out + lo);
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
  Finish(copy.request, copy.bytes);
  return absl::OkStatus();
}

bool LoadRun::ToDevice(const BlockRead& read) const {
  for (const Copy& c : read.copies) {
    if (reqs_[c.request].memory == MemoryKind::kCuda) return true;
  }
  return false;
}

absl::Status LoadRun::Run(int t, const OpenShard& shard, const EntryRecord& e,
                          const BlockRead& read) {
  if (IsDirect(read)) return ReadDirect(shard, e, read);
  // A granule of blocks at a time, so that the bytes stay in cache from
  // read through verification to the copies out.
  const uint64_t per_granule =
      std::max<uint64_t>(1, kGranuleBytes / read.indexed->block_size);
  size_t cursor = 0;  // first copy not yet done with
  for (uint64_t b0 = read.b0; b0 < read.b1; b0 += per_granule) {
    CKPT_RETURN_IF_ERROR(ReadGranule(scratch_[t], shard, e, read, b0,
                                     std::min(read.b1, b0 + per_granule),
                                     &cursor));
  }
  Scratch& s = scratch_[t];
  if (s.uploader != nullptr && ToDevice(read)) return s.uploader->Drain();
  return absl::OkStatus();
}

// Blocks [b0, b1) of `read`: read, verify (and decode), copy out.
// `cursor` carries CopyOut's position from one granule to the next.
absl::Status LoadRun::ReadGranule(Scratch& s, const OpenShard& shard,
                                  const EntryRecord& e, const BlockRead& read,
                                  uint64_t b0, uint64_t b1, size_t* cursor) {
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
  char* stored = pinned;
  if (pinned == nullptr || decode) {
    s.stored.resize(stored_size);
    stored = s.stored.data();
  }
  absl::Status st =
      internal::ReadExactly(*shard.file.file, first, stored_size, stored);
  if (!st.ok()) return Annotate(st, Where(shard, e, read, b0));
  char* bytes = decode ? pinned : stored;  // the raw bytes, once decoded
  if (decode && bytes == nullptr) {
    s.raw.resize(hi - lo);
    bytes = s.raw.data();
  }
  const char* p = stored;
  for (uint64_t b = b0; b < b1; ++b) {
    const uint64_t size = c.blocks[b].stored_size;
    auto raw =
        internal::VerifyBlock(e, c, b, absl::string_view(p, size), &s.decoder,
                              decode ? bytes + (b - b0) * bs : nullptr);
    if (!raw.ok()) return Annotate(raw.status(), Where(shard, e, read, b));
    p += size;
  }
  bytes_read_ += stored_size;
  blocks_verified_ += b1 - b0;
  internal::DeviceUploader* uploader = pinned ? s.uploader.get() : nullptr;
  CKPT_RETURN_IF_ERROR(CopyOut(read, lo, hi, bytes, cursor, uploader));
  return uploader != nullptr ? uploader->Submit() : absl::OkStatus();
}

// Copies the raw bytes [lo, hi) of the read's chunk, at `raw`, to the
// destinations of the copies that overlap them.
absl::Status LoadRun::CopyOut(const BlockRead& read, uint64_t lo, uint64_t hi,
                              const char* raw, size_t* cursor,
                              internal::DeviceUploader* uploader) {
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
  const std::vector<Copy>& copies = read.copies;
  // Copies are sorted by src: skip those that end before `lo`.
  while (*cursor < copies.size() &&
         copies[*cursor].src + copies[*cursor].bytes <= lo) {
    ++*cursor;
  }
  for (size_t i = *cursor; i < copies.size() && copies[i].src < hi; ++i) {
    const Copy& c = copies[i];
    const uint64_t a = std::max(lo, c.src), z = std::min(hi, c.src + c.bytes);
    if (a >= z) continue;
    const LoadRequest& r = reqs_[c.request];
    char* out = static_cast<char*>(r.data) + c.dst + (a - c.src);
    if (r.memory == MemoryKind::kCuda && uploader != nullptr) {
      if (!runs.empty() && run_request != c.request) {
        CKPT_RETURN_IF_ERROR(flush());
      }
      run_request = c.request;
      runs.push_back({a - lo, c.dst + (a - c.src), z - a});
      run_bytes += z - a;
      continue;  // Finish()ed by the uploader once the copy completed
    }
    if (r.memory == MemoryKind::kHost) {
      std::memcpy(out, raw + (a - lo), z - a);
    } else {
      CKPT_RETURN_IF_ERROR(
          dm_->CopyFromHost(out, raw + (a - lo), z - a, r.device));
    }
    Finish(c.request, z - a);
  }
  return flush();
}

absl::Status LoadRun::CheckAllWritten() const {
  for (size_t i = 0; i < reqs_.size(); ++i) {
    if (remaining_[i] != 0) {
      return absl::InternalError(absl::StrCat("entry '", reqs_[i].name,
                                              "': ", remaining_[i].load(),
                                              " bytes were not loaded"));
    }
  }
  return absl::OkStatus();
}

class ReaderImpl final : public Reader {
 public:
  ReaderImpl(Storage* storage, std::string dir, format::Manifest m,
             const ReaderOptions& o)
      : storage_(storage),
        dir_(std::move(dir)),
        manifest_(std::move(m)),
        options_(o),
        index_(manifest_) {
    for (const auto& s : manifest_.shards) shard_info_[s.shard_id] = &s;
    description_.step = manifest_.info.step;
    description_.world_size = manifest_.info.world_size;
    description_.id = format::IdToHex(manifest_.info.id);
    description_.created_unix_ns = manifest_.info.created_unix_ns;
    description_.writer = manifest_.info.writer;
    description_.format_version =
        absl::StrCat(format::kFormatMajor, ".", manifest_.minor_version);
    description_.metadata = manifest_.metadata;
  }

  const std::string& path() const override { return dir_; }
  const CheckpointDescription& description() const override {
    return description_;
  }
  std::vector<EntryView> entries() const override {
    std::vector<EntryView> out;
    out.reserve(manifest_.entries.size());
    for (const EntryRecord& e : manifest_.entries) out.emplace_back(e);
    return out;
  }
  std::optional<EntryView> FindEntry(const std::string& name) const override {
    const EntryRecord* e = Find(name);
    if (e == nullptr) return std::nullopt;
    return EntryView(*e);
  }
  const format::Manifest& manifest() const override { return manifest_; }
  const EntryRecord* Find(const std::string& name) const override {
    const int64_t e = index_.Find(name);
    return e < 0 ? nullptr : &manifest_.entries[e];
  }

  absl::StatusOr<LoadReport> Load(const std::vector<LoadRequest>& requests,
                                  const LoadOptions& options) override;

  absl::StatusOr<std::string> ReadObject(const std::string& name) override {
    std::string out;
    LoadRequest r;
    r.name = name;
    r.object = &out;
    LoadOptions o;
    o.allow_unrequested = true;
    CKPT_RETURN_IF_ERROR(Load({r}, o).status());
    return out;
  }

 private:
  absl::StatusOr<const OpenShard*> GetShard(uint32_t id);
  absl::StatusOr<std::unique_ptr<OpenShard>> OpenAndCheck(uint32_t id) const;
  absl::Status OpenShards(const std::vector<uint32_t>& ids, int threads);
  absl::Status CheckRequest(const LoadRequest& r, const LoadOptions& o,
                            const EntryRecord** e);
  absl::StatusOr<Prepared> Prepare(const std::vector<LoadRequest>& requests,
                                   const LoadOptions& options,
                                   LoadReport* report);
  absl::Status CheckChunkless(const Prepared& p, int threads);
  absl::StatusOr<internal::ReadPlan> Plan(const Prepared& p, int threads);
  absl::Status Execute(const internal::ReadPlan& plan, LoadRun* run,
                       int threads);
  // The pinned buffers of loads into device memory: made on first need and
  // kept for the Reader's lifetime.
  absl::StatusOr<internal::StagingPool*> UploadPool();

  Storage* storage_;
  std::string dir_;
  format::Manifest manifest_;
  ReaderOptions options_;
  internal::ManifestIndex index_;  // over manifest_
  CheckpointDescription description_;
  absl::flat_hash_map<uint32_t, const format::ShardInfo*> shard_info_;
  Mutex mu_;
  std::map<uint32_t, std::unique_ptr<OpenShard>> shards_ ABSL_GUARDED_BY(mu_);
  std::mutex pool_mu_;
  std::unique_ptr<internal::StagingPool> pool_;  // guarded by pool_mu_
};

// Opens shard `id` and checks it against the manifest (§5.6), stopping at
// the first problem: DataLoss naming the file (and the entry and chunk
// where one is concerned).
absl::StatusOr<std::unique_ptr<OpenShard>> ReaderImpl::OpenAndCheck(
    uint32_t id) const {
  const format::ShardInfo& info = *shard_info_.at(id);
  auto s = std::make_unique<OpenShard>();
  s->path = JoinPath(dir_, info.file_name);
  OpenOptions oo;
  oo.direct = options_.direct_io;
  auto file =
      internal::OpenShardFile(storage_, s->path, info, manifest_.info.id, oo);
  if (!file.ok()) return Annotate(file.status(), s->path);
  s->file = *std::move(file);
  const format::ShardIndex& index = s->file.index;
  CKPT_RETURN_IF_ERROR(
      Annotate(internal::CheckIndexInfo(index, manifest_), s->path));
  CKPT_RETURN_IF_ERROR(
      Annotate(internal::CheckIndexMetadata(index, manifest_), s->path));
  std::vector<internal::IndexProblem> problems;
  for (const internal::ChunkRef& r :
       internal::MatchIndexChunks(index_, id, index, &problems)) {
    s->indexed[ChunkKey(r.entry, r.chunk)] = r.indexed;
  }
  if (!problems.empty()) {
    const internal::IndexProblem& p = problems[0];
    const int64_t e = index_.Find(p.entry);
    std::string region =
        e >= 0 && p.chunk >= 0
            ? RegionToString(manifest_.entries[e].chunks[p.chunk].region)
            : "";
    return absl::DataLossError(absl::StrCat(
        internal::LocationText(s->path, p.entry, p.chunk, region, -1), ": ",
        p.message));
  }
  return s;
}

absl::StatusOr<const OpenShard*> ReaderImpl::GetShard(uint32_t id) {
  {
    MutexLock l(&mu_);
    auto it = shards_.find(id);
    if (it != shards_.end()) return it->second.get();
  }
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<OpenShard> shard, OpenAndCheck(id));
  MutexLock l(&mu_);
  auto [it, inserted] = shards_.emplace(id, std::move(shard));
  return it->second.get();
}

absl::Status ReaderImpl::OpenShards(const std::vector<uint32_t>& ids,
                                    int threads) {
  return internal::ParallelFor(threads, ids.size(), [&](int, size_t i) {
    return GetShard(ids[i]).status();
  });
}

absl::Status ReaderImpl::CheckRequest(const LoadRequest& r,
                                      const LoadOptions& o,
                                      const EntryRecord** out) {
  const EntryRecord* e = Find(r.name);
  if (e == nullptr) return internal::EntryNotInCheckpoint(r.name, dir_);
  if (o.filter && !o.filter(r.name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "entry '", r.name, "' is requested but excluded by the filter"));
  }
  *out = e;
  if (r.object != nullptr) {
    if (e->kind != format::EntryKind::kObject) {
      return absl::InvalidArgumentError(absl::StrCat(
          "entry '", r.name, "' is a tensor, requested as an object"));
    }
    return absl::OkStatus();
  }
  if (e->kind != format::EntryKind::kTensor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "entry '", r.name, "' is an object, requested as a tensor"));
  }
  if (e->dtype != r.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.name, ": dtype ", DTypeName(e->dtype),
                     " in checkpoint, ", DTypeName(r.dtype), " requested"));
  }
  if (e->shape != r.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.name, ": global shape ", ShapeToString(e->shape),
                     " in checkpoint, ", ShapeToString(r.shape), " requested"));
  }
  CKPT_RETURN_IF_ERROR(Annotate(ValidateRegion(r.region, r.shape), r.name));
  if (r.data == nullptr && RegionElements(r.region) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.name, ": destination is null"));
  }
  if (r.memory == MemoryKind::kCuda && options_.device_memory == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(r.name,
                     ": destination is CUDA memory but "
                     "ReaderOptions::device_memory is not set"));
  }
  return absl::OkStatus();
}

// Checks every request (CheckRequest), turns object requests into 1-d
// uint8 requests into their strings, and lists the entries not requested
// in `report` (FailedPrecondition when that is not allowed).
absl::StatusOr<Prepared> ReaderImpl::Prepare(
    const std::vector<LoadRequest>& requests, const LoadOptions& options,
    LoadReport* report) {
  Prepared p;
  p.reqs = requests;
  absl::flat_hash_set<std::string> requested;
  for (LoadRequest& r : p.reqs) {
    const EntryRecord* e;
    CKPT_RETURN_IF_ERROR(CheckRequest(r, options, &e));
    p.entry.push_back(static_cast<uint32_t>(e - manifest_.entries.data()));
    if (r.object != nullptr) {
      r.object->assign(e->shape[0], '\0');
      r.dtype = DType::kUInt8;
      r.shape = e->shape;
      r.region = FlatRange{0, e->shape[0]};
      r.data = r.object->data();
      r.memory = MemoryKind::kHost;
    }
    requested.insert(r.name);
  }
  std::vector<std::string> missing;
  for (const EntryRecord& e : manifest_.entries) {
    if (requested.contains(e.name)) continue;
    if (options.filter && !options.filter(e.name)) {
      report->not_loaded.emplace_back(e.name, "excluded by filter");
    } else if (options.allow_unrequested) {
      report->not_loaded.emplace_back(e.name, "not requested");
    } else {
      missing.push_back(e.name);
    }
  }
  if (!missing.empty()) {
    size_t shown = std::min<size_t>(missing.size(), 10);
    return absl::FailedPreconditionError(absl::StrCat(
        missing.size(), " entries in the checkpoint were not requested: ",
        absl::StrJoin(missing.begin(), missing.begin() + shown, ", "),
        missing.size() > shown ? ", ..." : "",
        " (set LoadOptions::filter to load a subset on purpose)"));
  }
  report->loaded.assign(requested.begin(), requested.end());
  return p;
}

// §5.7: a requested entry with no chunk in the manifest must be listed by
// some shard index; this opens every shard (only when there is such an
// entry). DataLoss naming the checkpoint and the entry.
absl::Status ReaderImpl::CheckChunkless(const Prepared& p, int threads) {
  auto no_chunks = [&](uint32_t e) {
    return manifest_.entries[e].chunks.empty();
  };
  if (std::none_of(p.entry.begin(), p.entry.end(), no_chunks)) {
    return absl::OkStatus();
  }
  std::vector<uint32_t> all;
  std::vector<const format::ShardIndex*> indexes;
  for (const format::ShardInfo& s : manifest_.shards) all.push_back(s.shard_id);
  CKPT_RETURN_IF_ERROR(OpenShards(all, threads));
  for (uint32_t id : all) indexes.push_back(&(*GetShard(id))->file.index);
  for (uint32_t e : internal::UnindexedChunklessEntries(manifest_, indexes)) {
    if (std::find(p.entry.begin(), p.entry.end(), e) == p.entry.end()) continue;
    return Annotate(
        internal::ChunklessEntryNotIndexed(),
        internal::LocationText(dir_, manifest_.entries[e].name, -1, "", -1));
  }
  return absl::OkStatus();
}

// Pairs the requests with the chunks (failing on an uncovered region before
// any I/O), opens the shards concerned and plans the block reads.
absl::StatusOr<internal::ReadPlan> ReaderImpl::Plan(const Prepared& p,
                                                    int threads) {
  std::vector<internal::PlanRequest> plan_reqs;
  for (size_t i = 0; i < p.reqs.size(); ++i) {
    plan_reqs.push_back(internal::PlanRequest{p.entry[i], p.reqs[i].region});
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<internal::ChunkPiece> pieces,
                        internal::PairRequests(manifest_, plan_reqs));
  CKPT_RETURN_IF_ERROR(
      OpenShards(internal::ShardsOf(manifest_, pieces), threads));
  CKPT_RETURN_IF_ERROR(CheckChunkless(p, threads));
  auto lookup = [&](uint32_t entry, uint32_t chunk) -> const ChunkRecord* {
    const uint32_t shard = manifest_.entries[entry].chunks[chunk].shard;
    const OpenShard* s = *GetShard(shard);  // opened above
    return s->indexed.at(ChunkKey(entry, chunk));
  };
  return internal::PlanBlockReads(manifest_, pieces, lookup, kTaskBytes);
}

// Runs every read of `plan` on `threads` threads; the first error stops
// the load.
absl::Status ReaderImpl::Execute(const internal::ReadPlan& plan, LoadRun* run,
                                 int threads) {
  struct Task {
    const OpenShard* shard;
    const BlockRead* read;
  };
  std::vector<Task> tasks;
  for (const internal::ShardReads& sr : plan.shards) {
    CKPT_ASSIGN_OR_RETURN(const OpenShard* shard, GetShard(sr.shard));
    for (const BlockRead& r : sr.reads) tasks.push_back(Task{shard, &r});
  }
  run->CompleteEmpty();
  return internal::ParallelFor(threads, tasks.size(), [&](int t, size_t i) {
    const Task& task = tasks[i];
    return run->Run(t, *task.shard, manifest_.entries[task.read->entry],
                    *task.read);
  });
}

absl::StatusOr<internal::StagingPool*> ReaderImpl::UploadPool() {
  std::lock_guard<std::mutex> l(pool_mu_);
  if (pool_ == nullptr) {
    // Two buffers per I/O thread; 64 threads' worth at most, allocated only
    // as threads need them.
    const uint64_t buffer = std::max(kGranuleBytes, format::kDefaultBlockSize);
    CKPT_ASSIGN_OR_RETURN(
        pool_, internal::StagingPool::Create(options_.device_memory, buffer,
                                             128 * buffer));
  }
  return pool_.get();
}

absl::StatusOr<LoadReport> ReaderImpl::Load(
    const std::vector<LoadRequest>& requests, const LoadOptions& options) {
  LoadReport report;
  CKPT_ASSIGN_OR_RETURN(Prepared p, Prepare(requests, options, &report));
  const int threads = std::max(
      1, internal::EffectiveIoThreads(
             options.io_threads > 0 ? options.io_threads : options_.io_threads,
             options_.direct_io));
  CKPT_ASSIGN_OR_RETURN(internal::ReadPlan plan, Plan(p, threads));
  internal::StagingPool* pool = nullptr;
  if (std::any_of(p.reqs.begin(), p.reqs.end(), [](const LoadRequest& r) {
        return r.memory == MemoryKind::kCuda;
      })) {
    CKPT_ASSIGN_OR_RETURN(pool, UploadPool());
  }
  LoadRun run(p, options_.device_memory, pool, options.device_ready, threads);
  CKPT_RETURN_IF_ERROR(Execute(plan, &run, threads));
  CKPT_RETURN_IF_ERROR(run.CheckAllWritten());
  for (const LoadRequest& r : p.reqs) {
    report.bytes_loaded += RegionElements(r.region) * DTypeSize(r.dtype);
  }
  report.bytes_read = run.bytes_read();
  report.blocks_verified = run.blocks_verified();
  std::sort(report.loaded.begin(), report.loaded.end());
  std::sort(report.not_loaded.begin(), report.not_loaded.end());
  return report;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Reader>> Reader::Open(
    const std::string& path, const ReaderOptions& options) {
  Storage* storage = options.storage ? options.storage : DefaultStorage();
  CKPT_ASSIGN_OR_RETURN(std::string dir,
                        internal::ResolveCheckpointDir(storage, path));
  CKPT_ASSIGN_OR_RETURN(format::Manifest m,
                        internal::ReadManifest(storage, dir));
  CKPT_RETURN_IF_ERROR(Annotate(format::ValidateCoverage(m),
                                JoinPath(dir, format::kManifestFileName)));
  return std::unique_ptr<Reader>(
      new ReaderImpl(storage, std::move(dir), std::move(m), options));
}

}  // namespace ckpt

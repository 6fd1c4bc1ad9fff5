#include "ckpt/reader.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "format/block_codec.h"
#include "format/checksum.h"
#include "format/manifest.h"
#include "format/shard.h"
#include "format/status_macros.h"
#include "libckpt/commit.h"
#include "libckpt/device_upload.h"
#include "libckpt/staging_pool.h"
#include "libckpt/thread_pool.h"

namespace ckpt {
namespace {

using format::ChunkRecord;
using format::EntryRecord;

constexpr uint64_t kTaskBytes = 8ull << 20;     // unit of work per thread
constexpr uint64_t kGranuleBytes = 1ull << 20;  // read-then-verify granule

// A shard file opened for reading, with its verified index.
struct OpenShard {
  std::unique_ptr<File> file;
  std::string name;
  format::ShardIndex index;
  // entry name -> index entry
  absl::flat_hash_map<std::string, const EntryRecord*> entries;
};

struct Run {
  uint64_t src, dst, bytes;  // byte offsets in chunk-local / destination layout
};

// One (request, stored chunk) pair with a non-empty intersection.
struct Pair {
  size_t request;
  const EntryRecord* entry;
  const ChunkRecord* chunk;        // manifest record
  const ChunkRecord* blocks = nullptr;  // shard index record (with blocks)
  const OpenShard* shard = nullptr;
  std::vector<Run> runs;           // sorted by src
};

// All pairs reading one stored chunk: its blocks are read once per Load,
// however many destinations they feed.
struct ChunkGroup {
  const EntryRecord* entry;
  const ChunkRecord* blocks;  // shard index record
  const OpenShard* shard;
  std::vector<uint64_t> stored_offset;  // prefix sums of stored block sizes
  std::vector<Pair*> pairs;
};

struct Task {
  ChunkGroup* group;
  uint64_t b0, b1;  // block range
};

class ReaderImpl final : public Reader {
 public:
  ReaderImpl(Storage* storage, std::string dir, format::Manifest m, const ReaderOptions& o)
      : storage_(storage), dir_(std::move(dir)), manifest_(std::move(m)), options_(o) {
    for (size_t i = 0; i < manifest_.entries.size(); ++i) {
      by_name_[manifest_.entries[i].name] = i;
    }
    for (const auto& s : manifest_.shards) shard_info_[s.shard_id] = &s;
  }

  const std::string& path() const override { return dir_; }
  const format::Manifest& manifest() const override { return manifest_; }
  const EntryRecord* Find(const std::string& name) const override {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &manifest_.entries[it->second];
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
  // The pinned buffers of loads into device memory: made on first need and
  // kept for the Reader's lifetime.
  absl::StatusOr<internal::StagingPool*> UploadPool();
  absl::Status CheckRequest(const LoadRequest& r, const LoadOptions& o, const EntryRecord** e);

  Storage* storage_;
  std::string dir_;
  format::Manifest manifest_;
  ReaderOptions options_;
  absl::flat_hash_map<std::string, size_t> by_name_;
  absl::flat_hash_map<uint32_t, const format::ShardInfo*> shard_info_;
  std::mutex pool_mu_;
  std::unique_ptr<internal::StagingPool> pool_;
  // std::mutex rather than absl::Mutex so that ThreadSanitizer sees the
  // synchronization (Debian's Abseil is not TSan-instrumented).
  std::mutex mu_;
  std::map<uint32_t, std::unique_ptr<OpenShard>> shards_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<const OpenShard*> ReaderImpl::GetShard(uint32_t id) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = shards_.find(id);
    if (it != shards_.end()) return it->second.get();
  }
  const format::ShardInfo& info = *shard_info_.at(id);
  auto shard = std::make_unique<OpenShard>();
  shard->name = JoinPath(dir_, info.file_name);
  auto fail = [&](const absl::Status& s) { return Annotate(s, shard->name); };
  OpenOptions oo;
  oo.direct = options_.direct_io;
  auto file = storage_->Open(shard->name, OpenMode::kRead, oo);
  if (!file.ok()) {
    if (absl::IsNotFound(file.status())) {
      return absl::DataLossError(absl::StrCat(shard->name, ": shard file is missing"));
    }
    return file.status();
  }
  shard->file = *std::move(file);
  CKPT_ASSIGN_OR_RETURN(uint64_t size, shard->file->Size());
  if (size != info.file_size) {
    return fail(absl::DataLossError(absl::StrCat("file is ", size, " bytes, the manifest says ",
                                                 info.file_size)));
  }
  std::string head(format::kShardHeaderSize, '\0');
  CKPT_ASSIGN_OR_RETURN(size_t n, shard->file->PRead(0, head.size(), head.data()));
  head.resize(n);
  auto header = format::DecodeShardHeader(head);
  if (!header.ok()) return fail(header.status());
  if (header->checkpoint_id != manifest_.info.id) {
    return fail(absl::DataLossError(absl::StrCat(
        "checkpoint id ", format::IdToHex(header->checkpoint_id), " != manifest's ",
        format::IdToHex(manifest_.info.id), ": this shard belongs to another checkpoint")));
  }
  if (header->shard_id != id) {
    return fail(absl::DataLossError(
        absl::StrCat("shard id ", header->shard_id, " != ", id, " in the manifest")));
  }
  std::string tail_bytes(format::kShardTailSize, '\0');
  CKPT_ASSIGN_OR_RETURN(n, shard->file->PRead(size - format::kShardTailSize,
                                              tail_bytes.size(), tail_bytes.data()));
  tail_bytes.resize(n);
  auto tail = format::DecodeShardTail(tail_bytes, size);
  if (!tail.ok()) return fail(tail.status());
  std::string index(tail->index_length, '\0');
  CKPT_ASSIGN_OR_RETURN(n, shard->file->PRead(tail->index_offset, index.size(), index.data()));
  index.resize(n);
  auto idx = format::DecodeShardIndex(index, *header, *tail);
  if (!idx.ok()) return fail(idx.status());
  if (!(idx->info == manifest_.info)) {
    // §7.1: the same CHECKPOINT_INFO in the manifest and every index.
    return fail(absl::DataLossError(
        "CHECKPOINT_INFO of the shard index differs from the manifest's"));
  }
  shard->index = *std::move(idx);
  for (const EntryRecord& e : shard->index.entries) shard->entries[e.name] = &e;
  std::lock_guard<std::mutex> l(mu_);
  auto [it, inserted] = shards_.emplace(id, std::move(shard));
  return it->second.get();
}

absl::Status ReaderImpl::CheckRequest(const LoadRequest& r, const LoadOptions& o,
                                      const EntryRecord** out) {
  const EntryRecord* e = Find(r.name);
  if (e == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("entry '", r.name, "' is not in the checkpoint ", dir_));
  }
  if (o.filter && !o.filter(r.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("entry '", r.name, "' is requested but excluded by the filter"));
  }
  *out = e;
  if (r.object != nullptr) {
    if (e->kind != format::EntryKind::kObject) {
      return absl::InvalidArgumentError(
          absl::StrCat("entry '", r.name, "' is a tensor, requested as an object"));
    }
    return absl::OkStatus();
  }
  if (e->kind != format::EntryKind::kTensor) {
    return absl::InvalidArgumentError(
        absl::StrCat("entry '", r.name, "' is an object, requested as a tensor"));
  }
  if (e->dtype != r.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(r.name, ": dtype ", DTypeName(e->dtype),
                                                   " in checkpoint, ", DTypeName(r.dtype),
                                                   " requested"));
  }
  if (e->shape != r.shape) {
    return absl::InvalidArgumentError(absl::StrCat(r.name, ": global shape ",
                                                   ShapeToString(e->shape), " in checkpoint, ",
                                                   ShapeToString(r.shape), " requested"));
  }
  CKPT_RETURN_IF_ERROR(Annotate(ValidateRegion(r.region, r.shape), r.name));
  if (r.data == nullptr && RegionElements(r.region) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(r.name, ": destination is null"));
  }
  if (r.memory == MemoryKind::kCuda && options_.device_memory == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        r.name, ": destination is CUDA memory but ReaderOptions::device_memory is not set"));
  }
  return absl::OkStatus();
}

absl::StatusOr<internal::StagingPool*> ReaderImpl::UploadPool() {
  std::lock_guard<std::mutex> l(pool_mu_);
  if (pool_ == nullptr) {
    // Two buffers per I/O thread; 64 threads' worth at most, allocated only
    // as threads need them.
    const uint64_t buffer = std::max(kGranuleBytes, format::kDefaultBlockSize);
    CKPT_ASSIGN_OR_RETURN(pool_, internal::StagingPool::Create(options_.device_memory, buffer,
                                                                128 * buffer));
  }
  return pool_.get();
}

absl::StatusOr<LoadReport> ReaderImpl::Load(const std::vector<LoadRequest>& requests,
                                            const LoadOptions& options) {
  LoadReport report;
  // Objects are loaded as 1-d uint8 tensors into their strings.
  std::vector<LoadRequest> reqs = requests;
  std::vector<const EntryRecord*> entries(reqs.size());
  absl::flat_hash_set<std::string> requested;
  for (size_t i = 0; i < reqs.size(); ++i) {
    CKPT_RETURN_IF_ERROR(CheckRequest(reqs[i], options, &entries[i]));
    if (reqs[i].object != nullptr) {
      reqs[i].object->assign(entries[i]->shape[0], '\0');
      reqs[i].dtype = DType::kUInt8;
      reqs[i].shape = entries[i]->shape;
      reqs[i].region = FlatRange{0, entries[i]->shape[0]};
      reqs[i].data = reqs[i].object->data();
      reqs[i].memory = MemoryKind::kHost;
    }
    requested.insert(reqs[i].name);
  }
  std::vector<std::string> missing;
  for (const EntryRecord& e : manifest_.entries) {
    if (requested.contains(e.name)) continue;
    if (options.filter && !options.filter(e.name)) {
      report.not_loaded.emplace_back(e.name, "excluded by filter");
    } else if (options.allow_unrequested) {
      report.not_loaded.emplace_back(e.name, "not requested");
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

  // Pair every request with the stored chunks it intersects.
  std::vector<Pair> pairs;
  std::vector<std::atomic<uint64_t>> remaining(reqs.size());
  std::set<uint32_t> needed_shards;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const LoadRequest& r = reqs[i];
    const EntryRecord* e = entries[i];
    const uint64_t es = DTypeSize(e->dtype);
    uint64_t covered = 0;
    const uint64_t want = RegionElements(r.region);
    remaining[i] = want * es;
    if (want == 0) continue;
    for (const ChunkRecord& c : e->chunks) {
      Pair p;
      p.request = i;
      p.entry = e;
      p.chunk = &c;
      uint64_t n = ForEachRun(e->shape, c.region, r.region, [&](uint64_t s, uint64_t d, uint64_t k) {
        p.runs.push_back(Run{s * es, d * es, k * es});
      });
      if (n == 0) continue;
      covered += n;
      needed_shards.insert(c.shard);
      pairs.push_back(std::move(p));
    }
    if (covered != want) {
      return absl::DataLossError(absl::StrCat(
          "entry '", r.name, "': requested region ", RegionToString(r.region),
          " is not covered by the checkpoint: ", want - covered, " of ", want,
          " elements missing"));
    }
  }

  // Open the shards needed, verifying their headers and indexes.
  std::vector<uint32_t> shard_ids(needed_shards.begin(), needed_shards.end());
  const int threads = internal::EffectiveIoThreads(
      options.io_threads > 0 ? options.io_threads : options_.io_threads, options_.direct_io);
  CKPT_RETURN_IF_ERROR(internal::ParallelFor(threads, shard_ids.size(), [&](int, size_t i) {
    return GetShard(shard_ids[i]).status();
  }));

  std::vector<ChunkGroup> groups;
  absl::flat_hash_map<const ChunkRecord*, size_t> group_of;
  for (Pair& p : pairs) {
    CKPT_ASSIGN_OR_RETURN(p.shard, GetShard(p.chunk->shard));
    auto it = p.shard->entries.find(p.entry->name);
    if (it != p.shard->entries.end()) {
      for (const ChunkRecord& c : it->second->chunks) {
        if (c.data_offset == p.chunk->data_offset && c.region == p.chunk->region) p.blocks = &c;
      }
    }
    if (p.blocks == nullptr || p.blocks->stored_length != p.chunk->stored_length ||
        p.blocks->codec != p.chunk->codec || p.blocks->block_size != p.chunk->block_size) {
      return absl::DataLossError(absl::StrCat(
          p.shard->name, ": entry '", p.entry->name, "': chunk ",
          RegionToString(p.chunk->region), " at offset ", p.chunk->data_offset,
          " is not in the shard index as the manifest describes it"));
    }
    auto [git, inserted] = group_of.try_emplace(p.blocks, groups.size());
    if (inserted) {
      ChunkGroup g;
      g.entry = p.entry;
      g.blocks = p.blocks;
      g.shard = p.shard;
      g.stored_offset.resize(p.blocks->blocks.size() + 1);
      g.stored_offset[0] = p.blocks->data_offset;
      for (size_t b = 0; b < p.blocks->blocks.size(); ++b) {
        g.stored_offset[b + 1] = g.stored_offset[b] + p.blocks->blocks[b].stored_size;
      }
      groups.push_back(std::move(g));
    }
    groups[git->second].pairs.push_back(&p);
  }
  // Blocks touched by any pair of a group, merged into contiguous spans and
  // cut into tasks of about kTaskBytes.
  std::vector<Task> tasks;
  for (ChunkGroup& g : groups) {
    const uint64_t bs = g.blocks->block_size;
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (const Pair* p : g.pairs) {
      for (const Run& run : p->runs) {
        uint64_t b0 = run.src / bs, b1 = (run.src + run.bytes + bs - 1) / bs;
        if (!spans.empty() && spans.back().first <= b0 && b0 <= spans.back().second) {
          spans.back().second = std::max(spans.back().second, b1);
        } else {
          spans.emplace_back(b0, b1);
        }
      }
    }
    std::sort(spans.begin(), spans.end());
    const uint64_t per_task = std::max<uint64_t>(1, kTaskBytes / bs);
    uint64_t cb = 0, ce = 0;
    bool open = false;
    auto flush = [&]() {
      for (uint64_t b = cb; b < ce; b += per_task) {
        tasks.push_back(Task{&g, b, std::min(ce, b + per_task)});
      }
    };
    for (const auto& [b0, b1] : spans) {
      if (open && b0 <= ce) {
        ce = std::max(ce, b1);
      } else {
        if (open) flush();
        cb = b0;
        ce = b1;
        open = true;
      }
    }
    if (open) flush();
  }

  // Requests with nothing to load are complete now.
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (remaining[i] == 0 && reqs[i].on_complete) reqs[i].on_complete();
  }

  struct Scratch {
    std::string stored, raw;
    format::BlockDecoder decoder;
    std::unique_ptr<internal::DeviceUploader> uploader;  // device destinations
  };
  std::vector<Scratch> scratch(std::max(1, threads));
  std::atomic<uint64_t> bytes_read{0}, blocks_verified{0};
  DeviceMemory* dm = options_.device_memory;
  auto finish = [&](size_t request, uint64_t bytes) {
    if (bytes != 0 && (remaining[request] -= bytes) == 0 && reqs[request].on_complete) {
      reqs[request].on_complete();
    }
  };
  internal::StagingPool* upload_pool = nullptr;
  if (std::any_of(reqs.begin(), reqs.end(),
                  [](const LoadRequest& r) { return r.memory == MemoryKind::kCuda; })) {
    CKPT_ASSIGN_OR_RETURN(upload_pool, UploadPool());
    for (Scratch& s : scratch) {
      s.uploader = std::make_unique<internal::DeviceUploader>(upload_pool, dm,
                                                              options.device_ready, finish);
    }
  }
  CKPT_RETURN_IF_ERROR(internal::ParallelFor(threads, tasks.size(), [&](int t, size_t ti) -> absl::Status {
    const Task& task = tasks[ti];
    const ChunkGroup& g = *task.group;
    const ChunkRecord& c = *g.blocks;
    const uint64_t bs = c.block_size;
    const uint64_t raw_total = RegionElements(c.region) * DTypeSize(g.entry->dtype);
    const uint64_t lo = task.b0 * bs, hi = std::min(task.b1 * bs, raw_total);
    const uint64_t off0 = g.stored_offset[task.b0];
    auto where = [&](uint64_t b) {
      return absl::StrCat(g.shard->name, ": block ", b, " of chunk ",
                          RegionToString(c.region), " of '", g.entry->name, "'");
    };
    auto first_run = [&](const Pair& p) {
      return std::partition_point(p.runs.begin(), p.runs.end(),
                                  [&](const Run& x) { return x.src + x.bytes <= lo; });
    };
    // Fast path: uncompressed, one destination, one run covering the task:
    // read straight into the destination, a granule at a time, and verify
    // each granule while it is still in cache.
    if (g.pairs.size() == 1 && c.codec == format::Codec::kNone &&
        reqs[g.pairs[0]->request].memory == MemoryKind::kHost) {
      const Pair& p = *g.pairs[0];
      auto first = first_run(p);
      if (first != p.runs.end() && first->src <= lo && first->src + first->bytes >= hi) {
        char* out = static_cast<char*>(reqs[p.request].data) + first->dst + (lo - first->src);
        const uint64_t granule = std::max<uint64_t>(1, kGranuleBytes / bs) * bs;
        for (uint64_t a = lo; a < hi; a += granule) {
          uint64_t n = std::min(granule, hi - a);
          CKPT_ASSIGN_OR_RETURN(size_t got, g.shard->file->PRead(off0 + (a - lo), n, out + (a - lo)));
          if (got != n) return absl::DataLossError(absl::StrCat(where(a / bs), ": file ends early"));
          for (uint64_t b = a / bs; b * bs < a + n; ++b) {
            uint64_t len = c.blocks[b].stored_size;
            uint64_t sum = format::Checksum(out + (b * bs - lo), len);
            if (sum != c.blocks[b].checksum) {
              return Annotate(format::ChecksumMismatch(c.blocks[b].checksum, sum), where(b));
            }
          }
        }
        bytes_read += hi - lo;
        blocks_verified += task.b1 - task.b0;
        finish(p.request, hi - lo);
        return absl::OkStatus();
      }
    }
    // General path, a granule of blocks at a time so that the bytes stay in
    // cache from read through verification to the copies out. With device
    // destinations the granule goes through a pinned buffer of the thread's
    // uploader, and its copies to the device run while the next is read.
    Scratch& s = scratch[t];
    const bool to_device = s.uploader != nullptr &&
                           std::any_of(g.pairs.begin(), g.pairs.end(), [&](const Pair* p) {
                             return reqs[p->request].memory == MemoryKind::kCuda;
                           });
    const uint64_t per_granule = std::max<uint64_t>(1, kGranuleBytes / bs);
    for (uint64_t gb0 = task.b0; gb0 < task.b1; gb0 += per_granule) {
      const uint64_t gb1 = std::min(task.b1, gb0 + per_granule);
      const uint64_t glo = gb0 * bs, ghi = std::min(gb1 * bs, raw_total);
      const uint64_t goff0 = g.stored_offset[gb0], goff1 = g.stored_offset[gb1];
      char* pinned = nullptr;
      if (to_device) {
        CKPT_ASSIGN_OR_RETURN(pinned, s.uploader->Next(std::max(ghi - glo, goff1 - goff0)));
      }
      char* stored = s.stored.data();
      if (pinned != nullptr && c.codec == format::Codec::kNone) {
        stored = pinned;
      } else {
        s.stored.resize(goff1 - goff0);
        stored = s.stored.data();
      }
      CKPT_ASSIGN_OR_RETURN(size_t n, g.shard->file->PRead(goff0, goff1 - goff0, stored));
      if (n != goff1 - goff0) {
        return absl::DataLossError(absl::StrCat(where(gb0), ": file ends early"));
      }
      const char* raw;
      if (c.codec == format::Codec::kNone) {
        for (uint64_t b = gb0; b < gb1; ++b) {
          const char* blk = stored + (g.stored_offset[b] - goff0);
          uint64_t sum = format::Checksum(blk, c.blocks[b].stored_size);
          if (sum != c.blocks[b].checksum) {
            return Annotate(format::ChecksumMismatch(c.blocks[b].checksum, sum), where(b));
          }
        }
        raw = stored;
      } else {
        char* out = pinned;
        if (out == nullptr) {
          s.raw.resize(ghi - glo);
          out = s.raw.data();
        }
        for (uint64_t b = gb0; b < gb1; ++b) {
          uint64_t braw = std::min(bs, raw_total - b * bs);
          absl::Status st = s.decoder.Decode(
              c.codec,
              absl::string_view(stored + (g.stored_offset[b] - goff0), c.blocks[b].stored_size),
              c.blocks[b].checksum, braw, out + (b - gb0) * bs);
          if (!st.ok()) return Annotate(st, where(b));
        }
        raw = out;
      }
      bytes_read += goff1 - goff0;
      blocks_verified += gb1 - gb0;
      for (const Pair* p : g.pairs) {
        const LoadRequest& r = reqs[p->request];
        char* dst = static_cast<char*>(r.data);
        uint64_t copied = 0;
        std::vector<internal::CopyRun> device_runs;
        auto it = std::partition_point(p->runs.begin(), p->runs.end(),
                                       [&](const Run& x) { return x.src + x.bytes <= glo; });
        for (; it != p->runs.end() && it->src < ghi; ++it) {
          uint64_t a = std::max(glo, it->src), z = std::min(ghi, it->src + it->bytes);
          char* out = dst + it->dst + (a - it->src);
          if (r.memory == MemoryKind::kHost) {
            std::memcpy(out, raw + (a - glo), z - a);
          } else if (pinned != nullptr) {
            device_runs.push_back({a - glo, it->dst + (a - it->src), z - a});
          } else {
            CKPT_RETURN_IF_ERROR(dm->CopyFromHost(out, raw + (a - glo), z - a, r.device));
          }
          copied += z - a;
        }
        if (device_runs.empty()) {
          finish(p->request, copied);
        } else {
          CKPT_RETURN_IF_ERROR(s.uploader->Copy(
              r.device, internal::CoalesceRuns(device_runs, raw, dst), p->request, copied));
        }
      }
      if (pinned != nullptr) CKPT_RETURN_IF_ERROR(s.uploader->Submit());
    }
    if (to_device) CKPT_RETURN_IF_ERROR(s.uploader->Drain());
    return absl::OkStatus();
  }));

  for (size_t i = 0; i < reqs.size(); ++i) {
    if (remaining[i] != 0) {
      return absl::InternalError(absl::StrCat("entry '", reqs[i].name, "': ", remaining[i].load(),
                                              " bytes were not loaded"));
    }
    report.bytes_loaded += RegionElements(reqs[i].region) * DTypeSize(reqs[i].dtype);
  }
  report.bytes_read = bytes_read;
  report.blocks_verified = blocks_verified;
  report.loaded.assign(requested.begin(), requested.end());
  std::sort(report.loaded.begin(), report.loaded.end());
  std::sort(report.not_loaded.begin(), report.not_loaded.end());
  return report;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Reader>> Reader::Open(const std::string& path,
                                                     const ReaderOptions& options) {
  Storage* storage = options.storage ? options.storage : DefaultStorage();
  CKPT_ASSIGN_OR_RETURN(std::string dir, internal::ResolveCheckpointDir(storage, path));
  const std::string mpath = JoinPath(dir, format::kManifestFileName);
  CKPT_ASSIGN_OR_RETURN(std::string bytes, storage->ReadFile(mpath));
  auto m = format::DecodeManifest(bytes);
  if (!m.ok()) return Annotate(m.status(), mpath);
  CKPT_RETURN_IF_ERROR(Annotate(format::ValidateCoverage(*m), mpath));
  return std::unique_ptr<Reader>(new ReaderImpl(storage, std::move(dir), *std::move(m), options));
}

}  // namespace ckpt

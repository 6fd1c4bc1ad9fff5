#include "ckpt/reader.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/format/block_codec.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "load/coop/cooperative_load.h"
#include "load/reader_impl.h"
#include "read/index_check.h"
#include "read/read_executor.h"
#include "read/read_plan.h"
#include "read/shard_file.h"
#include "staging/staging_pool.h"
#include "storage/checkpoint_dir.h"
#include "util/mutex.h"
#include "util/parallel_for.h"
#include "util/rank_status.h"

namespace ckpt {
namespace internal {

using format::ChunkRecord;

absl::Status ReaderImpl::CheckRequest(const LoadRequest& r,
                                      const LoadOptions& o,
                                      const EntryRecord** out) {
  const EntryRecord* e = Find(r.name);
  if (e == nullptr) return internal::EntryNotInCheckpoint(r.name, dir_);
  if (o.filter && !o.filter(r.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("entry '", format::EscapeText(r.name),
                     "' is requested but excluded by the filter"));
  }
  *out = e;
  if (r.object != nullptr) {
    if (e->kind != format::EntryKind::kObject) {
      return absl::InvalidArgumentError(
          absl::StrCat("entry '", format::EscapeText(r.name),
                       "' is a tensor, requested as an object"));
    }
    return absl::OkStatus();
  }
  if (e->kind != format::EntryKind::kTensor) {
    return absl::InvalidArgumentError(
        absl::StrCat("entry '", format::EscapeText(r.name),
                     "' is an object, requested as a tensor"));
  }
  if (e->dtype != r.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        format::EscapeText(r.name), ": dtype ", DTypeName(e->dtype),
        " in checkpoint, ", DTypeName(r.dtype), " requested"));
  }
  if (e->shape != r.shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        format::EscapeText(r.name), ": global shape ", ShapeToString(e->shape),
        " in checkpoint, ", ShapeToString(r.shape), " requested"));
  }
  CKPT_RETURN_IF_ERROR(
      Annotate(ValidateRegion(r.region, r.shape), format::EscapeText(r.name)));
  if (r.data == nullptr && RegionElements(r.region) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(format::EscapeText(r.name), ": destination is null"));
  }
  if (r.memory == MemoryKind::kCuda && options_.device_memory == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(format::EscapeText(r.name),
                     ": destination is CUDA memory but "
                     "ReaderOptions::device_memory is not set"));
  }
  return absl::OkStatus();
}

std::vector<uint32_t> NameOrder(const format::Manifest& m) {
  std::vector<uint32_t> order(m.entries.size());
  std::iota(order.begin(), order.end(), 0);
  auto by_name = [&](uint32_t a, uint32_t b) {
    return m.entries[a].name < m.entries[b].name;
  };
  if (!std::is_sorted(order.begin(), order.end(), by_name)) {
    std::sort(order.begin(), order.end(), by_name);
  }
  return order;
}

// Checks every request (CheckRequest), turns object requests into 1-d
// uint8 requests into their strings, and lists the entries not requested
// in `report` (FailedPrecondition when that is not allowed). With
// `borrow` and no object request, the result refers to `requests` instead
// of copying them.
absl::StatusOr<Prepared> ReaderImpl::Prepare(
    const std::vector<LoadRequest>& requests, const LoadOptions& options,
    LoadReport* report, bool borrow) {
  Prepared p;
  p.entry.reserve(requests.size());
  bool objects = false;
  for (const LoadRequest& r : requests) {
    const EntryRecord* e = nullptr;
    CKPT_RETURN_IF_ERROR(CheckRequest(r, options, &e));
    p.entry.push_back(static_cast<uint32_t>(e - manifest_.entries.data()));
    objects |= r.object != nullptr;
  }
  if (borrow && !objects) {
    p.borrowed = &requests;
  } else {
    p.reqs = requests;
    ObjectsAsBytes(&p);
  }
  // The entries requested, each once (an entry may be requested in several
  // regions): their indexes, 4 bytes a request rather than a set of names.
  std::vector<uint32_t> requested = p.entry;
  std::sort(requested.begin(), requested.end());
  requested.erase(std::unique(requested.begin(), requested.end()),
                  requested.end());
  report->loaded.reserve(requested.size());
  for (uint32_t i : requested) {
    report->loaded.push_back(manifest_.entries[i].name);
  }
  // Nothing to check or to list: CheckUnrequested would cost one pass over
  // the checkpoint's entries per Load, quadratic for a caller that loads
  // entry by entry (ckpt-diff, the exports).
  if (options.allow_unrequested && !options.report_not_loaded) return p;
  CKPT_RETURN_IF_ERROR(CheckUnrequested(std::move(requested), options, report));
  return p;
}

// Turns the object requests of p->reqs into 1-d uint8 requests into their
// strings (sized to the object).
void ReaderImpl::ObjectsAsBytes(Prepared* p) const {
  for (size_t i = 0; i < p->reqs.size(); ++i) {
    LoadRequest& r = p->reqs[i];
    if (r.object == nullptr) continue;
    const EntryRecord& e = manifest_.entries[p->entry[i]];
    r.object->assign(e.shape[0], '\0');
    r.dtype = DType::kUInt8;
    r.shape = e.shape;
    r.region = FlatRange{0, e.shape[0]};
    r.data = r.object->data();
    r.memory = MemoryKind::kHost;
  }
}

// The entries of the checkpoint outside `requested` (sorted indexes):
// listed in report->not_loaded with the reason when options ask for it;
// FailedPrecondition naming them when neither the filter nor
// allow_unrequested lets them be left out.
absl::Status ReaderImpl::CheckUnrequested(std::vector<uint32_t> requested,
                                          const LoadOptions& options,
                                          LoadReport* report) const {
  std::vector<bool> is_requested(manifest_.entries.size());
  for (uint32_t i : requested) is_requested[i] = true;
  std::vector<uint32_t>().swap(requested);
  std::vector<std::string> missing;
  for (uint32_t i : name_order_) {
    const EntryRecord& e = manifest_.entries[i];
    if (is_requested[i]) continue;
    const char* why = nullptr;
    if (options.filter && !options.filter(e.name)) {
      why = "excluded by filter";
    } else if (options.allow_unrequested) {
      why = "not requested";
    } else {
      missing.push_back(e.name);
    }
    if (why != nullptr && options.report_not_loaded) {
      report->not_loaded.emplace_back(e.name, why);
    }
  }
  if (missing.empty()) return absl::OkStatus();
  size_t shown = std::min<size_t>(missing.size(), 10);
  return absl::FailedPreconditionError(absl::StrCat(
      missing.size(), " entries in the checkpoint were not requested: ",
      absl::StrJoin(missing.begin(), missing.begin() + shown, ", "),
      missing.size() > shown ? ", ..." : "",
      " (set LoadOptions::filter to load a subset on purpose)"));
}

// Pairs the requests with the chunks (failing on an uncovered region before
// any I/O), opens the shards concerned and plans the block reads.
absl::StatusOr<internal::ReadPlan> ReaderImpl::Plan(const Prepared& p,
                                                    int threads) {
  const std::vector<LoadRequest>& reqs = p.all();
  absl::StatusOr<std::vector<internal::ChunkPiece>> paired;
  {
    std::vector<internal::PlanRequest> plan_reqs;  // freed once paired
    plan_reqs.reserve(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      plan_reqs.push_back(internal::PlanRequest{p.entry[i], reqs[i].region});
    }
    paired = internal::PairRequests(manifest_, plan_reqs);
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<internal::ChunkPiece> pieces,
                        std::move(paired));
  CKPT_RETURN_IF_ERROR(
      shards_.Open(internal::ShardsOf(manifest_, pieces), threads));
  CKPT_RETURN_IF_ERROR(shards_.CheckChunkless(p.entry, threads));
  auto lookup = [&](uint32_t entry, uint32_t chunk) -> const ChunkRecord* {
    const uint32_t shard = manifest_.entries[entry].chunks[chunk].shard;
    const OpenShard* s = *shards_.Get(shard);  // opened above
    return s->indexed.at(ChunkKey(entry, chunk));
  };
  return internal::PlanBlockReads(manifest_, pieces, lookup, kTaskBytes);
}

// Runs every read of `plan` on `threads` threads; the first error stops
// the load.
absl::Status ReaderImpl::Execute(const internal::ReadPlan& plan,
                                 ReadExecutor* run, int threads) {
  struct Task {
    uint32_t id;
    const OpenShard* shard;
    const BlockRead* read;
  };
  std::vector<Task> tasks;
  size_t n = 0;
  for (const internal::ShardReads& sr : plan.shards) n += sr.reads.size();
  tasks.reserve(n);
  for (const internal::ShardReads& sr : plan.shards) {
    CKPT_ASSIGN_OR_RETURN(const OpenShard* shard, shards_.Get(sr.shard));
    for (const BlockRead& r : sr.reads)
      tasks.push_back(Task{sr.shard, shard, &r});
  }
  run->CompleteEmpty();
  return internal::ParallelFor(threads, tasks.size(), [&](int t, size_t i) {
    const Task& task = tasks[i];
    CKPT_ASSIGN_OR_RETURN(ShardHandles::Lease file,
                          shards_.GetForReading(task.id));
    return run->Run(t, *task.shard, file.file(),
                    manifest_.entries[task.read->entry], *task.read);
  });
}

absl::StatusOr<internal::StagingPool*> ReaderImpl::UploadPool() {
  MutexLock l(&pool_mu_);
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

int ReaderImpl::IoThreads(const LoadOptions& options) const {
  return std::max(
      1, internal::EffectiveIoThreads(
             options.io_threads > 0 ? options.io_threads : options_.io_threads,
             options_.direct_io));
}

absl::StatusOr<LoadReport> ReaderImpl::Load(
    const std::vector<LoadRequest>& requests, const LoadOptions& options) {
  if (options_.communicator != nullptr) {
    return LoadCooperative(requests, options);
  }
  return LoadLocal(requests, options);
}

absl::StatusOr<LoadReport> ReaderImpl::LoadCooperative(
    const std::vector<LoadRequest>& requests, const LoadOptions& options) {
  LoadReport report;
  absl::StatusOr<Prepared> p =
      options.local_error.ok()
          ? Prepare(requests, options, &report, /*borrow=*/false)
          : absl::StatusOr<Prepared>(options.local_error);
  CooperativeLoad::Source source;
  source.manifest = &manifest_;
  source.shards = &shards_;
  source.comm = options_.communicator;
  source.device_memory = options_.device_memory;
  source.min_read_bytes = min_read_bytes_;
  source.upload_pool = [this] { return UploadPool(); };
  source.load_alone = [this, &options](const Prepared& prepared, LoadReport r) {
    return LoadPrepared(prepared, options, std::move(r));
  };
  return CooperativeLoad(std::move(source), IoThreads(options))
      .Run(p, options, std::move(report));
}

absl::StatusOr<LoadReport> ReaderImpl::LoadLocal(
    const std::vector<LoadRequest>& requests, const LoadOptions& options) {
  CKPT_RETURN_IF_ERROR(options.local_error);
  LoadReport report;
  CKPT_ASSIGN_OR_RETURN(Prepared p, Prepare(requests, options, &report,
                                            /*borrow=*/true));
  return LoadPrepared(p, options, std::move(report));
}

absl::StatusOr<LoadReport> ReaderImpl::LoadPrepared(const Prepared& p,
                                                    const LoadOptions& options,
                                                    LoadReport report) {
  const int threads = IoThreads(options);
  CKPT_ASSIGN_OR_RETURN(internal::ReadPlan plan, Plan(p, threads));
  internal::StagingPool* pool = nullptr;
  if (std::any_of(p.all().begin(), p.all().end(), [](const LoadRequest& r) {
        return r.memory == MemoryKind::kCuda;
      })) {
    CKPT_ASSIGN_OR_RETURN(pool, UploadPool());
  }
  ReadExecutor run(p, options_.device_memory, pool, options.device_ready,
                   threads);
  CKPT_RETURN_IF_ERROR(Execute(plan, &run, threads));
  CKPT_RETURN_IF_ERROR(run.CheckAllWritten());
  for (const LoadRequest& r : p.all()) {
    report.bytes_loaded += RegionElements(r.region) * DTypeSize(r.dtype);
  }
  report.bytes_read = run.bytes_read();
  report.blocks_verified = run.blocks_verified();
  std::sort(report.loaded.begin(), report.loaded.end());
  return report;
}

}  // namespace internal

namespace {

// The checkpoint directory `path` names and its MANIFEST bytes: read here,
// or, with a communicator, read by rank 0 and broadcast with its error.
absl::StatusOr<std::pair<std::string, std::string>> ReadManifestBytes(
    Storage* storage, const std::string& path, Communicator* comm) {
  auto read = [&]() -> absl::StatusOr<std::pair<std::string, std::string>> {
    CKPT_ASSIGN_OR_RETURN(std::string dir,
                          internal::ResolveCheckpointDir(storage, path));
    CKPT_ASSIGN_OR_RETURN(
        std::string bytes,
        storage->ReadFile(JoinPath(dir, format::kManifestFileName)));
    return std::make_pair(std::move(dir), std::move(bytes));
  };
  if (comm == nullptr) return read();
  CKPT_ASSIGN_OR_RETURN(
      std::string body,
      internal::OnRankZero(comm, [&]() -> absl::StatusOr<std::string> {
        CKPT_ASSIGN_OR_RETURN(auto got, read());
        std::string out;
        format::PutString(&out, got.first);
        out += got.second;
        return out;
      }));
  format::ByteReader r(body);
  auto dir = r.ReadString("directory", body.size());
  if (!dir.ok()) {
    return absl::InternalError(
        absl::StrCat("the manifest broadcast by rank 0 does not decode: ",
                     dir.status().message()));
  }
  return std::make_pair(std::string(*dir),
                        body.substr(body.size() - r.remaining()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Reader>> Reader::Open(
    const std::string& path, const ReaderOptions& options) {
  if (options.max_open_files < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReaderOptions::max_open_files is ",
                     options.max_open_files, ", must be at least 1"));
  }
  Storage* storage = options.storage ? options.storage : DefaultStorage();
  CKPT_ASSIGN_OR_RETURN(auto dir_and_bytes,
                        ReadManifestBytes(storage, path, options.communicator));
  auto& [dir, bytes] = dir_and_bytes;
  CKPT_ASSIGN_OR_RETURN(format::Manifest m,
                        internal::DecodeManifestFile(dir, bytes));
  bytes = std::string();  // decoded: not held while the reader lives
  CKPT_RETURN_IF_ERROR(Annotate(format::ValidateCoverage(m),
                                JoinPath(dir, format::kManifestFileName)));
  return std::unique_ptr<Reader>(
      new internal::ReaderImpl(storage, std::move(dir), std::move(m), options));
}

}  // namespace ckpt

#include "ckpt/writer.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "async_save.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/names.h"
#include "ckpt/format/plan_record.h"
#include "ckpt/format/shard.h"
#include "ckpt/format/status_macros.h"
#include "commit.h"
#include "object_store_commit.h"
#include "save_plan.h"
#include "shard_writer.h"
#include "staging_pool.h"
#include "wire.h"

namespace ckpt {
namespace {

using internal::LocalItem;
using internal::LocalPlan;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

absl::Status ValidateOptions(const SaveOptions& o) {
  auto pow2 = [](uint64_t x) { return x != 0 && (x & (x - 1)) == 0; };
  if (!pow2(o.block_size) || o.block_size < format::kMinBlockSize ||
      o.block_size > format::kMaxBlockSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size ", o.block_size,
                     " must be a power of two in [4096, 2^30]"));
  }
  if (!pow2(o.alignment) || o.alignment > format::kMaxAlignment) {
    return absl::InvalidArgumentError(absl::StrCat(
        "alignment ", o.alignment, " must be a power of two <= 2^30"));
  }
  if (o.snapshot_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot_threads ", o.snapshot_threads, " must be >= 0"));
  }
  if (o.io_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("io_threads ", o.io_threads, " must be >= 1"));
  }
  if (o.codec != format::Codec::kNone && o.codec != format::Codec::kZstd) {
    return absl::InvalidArgumentError("unknown codec");
  }
  for (const auto& [k, v] : o.metadata) {
    CKPT_RETURN_IF_ERROR(format::ValidateMetadataKey(k));
    if (v.size() > format::kMaxMetadataValueLength) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metadata '", k, "': value of ", v.size(), " bytes exceeds 1 MiB"));
    }
  }
  return absl::OkStatus();
}

class WriterImpl final : public Writer {
 public:
  explicit WriterImpl(const Options& o)
      : comm_(o.comm ? o.comm : &single_),
        storage_(o.storage ? o.storage : DefaultStorage()),
        device_memory_(o.device_memory),
        options_(o) {}
  // A save in flight is waited for (its commit included).
  ~WriterImpl() override {
    if (in_flight_ != nullptr) (void)in_flight_->Wait();
    in_flight_.reset();
    for (const auto& [device, arena] : device_arenas_) {
      if (arena != nullptr) {
        device_memory_->FreeDevice(arena, options_.device_snapshot_bytes,
                                   device);
      }
    }
  }

  absl::Status AddTensor(const std::string& name, DType dtype,
                         const Shape& shape, const Region& local,
                         const void* data,
                         const TensorOptions& options) override {
    CKPT_RETURN_IF_ERROR(
        internal::CheckTensorArguments(name, dtype, shape, local, data));
    if (options.memory == MemoryKind::kCuda && device_memory_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "entry '", name,
          "' is in CUDA memory but Writer::Options::device_memory is not set"));
    }
    if (index_.contains(name)) {
      return absl::AlreadyExistsError(
          absl::StrCat("entry '", name, "' is already registered"));
    }
    Registered r;
    r.item.name = name;
    r.item.dtype = dtype;
    r.item.shape = shape;
    r.item.region = local;
    r.item.replica = options.replica;
    r.item.partial = options.partial;
    r.data = data;
    r.memory = options.memory;
    r.device = options.device;
    r.fp = internal::ItemFingerprint(r.item);
    index_[name] = items_.size();
    items_.push_back(std::move(r));
    return absl::OkStatus();
  }

  absl::Status AddTensorSource(const std::string& name, DType dtype,
                               const Shape& shape, const Region& local,
                               TensorSource source,
                               const TensorOptions& options) override {
    if (!source) {
      return absl::InvalidArgumentError(
          absl::StrCat("entry '", name, "': source is empty"));
    }
    TensorOptions host = options;
    host.memory = MemoryKind::kHost;
    static const char kNonNull = 0;
    CKPT_RETURN_IF_ERROR(AddTensor(name, dtype, shape, local, &kNonNull, host));
    items_.back().source = std::move(source);
    items_.back().data = nullptr;
    return absl::OkStatus();
  }

  absl::Status SetObject(const std::string& name, std::string bytes) override {
    CKPT_RETURN_IF_ERROR(format::ValidateEntryName(name));
    auto it = index_.find(name);
    if (it != index_.end()) {
      Registered& r = items_[it->second];
      if (r.item.kind != format::EntryKind::kObject) {
        return absl::AlreadyExistsError(
            absl::StrCat("'", name, "' is registered as a tensor"));
      }
      r.bytes = std::move(bytes);
    } else {
      Registered r;
      r.item.name = name;
      r.item.kind = format::EntryKind::kObject;
      r.item.dtype = DType::kUInt8;
      r.bytes = std::move(bytes);
      r.fp =
          internal::ItemFingerprint(r.item);  // kind, dtype, name: not the size
      index_[name] = items_.size();
      items_.push_back(std::move(r));
    }
    Registered& r = items_[index_[name]];
    r.item.shape = {r.bytes.size()};
    r.item.region = FlatRange{0, r.bytes.size()};
    // No pointer into r.bytes is kept: a short string lives inside the
    // Registered record, which moves when items_ grows (Save takes it).
    return absl::OkStatus();
  }

  absl::Status Remove(const std::string& name) override {
    auto it = index_.find(name);
    if (it == index_.end()) {
      return absl::NotFoundError(
          absl::StrCat("entry '", name, "' is not registered"));
    }
    items_.erase(items_.begin() + it->second);
    index_.clear();
    for (size_t i = 0; i < items_.size(); ++i) index_[items_[i].item.name] = i;
    return absl::OkStatus();
  }

  void Clear() override {
    items_.clear();
    index_.clear();
  }

  absl::StatusOr<SaveResult> Save(const std::string& root, uint64_t step,
                                  const SaveOptions& options) override;
  absl::StatusOr<SaveHandle> SaveAsync(const std::string& root, uint64_t step,
                                       const SaveOptions& options) override;

 private:
  struct Registered {
    LocalItem item;
    const void* data = nullptr;
    MemoryKind memory = MemoryKind::kHost;
    int device = 0;
    std::string bytes;    // objects only
    TensorSource source;  // AddTensorSource only
    format::Fingerprint
        fp{};  // internal::ItemFingerprint(item); sizes of objects excluded
  };

  // One save between its preparation and its commit: everything the later
  // phases need, independent of the registrations and of cache_ (so that
  // the write and commit phases may run after Save's caller moved on).
  struct PendingSave {
    std::string root;
    std::string dir_name;   // step-NNNNNNNN
    std::string final_dir;  // root/dir_name
    std::string tmp;        // the temporary directory every rank writes into
    format::CheckpointInfo info;  // identical on every rank
    // Coordinator only: the PLAN section the manifest records, and the
    // root's save lock, held until the PendingSave is destroyed (null on
    // other ranks and where the storage has no locks).
    std::string plan_section;
    std::unique_ptr<FileLock> save_lock;
  };

  // The phases of Save, in order. Each is a collective (every rank calls
  // it, and it returns the same status on every rank) unless it says
  // otherwise.

  // Plan: reuses the cached plan if every rank's structure still fits it,
  // else replans, keeping the writers of the plan recorded in the root's
  // latest checkpoint where the coordinator finds they fit. Returns
  // whether a cached or recorded plan was reused. Leaves cache_ valid.
  absl::StatusOr<bool> PlanPhase(const std::string& root,
                                 const SaveOptions& options);
  // Prepare: the coordinator creates the root if missing, takes its save
  // lock, refuses an existing step without options.overwrite, creates the
  // temporary directory and draws the checkpoint id. REQUIRES: cache_ valid.
  absl::StatusOr<PendingSave> Prepare(const std::string& root, uint64_t step,
                                      const SaveOptions& options);
  // Snapshot: the pieces this rank writes under cache_, as views of the
  // registered memory (no copy). Local, not a collective. The views stay
  // valid while the registrations do not change; the registered memory
  // must stay unmodified until WriteShard returns (Writer's REQUIRES).
  std::vector<internal::WriteItem> Snapshot() const;
  // Write: writes and fsyncs this rank's shard file into pending.tmp.
  // Local, not a collective, and never fails by itself: returns the encoded
  // report (or the error, naming the rank) that CommitAcrossRanks gathers,
  // and adds this rank's payload bytes to *local_stored_bytes.
  std::string WriteShard(const PendingSave& pending,
                         const std::vector<internal::WriteItem>& snapshot,
                         const SaveOptions& options,
                         uint64_t* local_stored_bytes);
  // Commit: gathers every rank's report; the coordinator commits only if
  // all succeeded (internal::CommitCheckpoint) and removes the temporary
  // directory otherwise. Returns the coordinator's summary on every rank.
  // `comm` (null: comm_) runs the collectives: the background of SaveAsync
  // passes its dedicated communicator.
  absl::StatusOr<internal::CommitSummary> CommitAcrossRanks(
      const PendingSave& pending, const std::string& report,
      const SaveOptions& options, Communicator* comm = nullptr);

  // Rank 0 runs `fn`; its status (and payload) reach every rank.
  absl::StatusOr<std::string> OnCoordinator(
      absl::FunctionRef<absl::StatusOr<std::string>()> fn,
      Communicator* comm = nullptr) {
    if (comm == nullptr) comm = comm_;
    std::string msg;
    if (comm->rank() == 0) msg = internal::EncodeStatusOr(fn());
    CKPT_RETURN_IF_ERROR(comm->Broadcast(&msg, 0));
    return internal::DecodeStatusOr(msg);
  }

  // WriteShard with device tensors staged through the pool, a few buffers
  // ahead of the writer, so that their copies overlap the writes.
  std::string WriteShardStaged(const PendingSave& pending,
                               const SaveOptions& options, SaveResult* result);
  // Staging (the machinery is libckpt/async_save.h). The save in flight, if
  // any, is waited for, or refused with options.fail_if_busy.
  absl::Status AwaitInFlight(const SaveOptions& options);
  // The staging pool, made on first need with buffers of at least
  // `segment_bytes`; kept for the Writer's lifetime.
  absl::StatusOr<internal::StagingPool*> Pool(uint64_t segment_bytes);
  // SaveAsync's snapshot: a Stager over copies of everything this rank
  // writes (geometry, sources), and the write items reading from it.
  struct AsyncJob;
  // Adds registration `r` to the job's stager and writes; its bytes come
  // from `device_copy` (device memory of the snapshot) when not null.
  static void AddToJob(AsyncJob* job, const Registered& r,
                       const void* device_copy);
  // Device snapshot (SaveOptions::snapshot_to_device): copies the device
  // tensors of `order` (positions in items_) that fit into the device
  // snapshot memory there, after options.device_ready, and waits for the
  // copies. Per position of `order`: the copy, or null where none was made.
  absl::StatusOr<std::vector<const void*>> SnapshotOnDevice(
      const std::vector<uint32_t>& order, const SaveOptions& options,
      uint64_t* bytes);
  // The device snapshot memory of `device`, allocated on first use; null
  // where it cannot be had (never asked again).
  char* DeviceArena(int device);
  // Takes *pending only on success.
  absl::StatusOr<std::shared_ptr<AsyncJob>> MakeAsyncJob(
      PendingSave* pending, const SaveOptions& options);
  // The phases of a SaveAsync in the background: writing the job's shard,
  // and the commit's collectives on `comm`.
  internal::AsyncSave::WriteFn AsyncWrite(std::shared_ptr<AsyncJob> job);
  internal::AsyncSave::CommitFn AsyncCommit(std::shared_ptr<AsyncJob> job,
                                            Communicator* comm);

  // The plan of the last save, valid for exactly one local structure
  // (`local_fp`) on every rank of a world of `world` ranks.
  struct PlanCache {
    bool valid = false;
    int world = 0;
    format::Fingerprint local_fp{};
    std::vector<uint32_t> writes;  // positions in items_ this rank writes
    // Coordinator (rank 0) only: what the manifest records.
    format::Fingerprint global_fp{};
    std::string plan_section;  // PLAN section body
  };

  format::Fingerprint LocalFingerprint() const {
    return internal::CombineFingerprints(
        items_.size(),
        [&](size_t i) -> const format::Fingerprint& { return items_[i].fp; });
  }
  // Agrees across ranks (one small collective) whether the plan in memory
  // fits every rank's structure; *some_rank_has_none says whether a rank
  // has no plan in memory (the first save of a restarted job).
  absl::StatusOr<bool> CachedPlanFits(bool* some_rank_has_none);
  // The PLAN section body of the root's latest checkpoint; empty where
  // there is none or it cannot be read (a miss, never an error).
  std::string RecordedPlan(const std::string& root) const;
  // Full planning: gathers every local plan; the coordinator checks the
  // union and assigns writers, keeping those of `recorded` (a PLAN body,
  // meaningful on the coordinator only; empty: none) where they write
  // every registered piece exactly once; fills cache_. Returns whether
  // `recorded` was reused.
  absl::StatusOr<bool> Replan(absl::string_view recorded);
  // Adopts `record` as cache_ if it fits this rank; false otherwise.
  bool AdoptRecord(const format::PlanRecord& record, absl::string_view body,
                   const format::Fingerprint& local_fp);

  SingleProcessCommunicator single_;
  Communicator* comm_;
  Storage* storage_;
  DeviceMemory* device_memory_;
  Options options_;
  std::unique_ptr<internal::StagingPool> pool_;
  std::shared_ptr<internal::AsyncSave> in_flight_;
  absl::flat_hash_map<int, char*> device_arenas_;  // DeviceArena
  std::vector<Registered> items_;
  absl::flat_hash_map<std::string, size_t> index_;
  PlanCache cache_;
};

bool WriterImpl::AdoptRecord(const format::PlanRecord& record,
                             absl::string_view body,
                             const format::Fingerprint& local_fp) {
  const int rank = comm_->rank(), world = comm_->size();
  if (static_cast<int>(record.ranks.size()) != world) return false;
  const auto& mine = record.ranks[rank];
  if (mine.fingerprint != local_fp) return false;
  // The fingerprint covers the item count, but a cache is never trusted
  // further than it can be checked.
  for (uint32_t i : mine.writes) {
    if (i >= items_.size()) return false;
  }
  cache_.valid = true;
  cache_.world = world;
  cache_.local_fp = local_fp;
  cache_.writes = mine.writes;
  if (rank == 0) {
    cache_.global_fp = internal::GlobalFingerprint(record);
    cache_.plan_section = std::string(body);
  }
  return true;
}

absl::StatusOr<bool> WriterImpl::CachedPlanFits(bool* some_rank_has_none) {
  const format::Fingerprint fp = LocalFingerprint();
  const int world = comm_->size();
  std::vector<int64_t> flags = {
      (cache_.valid && cache_.world == world && cache_.local_fp == fp) ? 0 : 1,
      cache_.valid ? 0 : 1};
  CKPT_RETURN_IF_ERROR(comm_->AllReduceMax(&flags));
  *some_rank_has_none = flags[1] != 0;
  return flags[0] == 0;
}

std::string WriterImpl::RecordedPlan(const std::string& root) const {
  auto dir = internal::ResolveCheckpointDir(storage_, root);
  if (!dir.ok()) return "";
  auto bytes = storage_->ReadFile(JoinPath(*dir, format::kManifestFileName));
  if (!bytes.ok()) return "";
  auto m = format::DecodeManifest(*bytes);
  return m.ok() ? std::move(m->plan) : "";
}

absl::StatusOr<bool> WriterImpl::Replan(absl::string_view recorded) {
  cache_.valid = false;
  internal::RankPlan mine;
  mine.fingerprint = LocalFingerprint();
  mine.plan.reserve(items_.size());
  for (const Registered& r : items_) mine.plan.push_back(r.item);
  // Only the coordinator needs them (empty elsewhere).
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> plans,
                        comm_->Gather(internal::EncodeRankPlan(mine), 0));
  CKPT_ASSIGN_OR_RETURN(
      std::string msg, OnCoordinator([&]() -> absl::StatusOr<std::string> {
        CKPT_ASSIGN_OR_RETURN(
            internal::CoordinatorPlan planned,
            internal::PlanOnCoordinator(std::move(plans), recorded));
        return internal::EncodeCoordinatorPlan(planned);
      }));
  CKPT_ASSIGN_OR_RETURN(internal::CoordinatorPlan planned,
                        internal::DecodeCoordinatorPlan(msg));
  CKPT_ASSIGN_OR_RETURN(format::PlanRecord record,
                        format::DecodePlanRecord(planned.body));
  if (!AdoptRecord(record, planned.body, mine.fingerprint)) {
    return absl::InternalError(
        "the coordinator's plan does not fit this rank's registrations");
  }
  return planned.reused;
}

absl::StatusOr<bool> WriterImpl::PlanPhase(const std::string& root,
                                           const SaveOptions& options) {
  // One small collective decides whether every rank's structure is what
  // the cached plan was made for; only then is it reused.
  bool some_rank_has_none = false;
  CKPT_ASSIGN_OR_RETURN(bool hit, CachedPlanFits(&some_rank_has_none));
  if (hit) return true;
  // A restarted job: the root's latest checkpoint may record a plan. It
  // came from a file, so it only offers writers: the coordinator checks it
  // against every rank's registrations as it plans (the collectives of a
  // miss), since a plan must never decide what is saved.
  std::string recorded;
  if (some_rank_has_none && options.reuse_recorded_plan && comm_->rank() == 0) {
    recorded = RecordedPlan(root);
  }
  return Replan(recorded);
}

absl::StatusOr<WriterImpl::PendingSave> WriterImpl::Prepare(
    const std::string& root, uint64_t step, const SaveOptions& options) {
  PendingSave p;
  p.root = root;
  p.dir_name = format::StepDirName(step);
  p.final_dir = JoinPath(root, p.dir_name);
  CKPT_ASSIGN_OR_RETURN(
      std::string msg, OnCoordinator([&]() -> absl::StatusOr<std::string> {
        CKPT_ASSIGN_OR_RETURN(
            internal::SavePrep prep,
            internal::BeginSave(storage_, root, step, comm_->size(),
                                options.overwrite, cache_.global_fp,
                                &p.save_lock));
        return internal::EncodeSavePrep(prep);
      }));
  CKPT_ASSIGN_OR_RETURN(internal::SavePrep prep, internal::DecodeSavePrep(msg));
  p.tmp = prep.tmp_dir;
  p.info = internal::CheckpointInfoOf(prep, step, comm_->size());
  if (comm_->rank() == 0) p.plan_section = cache_.plan_section;
  return p;
}

std::vector<internal::WriteItem> WriterImpl::Snapshot() const {
  std::vector<internal::WriteItem> writes;
  writes.reserve(cache_.writes.size());
  for (uint32_t i : cache_.writes) {
    const Registered& r = items_[i];
    const void* data =
        r.item.kind == format::EntryKind::kObject ? r.bytes.data() : r.data;
    writes.push_back(internal::WriteItem{&r.item, data, r.memory, r.device,
                                         r.source ? &r.source : nullptr});
  }
  return writes;
}

std::string WriterImpl::WriteShard(
    const PendingSave& pending,
    const std::vector<internal::WriteItem>& snapshot,
    const SaveOptions& options, uint64_t* local_stored_bytes) {
  const int rank = comm_->rank();
  auto written =
      internal::WriteRankShard(storage_, pending.tmp, rank, pending.info,
                               snapshot, options, device_memory_);
  if (!written.ok()) {
    return internal::EncodeStatusOr(
        Annotate(written.status(), absl::StrCat("rank ", rank)));
  }
  *local_stored_bytes += written->stored_bytes;
  return internal::EncodeStatusOr(
      internal::EncodeShardReport(internal::ReportOf(*std::move(written))));
}

absl::StatusOr<internal::CommitSummary> WriterImpl::CommitAcrossRanks(
    const PendingSave& pending, const std::string& report,
    const SaveOptions& options, Communicator* comm) {
  if (comm == nullptr) comm = comm_;
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> reports,
                        comm->Gather(report, 0));
  CKPT_ASSIGN_OR_RETURN(
      std::string msg,
      OnCoordinator(
          [&]() -> absl::StatusOr<std::string> {
            internal::CommitSummary summary;
            absl::Status status = [&]() -> absl::Status {
              std::vector<internal::ShardReport> decoded;
              for (const std::string& r : reports) {
                CKPT_ASSIGN_OR_RETURN(std::string bytes,
                                      internal::DecodeStatusOr(r));
                CKPT_ASSIGN_OR_RETURN(decoded.emplace_back(),
                                      internal::DecodeShardReport(bytes));
              }
              format::Manifest m = internal::AssembleManifest(
                  pending.info, options.metadata, pending.plan_section,
                  std::move(decoded), &summary);
              return internal::CommitCheckpoint(
                  storage_, pending.root, pending.tmp, m, options.overwrite,
                  options.keep_last);
            }();
            if (!status.ok()) {
              (void)internal::DiscardSave(
                  storage_, pending.tmp,
                  pending.info);  // best effort; the error is what matters
              return status;
            }
            return internal::EncodeCommitSummary(summary);
          },
          comm));
  return internal::DecodeCommitSummary(msg);
}

absl::StatusOr<SaveResult> WriterImpl::Save(const std::string& root,
                                            uint64_t step,
                                            const SaveOptions& options) {
  CKPT_RETURN_IF_ERROR(ValidateOptions(options));
  CKPT_RETURN_IF_ERROR(AwaitInFlight(options));
  SaveResult result;
  auto t0 = std::chrono::steady_clock::now();
  CKPT_ASSIGN_OR_RETURN(result.plan_cache_hit, PlanPhase(root, options));
  result.plan_seconds = Seconds(t0);

  CKPT_ASSIGN_OR_RETURN(PendingSave pending, Prepare(root, step, options));
  auto t1 = std::chrono::steady_clock::now();
  const std::string report = WriteShardStaged(pending, options, &result);
  result.write_seconds = Seconds(t1);

  auto t2 = std::chrono::steady_clock::now();
  CKPT_ASSIGN_OR_RETURN(internal::CommitSummary summary,
                        CommitAcrossRanks(pending, report, options));
  result.commit_seconds = Seconds(t2);
  result.stored_bytes = summary.stored_bytes;
  result.logical_bytes = summary.logical_bytes;
  result.path = pending.final_dir;
  return result;
}

// ---------------------------------------------------------------------------
// Staging: device tensors of Save, and SaveAsync.

// Buffers a synchronous Save stages ahead of its writer: enough to keep the
// copies ahead of the I/O threads, little enough to stay out of the way.
constexpr int kSaveStagingBuffers = 4;

absl::StatusOr<internal::StagingPool*> WriterImpl::Pool(
    uint64_t segment_bytes) {
  const uint64_t a = internal::StagingPool::kAlignment;
  uint64_t buffer = std::max(options_.staging_buffer_bytes, segment_bytes);
  buffer = (buffer + a - 1) / a * a;
  if (pool_ == nullptr || pool_->buffer_bytes() < segment_bytes) {
    pool_.reset();  // no save is in flight: nothing is leased
    CKPT_ASSIGN_OR_RETURN(pool_, internal::StagingPool::Create(
                                     device_memory_, buffer,
                                     std::max(options_.staging_bytes, buffer)));
  }
  return pool_.get();
}

absl::Status WriterImpl::AwaitInFlight(const SaveOptions& options) {
  if (options.fail_if_busy) {
    // Whether a save is still in flight is local; the decision is every
    // rank's: one busy rank makes the save fail on all of them (a rank that
    // went on alone would wait in the commit's collectives for the others).
    std::vector<int64_t> busy = {
        in_flight_ != nullptr && !in_flight_->Done() ? 1 : 0};
    if (comm_->size() > 1) CKPT_RETURN_IF_ERROR(comm_->AllReduceMax(&busy));
    if (busy[0] != 0) {
      return absl::FailedPreconditionError(
          "a save of this Writer is still in flight on some rank "
          "(SaveOptions::fail_if_busy)");
    }
  }
  if (in_flight_ == nullptr) return absl::OkStatus();
  (void)in_flight_->Wait();  // its outcome is its handle's
  in_flight_.reset();
  return absl::OkStatus();
}

std::string WriterImpl::WriteShardStaged(const PendingSave& pending,
                                         const SaveOptions& options,
                                         SaveResult* result) {
  std::vector<internal::WriteItem> snapshot = Snapshot();
  internal::DeviceStaging staging;
  const bool device =
      std::any_of(snapshot.begin(), snapshot.end(), [](const auto& w) {
        return w.memory == MemoryKind::kCuda && w.source == nullptr;
      });
  if (device && device_memory_ != nullptr) {
    const uint64_t segment = internal::StagingSegmentBytes(options);
    absl::StatusOr<internal::StagingPool*> pool = Pool(segment);
    // Its buffers are made (pinned) before the copies start, once.
    absl::Status reserved =
        pool.ok()
            ? (*pool)->Reserve(kSaveStagingBuffers * (*pool)->buffer_bytes())
            : pool.status();
    if (!reserved.ok()) {
      return internal::EncodeStatusOr(
          Annotate(reserved, absl::StrCat("rank ", comm_->rank())));
    }
    staging.Start(&snapshot, *pool, device_memory_, options.device_ready,
                  segment, kSaveStagingBuffers);
    result->staging_cap_bytes = (*pool)->cap_bytes();
  }
  std::string report =
      WriteShard(pending, snapshot, options, &result->local_stored_bytes);
  (void)staging.Stop();  // a staging error failed the write: it is in `report`
  result->peak_staging_bytes = staging.peak_bytes();
  return report;
}

struct WriterImpl::AsyncJob {
  PendingSave pending;
  SaveOptions options;
  std::vector<LocalItem> items;  // copies: registrations may change meanwhile
  std::vector<internal::WriteItem> writes;
  std::unique_ptr<internal::Stager> stager;  // until AsyncSave takes it
  size_t foreground_items = 0;               // staged before SaveAsync returns
  uint64_t staged_bytes = 0;                 // what the stager can use at once
  uint64_t device_snapshot_bytes = 0;
  uint64_t local_stored_bytes = 0;
  double write_seconds = 0;
};

void WriterImpl::AddToJob(AsyncJob* job, const Registered& r,
                          const void* device_copy) {
  job->items.push_back(r.item);
  const bool object = r.item.kind == format::EntryKind::kObject;
  internal::StageInput in;
  in.name = r.item.name;
  in.size = RegionElements(r.item.region) * DTypeSize(r.item.dtype);
  // Each item starts at an aligned offset of a buffer.
  const uint64_t a = internal::StagingPool::kAlignment;
  job->staged_bytes += (in.size + a - 1) / a * a;
  in.data = device_copy ? device_copy : object ? r.bytes.data() : r.data;
  in.memory = object ? MemoryKind::kHost : r.memory;
  in.device = r.device;
  in.source = r.source ? &r.source : nullptr;
  internal::WriteItem w{&job->items.back(), nullptr};
  w.staged = job->stager->Add(std::move(in));
  job->writes.push_back(w);
}

char* WriterImpl::DeviceArena(int device) {
  auto it = device_arenas_.find(device);
  if (it != device_arenas_.end()) return it->second;
  absl::StatusOr<void*> p =
      device_memory_->AllocateDevice(options_.device_snapshot_bytes, device);
  char* arena = p.ok() ? static_cast<char*>(*p) : nullptr;
  device_arenas_[device] = arena;
  return arena;
}

absl::StatusOr<std::vector<const void*>> WriterImpl::SnapshotOnDevice(
    const std::vector<uint32_t>& order, const SaveOptions& options,
    uint64_t* bytes) {
  std::vector<const void*> copies(order.size(), nullptr);
  if (!options.snapshot_to_device || options_.device_snapshot_bytes == 0 ||
      device_memory_ == nullptr) {
    return copies;
  }
  absl::flat_hash_map<int, uint64_t> used;
  absl::flat_hash_map<int, std::vector<DeviceCopy>> batches;
  for (size_t k = 0; k < order.size(); ++k) {
    const Registered& r = items_[order[k]];
    const uint64_t n = RegionElements(r.item.region) * DTypeSize(r.item.dtype);
    if (r.memory != MemoryKind::kCuda || r.source || n == 0) continue;
    char* arena = DeviceArena(r.device);
    const uint64_t offset = (used[r.device] + 255) / 256 * 256;
    if (arena == nullptr || offset + n > options_.device_snapshot_bytes)
      continue;
    used[r.device] = offset + n;
    DeviceCopy c;
    c.dst = arena + offset;
    c.src = r.data;
    c.row_bytes = n;
    batches[r.device].push_back(c);
    copies[k] = c.dst;
    *bytes += n;
  }
  for (const auto& [device, batch] : batches) {
    absl::Status s = [&, device = device, &batch = batch]() -> absl::Status {
      CKPT_ASSIGN_OR_RETURN(std::unique_ptr<DeviceStream> stream,
                            device_memory_->CreateStream(device));
      if (options.device_ready != nullptr)
        CKPT_RETURN_IF_ERROR(stream->WaitEvent(*options.device_ready));
      CKPT_RETURN_IF_ERROR(stream->CopyAsync(CopyKind::kDeviceToDevice, batch));
      CKPT_ASSIGN_OR_RETURN(std::unique_ptr<DeviceEvent> done,
                            stream->Record());
      return done->Wait();
    }();
    CKPT_RETURN_IF_ERROR(
        Annotate(s, absl::StrCat("device snapshot on device ", device)));
  }
  return copies;
}

absl::StatusOr<std::shared_ptr<WriterImpl::AsyncJob>> WriterImpl::MakeAsyncJob(
    PendingSave* pending, const SaveOptions& options) {
  auto job = std::make_shared<AsyncJob>();
  job->options = options;
  job->options.device_ready =
      nullptr;  // the caller's; used by the snapshot only
  const uint64_t segment = internal::StagingSegmentBytes(options);
  absl::StatusOr<internal::StagingPool*> pool = Pool(segment);
  if (!pool.ok()) return pool.status();
  CKPT_ASSIGN_OR_RETURN(
      std::vector<const void*> on_device,
      SnapshotOnDevice(cache_.writes, options, &job->device_snapshot_bytes));
  job->stager = std::make_unique<internal::Stager>(
      *pool, device_memory_, options.device_ready, segment, 0,
      options.snapshot_threads > 0 ? options.snapshot_threads
                                   : DefaultSnapshotThreads());
  job->items.reserve(cache_.writes.size());  // WriteItems point into it
  // What SaveAsync stages before it returns comes first, in the stager and
  // in the shard, then the device snapshot's items (staged in the
  // background): the writer never waits for them while earlier items
  // still hold staging buffers.
  for (const bool deferred : {false, true}) {
    for (size_t k = 0; k < cache_.writes.size(); ++k) {
      if ((on_device[k] != nullptr) == deferred)
        AddToJob(job.get(), items_[cache_.writes[k]], on_device[k]);
    }
    if (!deferred) job->foreground_items = job->writes.size();
  }
  // The pool grows to what this save can use (within the cap, with one
  // buffer's worth of slack for the packing) before the copies start, not
  // copy by copy: the first SaveAsync pays the allocation and faults,
  // later ones find the memory ready.
  CKPT_RETURN_IF_ERROR(
      (*pool)->Reserve(job->staged_bytes + (*pool)->buffer_bytes()));
  job->pending = std::move(*pending);
  return job;
}

internal::AsyncSave::WriteFn WriterImpl::AsyncWrite(
    std::shared_ptr<AsyncJob> job) {
  return [this, job] {
    const auto t = std::chrono::steady_clock::now();
    std::string report = WriteShard(job->pending, job->writes, job->options,
                                    &job->local_stored_bytes);
    job->write_seconds = Seconds(t);
    return report;
  };
}

internal::AsyncSave::CommitFn WriterImpl::AsyncCommit(
    std::shared_ptr<AsyncJob> job, Communicator* comm) {
  return [this, job, comm](const std::string& report,
                           SaveResult r) -> absl::StatusOr<SaveResult> {
    const auto t = std::chrono::steady_clock::now();
    absl::StatusOr<internal::CommitSummary> summary =
        CommitAcrossRanks(job->pending, report, job->options, comm);
    job->pending.save_lock.reset();  // the root is free for the next save
    if (!summary.ok()) return summary.status();
    r.commit_seconds = Seconds(t);
    r.write_seconds = job->write_seconds;
    r.local_stored_bytes = job->local_stored_bytes;
    r.stored_bytes = summary->stored_bytes;
    r.logical_bytes = summary->logical_bytes;
    r.path = job->pending.final_dir;
    return r;
  };
}

absl::StatusOr<SaveHandle> WriterImpl::SaveAsync(const std::string& root,
                                                 uint64_t step,
                                                 const SaveOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  CKPT_RETURN_IF_ERROR(ValidateOptions(options));
  CKPT_RETURN_IF_ERROR(AwaitInFlight(options));
  SaveResult partial;
  CKPT_ASSIGN_OR_RETURN(partial.plan_cache_hit, PlanPhase(root, options));
  partial.plan_seconds = Seconds(t0);
  CKPT_ASSIGN_OR_RETURN(PendingSave pending, Prepare(root, step, options));
  // Who runs the commit's collectives: a dedicated communicator in the
  // background, the trivial one of a single process in the background, or
  // the trainer's own inside Wait() (writer.h).
  Communicator* background = options_.background_comm;
  if (background == nullptr && comm_ == &single_) background = &single_;
  Communicator* const commit_comm = background != nullptr ? background : comm_;
  absl::StatusOr<std::shared_ptr<AsyncJob>> made =
      MakeAsyncJob(&pending, options);
  if (!made.ok()) {
    // The other ranks go on to the commit: take part, so that it fails on
    // every rank and the temporary directory goes.
    const absl::Status error =
        Annotate(made.status(), absl::StrCat("rank ", comm_->rank()));
    (void)CommitAcrossRanks(pending, internal::EncodeStatusOr(error), options,
                            commit_comm);
    return error;
  }
  std::shared_ptr<AsyncJob> job = *std::move(made);
  partial.staging_cap_bytes = pool_->cap_bytes();
  partial.device_snapshot_bytes = job->device_snapshot_bytes;
  in_flight_ = std::make_shared<internal::AsyncSave>(
      std::move(job->stager), job->foreground_items, partial, AsyncWrite(job),
      AsyncCommit(job, commit_comm), background != nullptr,
      options_.background_nice);
  in_flight_->Start();
  in_flight_->set_stall_seconds(Seconds(t0));
  return SaveHandle(in_flight_);
}

}  // namespace

int DefaultSnapshotThreads() {
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(hw / 2, 1, 4);
}

absl::StatusOr<std::unique_ptr<Writer>> Writer::Create(const Options& options) {
  return std::unique_ptr<Writer>(new WriterImpl(options));
}

}  // namespace ckpt

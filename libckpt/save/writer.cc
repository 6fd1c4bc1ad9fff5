#include "ckpt/writer.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/names.h"
#include "ckpt/format/plan_record.h"
#include "ckpt/format/shard.h"
#include "ckpt/format/status_macros.h"
#include "save/async_save.h"
#include "save/async_snapshot.h"
#include "save/commit.h"
#include "save/object_store_commit.h"
#include "save/plan_cache.h"
#include "save/registration.h"
#include "save/save_messages.h"
#include "save/save_plan.h"
#include "save/shard_writer.h"
#include "staging/staging_pool.h"
#include "util/align.h"
#include "util/rank_status.h"
#include "util/timing.h"

namespace ckpt {
namespace {

using internal::LocalItem;
using internal::Registration;
using internal::SecondsSince;

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
        options_(o),
        device_snapshot_(o.device_memory, o.device_snapshot_bytes) {}
  // A save in flight is waited for (its commit included).
  ~WriterImpl() override {
    if (in_flight_ != nullptr) (void)in_flight_->Wait();
    in_flight_.reset();
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
    Registration r;
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
      Registration& r = items_[it->second];
      if (r.item.kind != format::EntryKind::kObject) {
        return absl::AlreadyExistsError(
            absl::StrCat("'", name, "' is registered as a tensor"));
      }
      r.bytes = std::move(bytes);
    } else {
      Registration r;
      r.item.name = name;
      r.item.kind = format::EntryKind::kObject;
      r.item.dtype = DType::kUInt8;
      r.bytes = std::move(bytes);
      r.fp =
          internal::ItemFingerprint(r.item);  // kind, dtype, name: not the size
      index_[name] = items_.size();
      items_.push_back(std::move(r));
    }
    Registration& r = items_[index_[name]];
    r.item.shape = {r.bytes.size()};
    r.item.region = FlatRange{0, r.bytes.size()};
    // No pointer into r.bytes is kept: a short string lives inside the
    // Registration record, which moves when items_ grows (Save takes it).
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

  // Plan: cache_.Plan (plan_cache.h), which leaves cache_ valid.

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

  // WriteShard with device tensors staged through the pool, a few buffers
  // ahead of the writer, so that their copies overlap the writes.
  std::string WriteShardStaged(const PendingSave& pending,
                               const SaveOptions& options, SaveResult* result);
  // Staging (the machinery is async_save.h). The save in flight, if
  // any, is waited for, or refused with options.fail_if_busy.
  absl::Status AwaitInFlight(const SaveOptions& options);
  // The staging pool, made on first need with buffers of at least
  // `segment_bytes`; kept for the Writer's lifetime.
  absl::StatusOr<internal::StagingPool*> Pool(uint64_t segment_bytes);
  // A SaveAsync from its snapshot to its commit (async_snapshot.h).
  struct AsyncJob;
  // Takes *pending only on success.
  absl::StatusOr<std::shared_ptr<AsyncJob>> MakeAsyncJob(
      PendingSave* pending, const SaveOptions& options);
  // The phases of a SaveAsync in the background: writing the job's shard,
  // and the commit's collectives on `comm`.
  internal::AsyncSave::WriteFn AsyncWrite(std::shared_ptr<AsyncJob> job);
  internal::AsyncSave::CommitFn AsyncCommit(std::shared_ptr<AsyncJob> job,
                                            Communicator* comm);

  SingleProcessCommunicator single_;
  Communicator* comm_;
  Storage* storage_;
  DeviceMemory* device_memory_;
  Options options_;
  std::unique_ptr<internal::StagingPool> pool_;
  std::shared_ptr<internal::AsyncSave> in_flight_;
  internal::DeviceSnapshotMemory device_snapshot_;
  std::vector<Registration> items_;
  absl::flat_hash_map<std::string, size_t> index_;
  internal::PlanCache cache_;
};

absl::StatusOr<WriterImpl::PendingSave> WriterImpl::Prepare(
    const std::string& root, uint64_t step, const SaveOptions& options) {
  PendingSave p;
  p.root = root;
  p.dir_name = format::StepDirName(step);
  p.final_dir = JoinPath(root, p.dir_name);
  CKPT_ASSIGN_OR_RETURN(
      std::string msg,
      internal::OnRankZero(comm_, [&]() -> absl::StatusOr<std::string> {
        CKPT_ASSIGN_OR_RETURN(
            internal::SavePrep prep,
            internal::BeginSave(storage_, root, step, comm_->size(),
                                options.overwrite, cache_.global_fp(),
                                &p.save_lock));
        return internal::EncodeSavePrep(prep);
      }));
  CKPT_ASSIGN_OR_RETURN(internal::SavePrep prep, internal::DecodeSavePrep(msg));
  p.tmp = prep.tmp_dir;
  p.info = internal::CheckpointInfoOf(prep, step, comm_->size());
  if (comm_->rank() == 0) p.plan_section = cache_.plan_section();
  return p;
}

std::vector<internal::WriteItem> WriterImpl::Snapshot() const {
  std::vector<internal::WriteItem> writes;
  writes.reserve(cache_.writes().size());
  for (uint32_t i : cache_.writes()) {
    const Registration& r = items_[i];
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
      internal::OnRankZero(comm, [&]() -> absl::StatusOr<std::string> {
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
          return internal::CommitCheckpoint(storage_, pending.root, pending.tmp,
                                            m, options.overwrite,
                                            options.keep_last);
        }();
        if (!status.ok()) {
          (void)internal::DiscardSave(
              storage_, pending.tmp,
              pending.info);  // best effort; the error is what matters
          return status;
        }
        return internal::EncodeCommitSummary(summary);
      }));
  return internal::DecodeCommitSummary(msg);
}

absl::StatusOr<SaveResult> WriterImpl::Save(const std::string& root,
                                            uint64_t step,
                                            const SaveOptions& options) {
  CKPT_RETURN_IF_ERROR(ValidateOptions(options));
  CKPT_RETURN_IF_ERROR(AwaitInFlight(options));
  SaveResult result;
  auto t0 = std::chrono::steady_clock::now();
  CKPT_ASSIGN_OR_RETURN(result.plan_cache_hit,
                        cache_.Plan(comm_, storage_, root, options, items_));
  result.plan_seconds = SecondsSince(t0);

  CKPT_ASSIGN_OR_RETURN(PendingSave pending, Prepare(root, step, options));
  auto t1 = std::chrono::steady_clock::now();
  const std::string report = WriteShardStaged(pending, options, &result);
  result.write_seconds = SecondsSince(t1);

  auto t2 = std::chrono::steady_clock::now();
  CKPT_ASSIGN_OR_RETURN(internal::CommitSummary summary,
                        CommitAcrossRanks(pending, report, options));
  result.commit_seconds = SecondsSince(t2);
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
  buffer = internal::AlignUp(buffer, a);
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
  std::unique_ptr<internal::AsyncSnapshot> snapshot;
  uint64_t local_stored_bytes = 0;
  double write_seconds = 0;
};

absl::StatusOr<std::shared_ptr<WriterImpl::AsyncJob>> WriterImpl::MakeAsyncJob(
    PendingSave* pending, const SaveOptions& options) {
  auto job = std::make_shared<AsyncJob>();
  job->options = options;
  job->options.device_ready =
      nullptr;  // the caller's; used by the snapshot only
  const uint64_t segment = internal::StagingSegmentBytes(options);
  CKPT_ASSIGN_OR_RETURN(internal::StagingPool * pool, Pool(segment));
  CKPT_ASSIGN_OR_RETURN(
      job->snapshot,
      internal::MakeAsyncSnapshot(items_, cache_.writes(), pool, device_memory_,
                                  &device_snapshot_, options, segment));
  job->pending = std::move(*pending);
  return job;
}

internal::AsyncSave::WriteFn WriterImpl::AsyncWrite(
    std::shared_ptr<AsyncJob> job) {
  return [this, job] {
    const auto t = std::chrono::steady_clock::now();
    std::string report = WriteShard(job->pending, job->snapshot->writes,
                                    job->options, &job->local_stored_bytes);
    job->write_seconds = SecondsSince(t);
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
    r.commit_seconds = SecondsSince(t);
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
  CKPT_ASSIGN_OR_RETURN(partial.plan_cache_hit,
                        cache_.Plan(comm_, storage_, root, options, items_));
  partial.plan_seconds = SecondsSince(t0);
  CKPT_ASSIGN_OR_RETURN(PendingSave pending, Prepare(root, step, options));
  // Who runs the commit's collectives: a dedicated communicator in the
  // background, the trivial one of a single process in the background, or
  // the trainer's own inside Wait() (writer.h).
  Communicator* background = options_.background_comm;
  if (background == nullptr && comm_ == &single_) background = &single_;
  Communicator* const commit_comm = background != nullptr ? background : comm_;
  const auto snapshot_start = std::chrono::steady_clock::now();
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
  partial.device_snapshot_bytes = job->snapshot->device_snapshot_bytes;
  in_flight_ = std::make_shared<internal::AsyncSave>(
      std::move(job->snapshot->stager), job->snapshot->foreground_items,
      partial, AsyncWrite(job), AsyncCommit(job, commit_comm),
      background != nullptr, options_.background_nice);
  in_flight_->Start();
  in_flight_->set_stall_seconds(SecondsSince(t0), SecondsSince(snapshot_start));
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

#include "save/async_save.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

namespace ckpt {

absl::StatusOr<SaveResult> SaveHandle::Wait() {
  if (save_ == nullptr)
    return absl::FailedPreconditionError("empty SaveHandle");
  return save_->Wait();
}

bool SaveHandle::Done() const { return save_ == nullptr || save_->Done(); }

namespace internal {

namespace {

// Raises the calling thread's nice value by `nice` (Linux: the nice value
// is a thread's, and threads started from it inherit it). Best effort.
void LowerPriority(int nice) {
  if (nice <= 0) return;
  errno = 0;
  const int now = getpriority(PRIO_PROCESS, 0);
  if (errno != 0) return;
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)),
                    std::min(now + nice, 19));
}

}  // namespace

AsyncSave::AsyncSave(std::unique_ptr<SaveStager> stager,
                     size_t foreground_items, SaveResult partial, WriteFn write,
                     CommitFn commit, bool commit_in_background,
                     int background_nice)
    : stager_(std::move(stager)),
      foreground_items_(foreground_items),
      partial_(std::move(partial)),
      write_(std::move(write)),
      commit_(std::move(commit)),
      commit_in_background_(commit_in_background),
      nice_(background_nice) {}

AsyncSave::~AsyncSave() {
  if (thread_.joinable()) thread_.join();
  if (stage_thread_.joinable()) stage_thread_.join();
}

void AsyncSave::Start() {
  // The background reads its own copy: partial_'s staging figures are
  // written below while it runs.
  // The background (the shard's writer) starts once the foreground items
  // are staged, or as soon as staging them needs a buffer only the writer
  // can free: when the snapshot fits in the staging memory, the trainer's
  // copies do not share the cores and the memory bandwidth with the
  // writer's reads and checksums (on 2 cores with 2 ranks, 5-10% of the
  // stall).
  auto start_background = [this] {
    if (!thread_.joinable())
      thread_ = std::thread([this, base = partial_] { Background(base); });
  };
  stager_->set_before_waiting(start_background);
  // An error fails the consumers' Acquire, so it reaches the shard report
  // (and Wait() on every rank); nothing to do with it here.
  (void)stager_->Run(foreground_items_);
  stager_->set_before_waiting(nullptr);
  start_background();
  partial_.peak_staging_bytes = stager_->peak_bytes();
  // The caller's ready event may go once this returns.
  stager_->ForgetReadyEvent();
  if (foreground_items_ < stager_->size()) {
    stage_thread_ = std::thread([this] { (void)stager_->Run(); });
  }
}

void AsyncSave::Background(SaveResult base) {
  LowerPriority(nice_);
  std::string report = write_();
  // The writer's threads are done with the staged bytes (all of them on
  // success); a Run still waiting for space stops.
  stager_->Finish();
  absl::StatusOr<SaveResult> result = absl::UnknownError("not committed");
  if (commit_in_background_) result = commit_(report, std::move(base));
  {
    MutexLock l(&mu_);
    report_ = std::move(report);
    background_result_ = std::move(result);
    background_done_ = true;
  }
  cv_.SignalAll();
}

absl::StatusOr<SaveResult> AsyncSave::Wait() {
  MutexLock w(&wait_mu_);
  if (waited_) return result_;
  std::string report;
  absl::StatusOr<SaveResult> background = absl::UnknownError("not committed");
  {
    MutexLock l(&mu_);
    while (!background_done_) cv_.Wait(&mu_);
    report = report_;
    background = background_result_;
  }
  if (thread_.joinable()) thread_.join();
  // The writer is done, so is the staging (Finish stopped what was left).
  if (stage_thread_.joinable()) stage_thread_.join();
  partial_.peak_staging_bytes = stager_->peak_bytes();
  // Start() returned before the handle existed, so partial_ is final.
  result_ =
      commit_in_background_ ? std::move(background) : commit_(report, partial_);
  if (result_.ok()) {
    result_->stall_seconds = partial_.stall_seconds;
    result_->snapshot_seconds = partial_.snapshot_seconds;
    result_->peak_staging_bytes = partial_.peak_staging_bytes;
    result_->staging_cap_bytes = partial_.staging_cap_bytes;
    result_->device_snapshot_bytes = partial_.device_snapshot_bytes;
  }
  waited_ = true;
  return result_;
}

bool AsyncSave::Done() const {
  MutexLock l(&mu_);
  return background_done_;
}

void DeviceStaging::Start(std::vector<WriteItem>* writes, StagingPool* pool,
                          DeviceMemory* dm, DeviceEvent* after,
                          uint64_t segment_bytes, int max_buffers) {
  for (WriteItem& w : *writes) {
    if (w.memory != MemoryKind::kCuda || w.source != nullptr ||
        w.staged != nullptr)
      continue;
    if (stager_ == nullptr) {
      stager_ = std::make_unique<SaveStager>(pool, dm, after, segment_bytes,
                                             max_buffers);
    }
    StageInput in;
    in.name = w.item->name;
    in.size = RegionElements(w.item->region) * DTypeSize(w.item->dtype);
    in.data = w.data;
    in.memory = w.memory;
    in.device = w.device;
    w.staged = stager_->Add(std::move(in));
  }
  if (stager_ != nullptr)
    thread_ = std::thread([this] { status_ = stager_->Run(); });
}

absl::Status DeviceStaging::Stop() {
  if (stager_ == nullptr) return absl::OkStatus();
  stager_->Finish();
  if (thread_.joinable()) thread_.join();
  return status_;
}

}  // namespace internal
}  // namespace ckpt

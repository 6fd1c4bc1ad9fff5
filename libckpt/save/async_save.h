// Internal: the machinery of Writer::SaveAsync (the state behind a
// SaveHandle) and of the device staging of a synchronous Save. The Writer
// supplies its phases as functions; this file owns the threads.
//
// SaveAsync, on the trainer's thread: plan and prepare (collectives on the
// trainer's communicator), then AsyncSave::Start: the trainer's thread
// stages the snapshot (SaveStager::Run) and the background thread starts
// writing the shard once that is done, or as soon as the staging memory is
// full (then the writer frees buffers while the rest is staged); Start
// returns once every byte is staged. The background
// then finishes the shard (write, fsync) and, when the Writer allows it
// (single process or a dedicated background communicator), commits.
// Otherwise Wait() runs the commit on the trainer's thread.
#ifndef CKPT_LIBCKPT_SAVE_ASYNC_SAVE_H_
#define CKPT_LIBCKPT_SAVE_ASYNC_SAVE_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "ckpt/writer.h"
#include "save/shard_writer.h"
#include "staging/save_stager.h"
#include "util/mutex.h"

namespace ckpt::internal {

class AsyncSave {
 public:
  // Background: writes the shard; returns the encoded report (or error).
  using WriteFn = std::function<std::string()>;
  // Commits from the report (a collective); fills the result's commit
  // fields on top of `partial`.
  using CommitFn = std::function<absl::StatusOr<SaveResult>(
      const std::string& report, SaveResult partial)>;

  // `stager` holds the snapshot's items; the functions may keep state
  // alive through their captures. The commit runs in the background when
  // `commit_in_background`, else in Wait(). The background thread (and the
  // writer's threads it starts) run `background_nice` nice levels below
  // the caller (Writer::Options::background_nice).
  // Items [0, foreground_items) of `stager` are staged by Start on the
  // caller's thread; the rest (copies of a device snapshot, which the
  // caller may not touch anyway) on a thread of their own afterwards.
  AsyncSave(std::unique_ptr<SaveStager> stager, size_t foreground_items,
            SaveResult partial, WriteFn write, CommitFn commit,
            bool commit_in_background, int background_nice);
  // Waits for the background thread (a save must have been Wait()ed by the
  // Writer before; this only guards against leaks).
  ~AsyncSave();

  // Stages the snapshot's foreground items on the calling thread and starts
  // the background thread (after them, or when staging them needs a buffer
  // the writer must free first); returns once those are staged (or failed:
  // the error then reaches Wait() through the shard report), starting the
  // staging of the rest. Call once.
  void Start();
  void set_stall_seconds(double stall, double snapshot) {
    partial_.stall_seconds = stall;
    partial_.snapshot_seconds = snapshot;
  }

  // See SaveHandle. Thread-safe; the commit runs once.
  absl::StatusOr<SaveResult> Wait();
  bool Done() const;

 private:
  void Background(SaveResult base);

  std::unique_ptr<SaveStager> stager_;
  const size_t foreground_items_;
  SaveResult partial_;
  WriteFn write_;
  CommitFn commit_;
  const bool commit_in_background_;
  const int nice_;
  std::thread thread_;
  std::thread stage_thread_;  // the rest of the items; joined by Wait

  Mutex wait_mu_;  // one Wait at a time
  bool waited_ ABSL_GUARDED_BY(wait_mu_) = false;
  absl::StatusOr<SaveResult> result_ ABSL_GUARDED_BY(wait_mu_) =
      absl::UnknownError("not waited");

  mutable Mutex mu_;
  CondVar cv_;
  bool background_done_ ABSL_GUARDED_BY(mu_) = false;
  std::string report_ ABSL_GUARDED_BY(mu_);
  absl::StatusOr<SaveResult> background_result_ ABSL_GUARDED_BY(mu_) =
      absl::UnknownError("not committed");
};

// Device staging of a synchronous Save: the device items of `writes` get
// their bytes from a SaveStager that runs on its own thread, at most
// `max_buffers` buffers ahead of the writer, so device-to-host copies
// overlap hashing and writing. Host items are untouched.
class DeviceStaging {
 public:
  DeviceStaging() = default;
  // Waits for the staging thread (after Finish).
  ~DeviceStaging() { (void)Stop(); }
  // Starts staging if any item of `writes` is in device memory (and not a
  // source); sets their `staged`. `pool`, `dm`, `after` as SaveStager.
  void Start(std::vector<WriteItem>* writes, StagingPool* pool,
             DeviceMemory* dm, DeviceEvent* after, uint64_t segment_bytes,
             int max_buffers);
  // After the writer returned: stops staging and joins the thread.
  // Returns the staging error, if any; 0 bytes peak when nothing staged.
  absl::Status Stop();
  uint64_t peak_bytes() const { return stager_ ? stager_->peak_bytes() : 0; }

 private:
  std::unique_ptr<SaveStager> stager_;
  std::thread thread_;
  absl::Status status_;
};

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_SAVE_ASYNC_SAVE_H_

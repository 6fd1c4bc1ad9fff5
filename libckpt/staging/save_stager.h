// Internal: the staged pipeline. A SaveStager copies the bytes of the items a
// rank writes (host memory by memcpy, device memory by asynchronous
// device-to-host copies, TensorSources by calling them) into buffers of a
// StagingPool, while the shard writer's threads hash and write what is
// already staged. A buffer goes back to the pool as soon as every byte staged
// in it has been written, so staging never holds more than the pool's cap
// (or the SaveStager's own limit) and stalls, counted, until space frees up.
//
// Used by Writer::Save for device tensors (the copies overlap the writes)
// and by Writer::SaveAsync for everything (the staged bytes are the
// snapshot: the caller's buffers may change once Run() returned).
//
//   SaveStager stager(pool, dm, after, segment, limit);
//   StagedBytes* a = stager.Add(...);          // one per item, before Run
//   std::thread t([&] { status = stager.Run(); });
//   ... consumers: a->Acquire(off, n) ... write ... a->Release(off, n)
//   stager.Finish();                            // once consumers are done
#ifndef CKPT_LIBCKPT_STAGING_SAVE_STAGER_H_
#define CKPT_LIBCKPT_STAGING_SAVE_STAGER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "ckpt/device_memory.h"
#include "ckpt/types.h"
#include "ckpt/writer.h"
#include "staging/staging_pool.h"
#include "util/mutex.h"

namespace ckpt::internal {

class SaveStager;

// What to stage for one item: `size` bytes from host or device `data`, or
// from `source`. Pointers are not owned and must stay valid until Run()
// returned.
struct StageInput {
  std::string name;  // for error messages
  uint64_t size = 0;
  const void* data = nullptr;
  MemoryKind memory = MemoryKind::kHost;
  int device = 0;
  const TensorSource* source = nullptr;
};

// The staged bytes of one item, as the shard writer sees them. Thread-safe.
class StagedBytes {
 public:
  // Host pointer to bytes [offset, offset + n) of the item, blocking until
  // they are staged (and their device copy completed). The error of the
  // staging, if it failed. REQUIRES: the range lies within one segment
  // (offset and n multiples of the segment size, except at the item's end).
  absl::StatusOr<const char*> Acquire(uint64_t offset, uint64_t n);
  // The consumer is done with [offset, offset + n): once every byte of a
  // buffer is released the buffer returns to the pool.
  void Release(uint64_t offset, uint64_t n);
  // The consumer failed with `status`: staging stops and every waiting or
  // later Acquire of the SaveStager's items returns `status`.
  void Abort(absl::Status status);

 private:
  friend class SaveStager;
  StagedBytes(SaveStager* stager, size_t index)
      : stager_(stager), index_(index) {}
  SaveStager* stager_;
  size_t index_;
};

class SaveStager {
 public:
  // `pool` and `dm` (null: no device items) are not owned and must outlive
  // the SaveStager. Device copies are ordered after `after` (may be null; not
  // owned; must stay valid until Run returned). Segments of an item are
  // multiples of `segment_bytes` (<= pool->buffer_bytes()). At most
  // `max_buffers` buffers are held at once (0: the pool's maximum). Host
  // bytes are copied by `copy_threads` threads (>= 1; Run's thread and
  // copy_threads - 1 short-lived helpers per buffer).
  SaveStager(StagingPool* pool, DeviceMemory* dm, DeviceEvent* after,
             uint64_t segment_bytes, int max_buffers, int copy_threads = 1);
  // REQUIRES: Finish() was called if Run() was.
  ~SaveStager();

  // Adds an item; the pointer is owned by the SaveStager. REQUIRES: before Run.
  StagedBytes* Add(StageInput input);

  // Stages the items in order, on the calling thread, up to (not
  // including) item `end` (at most the number of items), continuing where
  // the previous Run stopped; returns once those bytes are in staging
  // memory (device copies complete) or on the first error, which every
  // Acquire then returns too. Runs never overlap.
  absl::Status Run(size_t end = static_cast<size_t>(-1));
  // `f` (null: none) is called on Run's thread, once, when Run is about to
  // need a buffer that no consumer released yet: no buffer free in the
  // pool, or this SaveStager's limit of held buffers reached. A caller
  // that starts its consumers in `f` (and after Run, if `f` was not
  // called) never deadlocks, and lets Run's copies have the machine to
  // themselves when everything fits. REQUIRES: no Run is running.
  void set_before_waiting(std::function<void()> f) {
    before_waiting_ = std::move(f);
  }
  // Later device copies are not ordered after `after` (the caller's event
  // may be gone; what remains to stage does not depend on it). REQUIRES:
  // no Run is running.
  void ForgetReadyEvent() { after_ = nullptr; }
  size_t size() const { return items_.size(); }

  // Called when the consumers are done (all their threads returned),
  // successfully or not: stops a Run still waiting for space and returns
  // every buffer to the pool. Run() may still be running; wait for it after.
  void Finish();

  // Seconds Run() spent waiting for staging space (pool or limit).
  double stall_seconds() const;
  // Most bytes of staging buffers this SaveStager held at once.
  uint64_t peak_bytes() const;

 private:
  friend class StagedBytes;
  struct Buffer {
    StagingPool::Lease lease;
    // The buffer's memory, read once: Finish() may release the lease
    // while a failing save's Run() still fills it (the pool, and so the
    // memory, outlives the SaveStager, and no other save uses the pool then).
    char* data = nullptr;
    uint64_t unreleased = 0;  // staged bytes not yet released
    // Device copies into it; empty for host bytes. Set when published.
    std::vector<std::shared_ptr<DeviceEvent>> ready;
  };
  struct Segment {
    uint64_t begin = 0, end = 0;  // item bytes
    char* host = nullptr;
    Buffer* buffer = nullptr;
  };
  struct Item {
    StageInput input;
    std::unique_ptr<StagedBytes> view;
    std::vector<Segment> segments;  // sorted by begin
  };

  // Copies host bytes into a buffer on copy_threads_ threads.
  struct HostCopy {
    char* dst;
    const char* src;
    uint64_t n;
  };
  // What one buffer receives: its segments (with their items), the host
  // copies, the device copies of each device, and the bytes staged.
  struct Packed {
    std::vector<std::pair<size_t, Segment>> segments;
    std::vector<HostCopy> host;
    std::vector<std::pair<int, std::vector<DeviceCopy>>> device_copies;
    uint64_t bytes = 0;
    std::vector<DeviceCopy>& CopiesOf(int device);
  };
  absl::Status PackBuffer(Buffer* b, size_t* item, uint64_t* offset, size_t end,
                          Packed* packed);
  absl::Status StageBuffer(size_t* item, uint64_t* offset, size_t end);
  void CopyHost(const std::vector<HostCopy>& copies) const;
  absl::StatusOr<Buffer*> NextBuffer();
  absl::StatusOr<DeviceStream*> StreamFor(int device);
  void Fail(absl::Status status);
  absl::StatusOr<const char*> AcquireBytes(size_t item, uint64_t offset,
                                           uint64_t n);
  void ReleaseBytes(size_t item, uint64_t offset, uint64_t n);

  StagingPool* const pool_;
  DeviceMemory* const dm_;
  DeviceEvent* after_;  // Run's thread only
  const uint64_t segment_bytes_;
  const int max_buffers_;
  const int copy_threads_;
  std::vector<Item> items_;
  // One stream per device used, created by Run.
  std::vector<std::pair<int, std::unique_ptr<DeviceStream>>> streams_;
  std::vector<std::shared_ptr<DeviceEvent>> pending_;  // Run's thread only
  std::function<void()> before_waiting_;               // Run's thread only
  size_t next_item_ = 0;      // where the next Run continues (Run's thread)
  uint64_t next_offset_ = 0;  // within next_item_

  mutable Mutex mu_;
  CondVar changed_;
  std::deque<Buffer> buffers_ ABSL_GUARDED_BY(mu_);  // stable addresses
  int held_ ABSL_GUARDED_BY(mu_) = 0;
  int peak_held_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  double stall_seconds_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_STAGING_SAVE_STAGER_H_

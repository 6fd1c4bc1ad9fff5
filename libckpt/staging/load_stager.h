// Internal: the load side of the staged pipeline. Each I/O thread of a load
// with device destinations reads (and verifies, and decodes) a granule into
// one of two pinned staging buffers, queues the host-to-device copies out of
// it on its own stream, and goes on reading the next granule into the other
// buffer while those copies run. A buffer is reused only after the copies
// out of it completed, and a destination counts as loaded only then.
#ifndef CKPT_LIBCKPT_STAGING_LOAD_STAGER_H_
#define CKPT_LIBCKPT_STAGING_LOAD_STAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/device_memory.h"
#include "staging/staging_pool.h"

namespace ckpt::internal {

// A contiguous piece of a copy: `bytes` bytes from src + src_off to
// dst + dst_off.
struct CopyRun {
  uint64_t src_off, dst_off, bytes;
};

// Merges consecutive runs of equal length whose source and destination
// offsets advance by constant pitches into one strided DeviceCopy (one
// device call for a column block of a matrix, not one per row).
std::vector<DeviceCopy> CoalesceRuns(const std::vector<CopyRun>& runs,
                                     const char* src, char* dst);

// Not thread-safe: one per I/O thread. `pool`, `dm` and `after` (may be
// null) are not owned and must outlive it.
class LoadStager {
 public:
  using Done = std::function<void(size_t request, uint64_t bytes)>;
  LoadStager(StagingPool* pool, DeviceMemory* dm, DeviceEvent* after, Done done)
      : pool_(pool), dm_(dm), after_(after), done_(std::move(done)) {}
  // Waits for queued copies (errors are not reported: call Drain first).
  ~LoadStager();

  // A pinned buffer of at least `n` bytes for the next granule, free of
  // earlier copies; null when n exceeds the pool's buffers (the caller then
  // copies synchronously).
  absl::StatusOr<char*> Next(uint64_t n);
  // Queues copies out of the buffer returned by Next; `request` is done
  // with `bytes` more once they completed.
  absl::Status Copy(int device, const std::vector<DeviceCopy>& copies,
                    size_t request, uint64_t bytes);
  // Records the completion of the copies queued since Next.
  absl::Status Submit();
  // Waits for every queued copy and reports the completions.
  absl::Status Drain();

 private:
  struct Slot {
    StagingPool::Lease lease;
    std::vector<std::unique_ptr<DeviceEvent>> events;
    std::vector<std::pair<size_t, uint64_t>> done;
  };
  absl::Status Complete(Slot& slot);
  absl::StatusOr<DeviceStream*> StreamFor(int device);

  StagingPool* pool_;
  DeviceMemory* dm_;
  DeviceEvent* after_;
  Done done_;
  Slot slots_[2];
  int current_ = -1;
  std::vector<int> devices_;  // devices with copies in the current slot
  std::vector<std::pair<int, std::unique_ptr<DeviceStream>>> streams_;
};

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_STAGING_LOAD_STAGER_H_

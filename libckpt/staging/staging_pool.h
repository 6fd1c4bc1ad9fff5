// staging/: pinned host buffers between device memory and the I/O threads,
// for saves (save_stager.h) and loads (load_stager.h). This header: the
// bounded pool of host staging buffers that device tensors
// (every save and load with device memory) and asynchronous snapshots go
// through.
//
// Buffers are allocated through DeviceMemory::AllocateHost (page-locked for
// CUDA) either ahead of need (Reserve) or on first need (Acquire), are
// faulted in when allocated (every page touched, so no save pays a page
// fault in its copies), and are kept until the pool is destroyed: a Writer
// or Reader keeps one pool for its lifetime, so no save allocates, registers
// or frees host memory once the pool has grown to what the saves need. The
// pool never holds more than cap_bytes.
//
// A buffer belongs to exactly one Lease from Acquire() until the Lease is
// destroyed; only then can it be handed out again. This is what keeps a
// staging buffer from being reused while its bytes are still being written
// (dirty snapshots are the classic async-checkpoint bug).
#ifndef CKPT_LIBCKPT_STAGING_STAGING_POOL_H_
#define CKPT_LIBCKPT_STAGING_STAGING_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "ckpt/device_memory.h"
#include "util/mutex.h"

namespace ckpt::internal {

// Thread-safe. A Lease is a movable value that may be destroyed on any
// thread. REQUIRES: the pool outlives its leases.
class StagingPool {
 public:
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { Release(); }

    bool valid() const { return pool_ != nullptr; }
    char* data() const { return data_; }
    size_t size() const;
    void Release();

   private:
    friend class StagingPool;
    Lease(StagingPool* pool, int index, char* data)
        : pool_(pool), index_(index), data_(data) {}
    StagingPool* pool_ = nullptr;
    int index_ = -1;
    char* data_ = nullptr;
  };

  static constexpr size_t kAlignment = 4096;
  static constexpr uint64_t kDefaultCapBytes = 4ull << 30;
  static constexpr uint64_t kDefaultBufferBytes = 64ull << 20;

  // `dm` (not owned, may be null: plain aligned memory) allocates the
  // buffers. InvalidArgument unless 0 < buffer_bytes <= cap_bytes.
  static absl::StatusOr<std::unique_ptr<StagingPool>> Create(
      DeviceMemory* dm, uint64_t buffer_bytes, uint64_t cap_bytes);
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;
  // REQUIRES: no Lease outstanding (checked; aborts otherwise).
  ~StagingPool();

  // A free buffer, allocating one while fewer than max_buffers() exist, else
  // blocking until one is returned. When allocation fails with buffers
  // already allocated, the pool stops growing and waits instead; with none,
  // the allocation error is returned.
  absl::StatusOr<Lease> Acquire();
  // Allocates (and faults in) buffers until at least min(bytes, cap_bytes)
  // are allocated, so that later Acquires up to that amount only take
  // buffers. An allocation error stops the growth: with buffers already
  // allocated it is ignored (Acquire waits for those instead), with none it
  // is returned.
  absl::Status Reserve(uint64_t bytes);

  uint64_t buffer_bytes() const { return buffer_bytes_; }
  uint64_t cap_bytes() const { return cap_bytes_; }
  int max_buffers() const { return max_buffers_; }
  uint64_t allocated_bytes() const;
  // Whether a buffer is free now (Acquire returns it without allocating or
  // waiting for a Lease to end).
  bool HasFreeBuffer() const;
  // Most bytes leased at once since the last ResetPeak().
  uint64_t peak_leased_bytes() const;
  void ResetPeak();

 private:
  StagingPool(DeviceMemory* dm, uint64_t buffer_bytes, uint64_t cap_bytes);
  void Return(int index);
  // Adds one buffer to the pool; false (with `limit_` lowered) when it
  // cannot be had and others exist; the error when none exist.
  absl::StatusOr<bool> GrowLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  DeviceMemory* const dm_;
  const uint64_t buffer_bytes_;
  const uint64_t cap_bytes_;
  const int max_buffers_;
  mutable Mutex mu_;
  CondVar returned_;
  int limit_ ABSL_GUARDED_BY(mu_);  // max_buffers_, lowered if allocation fails
  std::vector<char*> buffers_ ABSL_GUARDED_BY(mu_);
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);
  int leased_ ABSL_GUARDED_BY(mu_) = 0;
  int peak_leased_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_STAGING_STAGING_POOL_H_

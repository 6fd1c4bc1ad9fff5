// A fixed set of page-locked host buffers that device-to-host copies of an
// asynchronous save are staged through.
//
// Staging buffers are the part of an async save that is easiest to get
// wrong: if a buffer is handed to a second copy while the first one's bytes
// are still being written to storage, the checkpoint silently contains the
// second tensor's bytes. The pool makes that impossible by construction: a
// buffer belongs to exactly one Lease from Acquire() until that Lease is
// destroyed or Release()d, and only then can it be handed out again.
//
// Example:
//   CKPT_ASSIGN_OR_RETURN(auto pool, PinnedStagingPool::Create(64 << 20, 4));
//   PinnedStagingPool::Lease lease = pool->Acquire();   // may block
//   cudaMemcpyAsync(lease.data(), dev_ptr, n, cudaMemcpyDeviceToHost, s);
//   ... hand `lease` (moved) to the writer thread, which destroys it once
//   the bytes are durable; the buffer then goes back to the pool.
#ifndef CKPT_GPU_PINNED_POOL_H_
#define CKPT_GPU_PINNED_POOL_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "ckpt/mutex.h"

namespace ckpt::gpu {

// Thread-safe: Acquire(), TryAcquire(), AcquireFor() and the accessors may
// be called concurrently from any threads. A Lease is a plain movable value
// (not itself synchronized); it may be moved to, and destroyed on, a thread
// other than the one that acquired it.
class PinnedStagingPool {
 public:
  // Exclusive use of one buffer of the pool. Move-only. Destroying it (or
  // calling Release()) returns the buffer to the pool and wakes one blocked
  // Acquire(). A default-constructed or moved-from Lease is empty: valid()
  // is false and bytes() is an empty span.
  //
  // REQUIRES: the pool outlives every Lease it handed out.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    // Releases the buffer this Lease held (if any), then takes `other`'s.
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();

    bool valid() const { return pool_ != nullptr; }

    // The whole buffer: pool->buffer_bytes() bytes, aligned to
    // PinnedStagingPool::kAlignment. Valid until the Lease is released;
    // writing through it afterwards races with the buffer's next owner.
    absl::Span<std::byte> bytes() const { return bytes_; }
    std::byte* data() const { return bytes_.data(); }
    size_t size() const { return bytes_.size(); }

    // Which buffer of the pool this is, in [0, num_buffers()); -1 when
    // empty. Stable for the pool's lifetime, so callers can keep per-buffer
    // state (e.g. a CUDA event) in an array indexed by it.
    int index() const { return index_; }

    // Returns the buffer to the pool now; the Lease becomes empty. No-op on
    // an empty Lease.
    void Release();

   private:
    friend class PinnedStagingPool;
    Lease(PinnedStagingPool* pool, int index, absl::Span<std::byte> bytes)
        : pool_(pool), index_(index), bytes_(bytes) {}

    PinnedStagingPool* pool_ = nullptr;
    int index_ = -1;
    absl::Span<std::byte> bytes_;
  };

  // Alignment of every buffer. Page-sized, so buffers also satisfy the
  // alignment that O_DIRECT writes require.
  static constexpr size_t kAlignment = 4096;

  // Allocates `num_buffers` page-locked buffers of `buffer_bytes` each with
  // cudaHostAlloc(cudaHostAllocPortable), so every CUDA context of the
  // process sees them as pinned.
  //
  // Errors: InvalidArgument when buffer_bytes == 0 or num_buffers <= 0.
  // When cudaHostAlloc fails the error comes from CKPT_CUDA_RETURN_IF_ERROR:
  // FailedPrecondition on a machine without a usable device or driver,
  // ResourceExhausted when the memory cannot be pinned. On error nothing
  // stays allocated.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PinnedStagingPool>>
  Create(size_t buffer_bytes, int num_buffers);

  // Same contract as Create(), but the buffers are ordinary pageable host
  // memory aligned to kAlignment and no CUDA call is made, so the lease
  // logic can be tested on machines without a GPU. pinned() is false.
  // Errors: InvalidArgument as Create(); ResourceExhausted when allocation
  // fails.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PinnedStagingPool>>
  CreateForTesting(size_t buffer_bytes, int num_buffers);

  PinnedStagingPool(const PinnedStagingPool&) = delete;
  PinnedStagingPool& operator=(const PinnedStagingPool&) = delete;

  // Frees the buffers. Errors from cudaFreeHost cannot be reported and are
  // ignored.
  // REQUIRES: no Lease is outstanding. Violating this would leave a Lease
  // pointing into freed memory, so it aborts the process with a message
  // instead.
  ~PinnedStagingPool();

  // Blocks until a buffer is free and returns a Lease on it. Never returns
  // an empty Lease. Waiters are woken one per released buffer; there is no
  // fairness guarantee among them.
  // Deadlocks if the calling thread itself holds every buffer.
  Lease Acquire();

  // Returns a Lease on a free buffer, or an empty Lease when every buffer is
  // leased. Never blocks.
  Lease TryAcquire();

  // Like Acquire(), but gives up after `timeout` and returns an empty Lease.
  // A non-positive timeout behaves like TryAcquire().
  Lease AcquireFor(absl::Duration timeout);

  size_t buffer_bytes() const { return buffer_bytes_; }
  int num_buffers() const { return static_cast<int>(buffers_.size()); }
  // True when the buffers are page-locked (made by Create()).
  bool pinned() const { return pinned_; }
  // Number of buffers not leased right now. A snapshot: it may be stale by
  // the time the caller looks at it.
  int num_available() const;

 private:
  PinnedStagingPool(size_t buffer_bytes, bool pinned);
  static absl::StatusOr<std::unique_ptr<PinnedStagingPool>> CreateImpl(
      size_t buffer_bytes, int num_buffers, bool pinned);

  // Takes a free buffer. REQUIRES: !free_.empty().
  Lease TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Called by Lease.
  void Return(int index);

  const size_t buffer_bytes_;
  const bool pinned_;
  // Written only while the pool is being built, read-only afterwards.
  std::vector<std::byte*> buffers_;

  mutable Mutex mu_;
  CondVar buffer_returned_;
  // Indices of buffers not leased. Used as a stack: the most recently
  // returned buffer is handed out next, while it is still warm in cache.
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);
  // leased_[i] is true while buffer i belongs to a Lease. Checks that a
  // buffer is never returned twice or handed out while leased.
  std::vector<bool> leased_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::gpu

#endif  // CKPT_GPU_PINNED_POOL_H_

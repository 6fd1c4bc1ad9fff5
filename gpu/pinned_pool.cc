#include "ckpt/gpu/pinned_pool.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ckpt/gpu/status_macros.h"

namespace ckpt::gpu {
namespace {

// The pool's invariants are what keeps a staging buffer from being reused
// while its bytes are in flight. Breaking one means memory corruption is
// next, so the check stays on in release builds; it costs a branch.
void CheckOrDie(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "ckpt::gpu::PinnedStagingPool: %s\n", what);
  std::abort();
}

}  // namespace

// ---- Lease ----------------------------------------------------------------

PinnedStagingPool::Lease::Lease(Lease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      index_(std::exchange(other.index_, -1)),
      bytes_(std::exchange(other.bytes_, {})) {}

PinnedStagingPool::Lease& PinnedStagingPool::Lease::operator=(
    Lease&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = std::exchange(other.pool_, nullptr);
    index_ = std::exchange(other.index_, -1);
    bytes_ = std::exchange(other.bytes_, {});
  }
  return *this;
}

PinnedStagingPool::Lease::~Lease() { Release(); }

void PinnedStagingPool::Lease::Release() {
  if (pool_ == nullptr) return;
  PinnedStagingPool* pool = std::exchange(pool_, nullptr);
  const int index = std::exchange(index_, -1);
  bytes_ = {};
  pool->Return(index);
}

// ---- PinnedStagingPool ----------------------------------------------------

PinnedStagingPool::PinnedStagingPool(size_t buffer_bytes, bool pinned)
    : buffer_bytes_(buffer_bytes), pinned_(pinned) {}

absl::StatusOr<std::unique_ptr<PinnedStagingPool>> PinnedStagingPool::Create(
    size_t buffer_bytes, int num_buffers) {
  return CreateImpl(buffer_bytes, num_buffers, /*pinned=*/true);
}

absl::StatusOr<std::unique_ptr<PinnedStagingPool>>
PinnedStagingPool::CreateForTesting(size_t buffer_bytes, int num_buffers) {
  return CreateImpl(buffer_bytes, num_buffers, /*pinned=*/false);
}

absl::StatusOr<std::unique_ptr<PinnedStagingPool>>
PinnedStagingPool::CreateImpl(size_t buffer_bytes, int num_buffers,
                              bool pinned) {
  if (buffer_bytes == 0) {
    return absl::InvalidArgumentError(
        "PinnedStagingPool: buffer_bytes must be > 0");
  }
  if (num_buffers <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PinnedStagingPool: num_buffers must be > 0, got ", num_buffers));
  }
  // std::aligned_alloc wants a multiple of the alignment.
  if (buffer_bytes > SIZE_MAX - (kAlignment - 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PinnedStagingPool: buffer_bytes too large: ", buffer_bytes));
  }
  const size_t alloc_bytes =
      (buffer_bytes + kAlignment - 1) / kAlignment * kAlignment;

  // Built before the buffers so that an early return frees those already
  // allocated (the destructor sees no outstanding lease).
  std::unique_ptr<PinnedStagingPool> pool(
      new PinnedStagingPool(buffer_bytes, pinned));
  pool->buffers_.reserve(num_buffers);
  for (int i = 0; i < num_buffers; ++i) {
    void* p = nullptr;
    if (pinned) {
      CKPT_CUDA_RETURN_IF_ERROR(
          cudaHostAlloc(&p, alloc_bytes, cudaHostAllocPortable));
    } else {
      p = std::aligned_alloc(kAlignment, alloc_bytes);
      if (p == nullptr) {
        return absl::ResourceExhaustedError(
            absl::StrCat("PinnedStagingPool: cannot allocate buffer ", i,
                         " of ", num_buffers, " (", alloc_bytes, " bytes)"));
      }
    }
    pool->buffers_.push_back(static_cast<std::byte*>(p));
  }

  {
    MutexLock lock(&pool->mu_);
    pool->leased_.assign(num_buffers, false);
    pool->free_.reserve(num_buffers);
    // Reversed so that buffer 0 is handed out first.
    for (int i = num_buffers - 1; i >= 0; --i) pool->free_.push_back(i);
  }
  return pool;
}

PinnedStagingPool::~PinnedStagingPool() {
  {
    MutexLock lock(&mu_);
    // During a failed CreateImpl() free_ is still empty and nothing leased.
    for (bool leased : leased_) {
      CheckOrDie(!leased, "destroyed while a Lease is outstanding");
    }
  }
  for (std::byte* p : buffers_) {
    if (pinned_) {
      (void)cudaFreeHost(p);
    } else {
      std::free(p);
    }
  }
}

PinnedStagingPool::Lease PinnedStagingPool::TakeLocked() {
  const int index = free_.back();
  free_.pop_back();
  CheckOrDie(!leased_[index], "free list holds a leased buffer");
  leased_[index] = true;
  return Lease(this, index,
               absl::Span<std::byte>(buffers_[index], buffer_bytes_));
}

void PinnedStagingPool::Return(int index) {
  {
    MutexLock lock(&mu_);
    CheckOrDie(index >= 0 && index < static_cast<int>(leased_.size()) &&
                   leased_[index],
               "returned a buffer that is not leased");
    leased_[index] = false;
    free_.push_back(index);
  }
  buffer_returned_.Signal();
}

PinnedStagingPool::Lease PinnedStagingPool::Acquire() {
  MutexLock lock(&mu_);
  while (free_.empty()) buffer_returned_.Wait(&mu_);
  return TakeLocked();
}

PinnedStagingPool::Lease PinnedStagingPool::TryAcquire() {
  MutexLock lock(&mu_);
  if (free_.empty()) return Lease();
  return TakeLocked();
}

PinnedStagingPool::Lease PinnedStagingPool::AcquireFor(absl::Duration timeout) {
  // Bounded so that an infinite timeout does not overflow the clock.
  const absl::Duration wait = std::clamp(timeout, absl::ZeroDuration(),
                                         absl::Hours(24 * 365 * 100));
  const auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(wait);
  MutexLock lock(&mu_);
  while (free_.empty()) {
    // WaitUntil returns true on timeout; re-check once in case a buffer
    // came back at the same moment.
    if (buffer_returned_.WaitUntil(&mu_, deadline)) {
      if (free_.empty()) return Lease();
    }
  }
  return TakeLocked();
}

int PinnedStagingPool::num_available() const {
  MutexLock lock(&mu_);
  return static_cast<int>(free_.size());
}

}  // namespace ckpt::gpu

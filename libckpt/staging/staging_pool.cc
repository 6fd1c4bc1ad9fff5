#include "staging/staging_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckpt::internal {
namespace {

// Breaking an invariant of the pool means a staging buffer could be reused
// while in flight: corruption is next, so the check stays on in release.
void CheckOrDie(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "ckpt::internal::StagingPool: %s\n", what);
  std::abort();
}

// Plain buffers are aligned to a huge page and asked to be backed by huge
// pages (fewer faults and TLB misses in the snapshot's copies; ignored
// where transparent huge pages are off).
constexpr size_t kHugePage = 2 << 20;

// Every page written once: the faults are paid here, when the pool grows,
// not by the copies of a save.
void FaultIn(char* p, uint64_t n) {
  for (uint64_t i = 0; i < n; i += StagingPool::kAlignment) p[i] = 0;
}

absl::StatusOr<char*> AllocateBuffer(DeviceMemory* dm, uint64_t n) {
  char* buffer = nullptr;
  if (dm != nullptr) {
    absl::StatusOr<void*> p = dm->AllocateHost(n);
    if (!p.ok()) return p.status();
    buffer = static_cast<char*>(*p);
  } else {
    const size_t align = n >= kHugePage ? kHugePage : StagingPool::kAlignment;
    buffer = static_cast<char*>(
        std::aligned_alloc(align, (n + align - 1) / align * align));
    if (buffer == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate a staging buffer of ", n, " bytes"));
    }
    if (align == kHugePage) (void)madvise(buffer, n, MADV_HUGEPAGE);
  }
  FaultIn(buffer, n);
  return buffer;
}

}  // namespace

StagingPool::Lease::Lease(Lease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      index_(std::exchange(other.index_, -1)),
      data_(std::exchange(other.data_, nullptr)) {}

StagingPool::Lease& StagingPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = std::exchange(other.pool_, nullptr);
    index_ = std::exchange(other.index_, -1);
    data_ = std::exchange(other.data_, nullptr);
  }
  return *this;
}

size_t StagingPool::Lease::size() const {
  return pool_ == nullptr ? 0 : pool_->buffer_bytes();
}

void StagingPool::Lease::Release() {
  if (pool_ == nullptr) return;
  data_ = nullptr;
  std::exchange(pool_, nullptr)->Return(std::exchange(index_, -1));
}

StagingPool::StagingPool(DeviceMemory* dm, uint64_t buffer_bytes,
                         uint64_t cap_bytes)
    : dm_(dm),
      buffer_bytes_(buffer_bytes),
      cap_bytes_(cap_bytes),
      max_buffers_(static_cast<int>(cap_bytes / buffer_bytes)),
      limit_(max_buffers_) {}

absl::StatusOr<std::unique_ptr<StagingPool>> StagingPool::Create(
    DeviceMemory* dm, uint64_t buffer_bytes, uint64_t cap_bytes) {
  if (buffer_bytes == 0 || buffer_bytes % kAlignment != 0 ||
      buffer_bytes > cap_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging: buffer size ", buffer_bytes, " must be a multiple of ",
        kAlignment, " and at most the cap of ", cap_bytes, " bytes"));
  }
  if (cap_bytes / buffer_bytes > (1u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging: cap of ", cap_bytes, " bytes is too large"));
  }
  return std::unique_ptr<StagingPool>(
      new StagingPool(dm, buffer_bytes, cap_bytes));
}

StagingPool::~StagingPool() {
  MutexLock l(&mu_);
  CheckOrDie(leased_ == 0, "destroyed while a Lease is outstanding");
  for (char* p : buffers_) {
    if (dm_ != nullptr) {
      dm_->FreeHost(p, buffer_bytes_);
    } else {
      std::free(p);
    }
  }
}

absl::StatusOr<bool> StagingPool::GrowLocked() {
  absl::StatusOr<char*> p = AllocateBuffer(dm_, buffer_bytes_);
  if (p.ok()) {
    buffers_.push_back(*p);
    free_.push_back(static_cast<int>(buffers_.size()) - 1);
    return true;
  }
  if (buffers_.empty()) return p.status();
  limit_ = static_cast<int>(buffers_.size());  // wait for one instead
  return false;
}

absl::Status StagingPool::Reserve(uint64_t bytes) {
  MutexLock l(&mu_);
  const uint64_t want = std::min(bytes, cap_bytes_);
  while (buffers_.size() * buffer_bytes_ < want &&
         static_cast<int>(buffers_.size()) < limit_) {
    absl::StatusOr<bool> grown = GrowLocked();
    if (!grown.ok()) return grown.status();
    if (!*grown) break;
  }
  return absl::OkStatus();
}

absl::StatusOr<StagingPool::Lease> StagingPool::Acquire() {
  MutexLock l(&mu_);
  while (free_.empty()) {
    if (static_cast<int>(buffers_.size()) < limit_) {
      absl::StatusOr<bool> grown = GrowLocked();
      if (!grown.ok()) return grown.status();
      if (*grown) break;
    }
    returned_.Wait(&mu_);
  }
  const int index = free_.back();
  free_.pop_back();
  ++leased_;
  if (leased_ > peak_leased_) peak_leased_ = leased_;
  return Lease(this, index, buffers_[index]);
}

bool StagingPool::HasFreeBuffer() const {
  MutexLock l(&mu_);
  return !free_.empty();
}

void StagingPool::Return(int index) {
  {
    MutexLock l(&mu_);
    CheckOrDie(
        index >= 0 && index < static_cast<int>(buffers_.size()) && leased_ > 0,
        "returned a buffer that is not leased");
    free_.push_back(index);
    --leased_;
  }
  returned_.Signal();
}

uint64_t StagingPool::allocated_bytes() const {
  MutexLock l(&mu_);
  return buffers_.size() * buffer_bytes_;
}

uint64_t StagingPool::peak_leased_bytes() const {
  MutexLock l(&mu_);
  return static_cast<uint64_t>(peak_leased_) * buffer_bytes_;
}

void StagingPool::ResetPeak() {
  MutexLock l(&mu_);
  peak_leased_ = leased_;
}

}  // namespace ckpt::internal

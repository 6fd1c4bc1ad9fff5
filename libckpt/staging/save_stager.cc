#include "staging/save_stager.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "util/align.h"
#include "util/copy.h"
#include "util/parallel_for.h"
#include "util/timing.h"

namespace ckpt::internal {
namespace {

// Host copies are split into pieces of this size among the copy threads.
constexpr uint64_t kCopyPiece = 4ull << 20;

}  // namespace

absl::StatusOr<const char*> StagedBytes::Acquire(uint64_t offset, uint64_t n) {
  return stager_->AcquireBytes(index_, offset, n);
}

void StagedBytes::Release(uint64_t offset, uint64_t n) {
  stager_->ReleaseBytes(index_, offset, n);
}

void StagedBytes::Abort(absl::Status status) {
  stager_->Fail(std::move(status));
}

SaveStager::SaveStager(StagingPool* pool, DeviceMemory* dm, DeviceEvent* after,
                       uint64_t segment_bytes, int max_buffers,
                       int copy_threads)
    : pool_(pool),
      dm_(dm),
      after_(after),
      segment_bytes_(segment_bytes),
      max_buffers_(max_buffers > 0 ? std::min(max_buffers, pool->max_buffers())
                                   : pool->max_buffers()),
      copy_threads_(std::max(copy_threads, 1)) {}

SaveStager::~SaveStager() { Finish(); }

StagedBytes* SaveStager::Add(StageInput input) {
  Item item;
  item.input = std::move(input);
  item.view.reset(new StagedBytes(this, items_.size()));
  items_.push_back(std::move(item));
  return items_.back().view.get();
}

void SaveStager::Fail(absl::Status status) {
  {
    MutexLock l(&mu_);
    if (status_.ok()) status_ = std::move(status);
  }
  changed_.SignalAll();
}

void SaveStager::Finish() {
  {
    MutexLock l(&mu_);
    finished_ = true;
    for (Buffer& b : buffers_) b.lease.Release();
    held_ = 0;
  }
  changed_.SignalAll();
}

absl::StatusOr<SaveStager::Buffer*> SaveStager::NextBuffer() {
  const auto t0 = std::chrono::steady_clock::now();
  if (before_waiting_ != nullptr) {
    bool at_limit;
    {
      MutexLock l(&mu_);
      at_limit = held_ >= max_buffers_;
    }
    if (at_limit || !pool_->HasFreeBuffer()) {
      std::function<void()> f = std::move(before_waiting_);
      before_waiting_ = nullptr;
      f();
    }
  }
  {
    MutexLock l(&mu_);
    while (!finished_ && status_.ok() && held_ >= max_buffers_)
      changed_.Wait(&mu_);
    if (finished_) return absl::CancelledError("staging stopped");
    if (!status_.ok()) return status_;
    ++held_;  // reserved before the pool is asked, so the limit holds
  }
  absl::StatusOr<StagingPool::Lease> lease = pool_->Acquire();
  MutexLock l(&mu_);
  stall_seconds_ += SecondsSince(t0);
  if (!lease.ok() || finished_) {
    if (!finished_) --held_;
    return lease.ok() ? absl::CancelledError("staging stopped")
                      : lease.status();
  }
  peak_held_ = std::max(peak_held_, held_);
  buffers_.emplace_back();
  buffers_.back().lease = *std::move(lease);
  buffers_.back().data = buffers_.back().lease.data();
  return &buffers_.back();
}

// Lays the next segments, in item order, out in buffer `b`: host bytes go
// to `host`, device bytes to `copies` (per device); sources are called now.
absl::Status SaveStager::PackBuffer(Buffer* b, size_t* item, uint64_t* offset,
                                    size_t end, Packed* packed) {
  const uint64_t cap = pool_->buffer_bytes();
  uint64_t cursor = 0;
  while (*item < end) {
    const StageInput& in = items_[*item].input;
    const uint64_t rest = in.size - *offset;
    cursor = AlignUp(cursor, StagingPool::kAlignment);
    if (rest == 0) {
      ++*item;
      *offset = 0;
      continue;
    }
    const uint64_t avail = cursor < cap ? cap - cursor : 0;
    const uint64_t n =
        rest <= avail ? rest : avail / segment_bytes_ * segment_bytes_;
    if (n == 0) break;
    char* dst = b->data + cursor;
    if (in.source != nullptr) {
      CKPT_RETURN_IF_ERROR(Annotate(
          (*in.source)(*offset, dst, n),
          absl::StrCat("entry '", in.name, "': source at byte ", *offset)));
    } else if (in.memory == MemoryKind::kHost) {
      packed->host.push_back(
          {dst, static_cast<const char*>(in.data) + *offset, n});
    } else {
      DeviceCopy c;
      c.dst = dst;
      c.src = static_cast<const char*>(in.data) + *offset;
      c.row_bytes = n;
      packed->CopiesOf(in.device).push_back(c);
    }
    packed->segments.push_back({*item, Segment{*offset, *offset + n, dst, b}});
    cursor += n;
    packed->bytes += n;
    *offset += n;
  }
  return absl::OkStatus();
}

std::vector<DeviceCopy>& SaveStager::Packed::CopiesOf(int device) {
  for (auto& [d, list] : device_copies) {
    if (d == device) return list;
  }
  device_copies.push_back({device, {}});
  return device_copies.back().second;
}

// Fills one buffer with the next segments: host bytes are copied now,
// device copies are queued (one batch per device) and complete through the
// buffer's `ready` events; then the segments are published to consumers.
absl::Status SaveStager::StageBuffer(size_t* item, uint64_t* offset,
                                     size_t end) {
  CKPT_ASSIGN_OR_RETURN(Buffer * b, NextBuffer());
  Packed packed;
  CKPT_RETURN_IF_ERROR(PackBuffer(b, item, offset, end, &packed));
  CopyHost(packed.host);
  std::vector<std::shared_ptr<DeviceEvent>> events;
  for (auto& [device, list] : packed.device_copies) {
    CKPT_ASSIGN_OR_RETURN(DeviceStream * s, StreamFor(device));
    CKPT_RETURN_IF_ERROR(s->CopyAsync(CopyKind::kDeviceToHost, list));
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<DeviceEvent> e, s->Record());
    events.push_back(std::move(e));
    pending_.push_back(events.back());
  }
  {
    MutexLock l(&mu_);
    b->ready = std::move(events);
    b->unreleased = packed.bytes;
    for (const auto& [i, seg] : packed.segments)
      items_[i].segments.push_back(seg);
  }
  changed_.SignalAll();
  return absl::OkStatus();
}

void SaveStager::CopyHost(const std::vector<HostCopy>& copies) const {
  std::vector<HostCopy> pieces;
  for (const HostCopy& c : copies) {
    for (uint64_t off = 0; off < c.n; off += kCopyPiece) {
      pieces.push_back(
          {c.dst + off, c.src + off, std::min(kCopyPiece, c.n - off)});
    }
  }
  (void)ParallelFor(copy_threads_, pieces.size(), [&](int, size_t i) {
    CopyForLater(pieces[i].dst, pieces[i].src, pieces[i].n);
    return absl::OkStatus();
  });
}

absl::StatusOr<DeviceStream*> SaveStager::StreamFor(int device) {
  for (auto& [d, s] : streams_) {
    if (d == device) return s.get();
  }
  if (dm_ == nullptr) {
    return absl::FailedPreconditionError(
        "a tensor lives in device memory but no DeviceMemory is set");
  }
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<DeviceStream> s,
                        dm_->CreateStream(device));
  if (after_ != nullptr) CKPT_RETURN_IF_ERROR(s->WaitEvent(*after_));
  streams_.emplace_back(device, std::move(s));
  return streams_.back().second.get();
}

absl::Status SaveStager::Run(size_t end) {
  end = std::min(end, items_.size());
  absl::Status status;
  for (;;) {
    // Items with nothing left (empty ones) take no buffer.
    while (next_item_ < end && next_offset_ == items_[next_item_].input.size) {
      ++next_item_;
      next_offset_ = 0;
    }
    if (!status.ok() || next_item_ >= end) break;
    status = StageBuffer(&next_item_, &next_offset_, end);
  }
  // Every queued copy completes before Run returns, also on error, so no
  // buffer is written by the device once it may be handed out again.
  for (const auto& e : pending_) {
    absl::Status s = e->Wait();
    if (status.ok() && !s.ok())
      status = Annotate(s, "device-to-host staging copy");
  }
  pending_.clear();
  if (!status.ok()) Fail(status);
  return status;
}

absl::StatusOr<const char*> SaveStager::AcquireBytes(size_t index,
                                                     uint64_t offset,
                                                     uint64_t n) {
  const char* host = nullptr;
  std::vector<std::shared_ptr<DeviceEvent>> ready;
  {
    MutexLock l(&mu_);
    const Item& item = items_[index];
    for (;;) {
      if (!status_.ok()) return status_;
      auto it = std::upper_bound(
          item.segments.begin(), item.segments.end(), offset,
          [](uint64_t off, const Segment& s) { return off < s.begin; });
      if (it != item.segments.begin() && offset < std::prev(it)->end) {
        const Segment& s = *std::prev(it);
        if (offset + n > s.end) {
          return absl::InternalError(absl::StrCat(
              "entry '", item.input.name, "': bytes [", offset, ", ",
              offset + n, ") cross a staging segment ending at ", s.end));
        }
        host = s.host + (offset - s.begin);
        ready = s.buffer->ready;
        break;
      }
      if (finished_) return absl::CancelledError("staging stopped");
      changed_.Wait(&mu_);
    }
  }
  for (const auto& e : ready) {
    absl::Status s = e->Wait();
    if (!s.ok()) {
      return Annotate(s, absl::StrCat("entry '", items_[index].input.name,
                                      "': device-to-host staging copy"));
    }
  }
  return host;
}

void SaveStager::ReleaseBytes(size_t index, uint64_t offset, uint64_t n) {
  {
    MutexLock l(&mu_);
    const Item& item = items_[index];
    auto it = std::upper_bound(
        item.segments.begin(), item.segments.end(), offset,
        [](uint64_t off, const Segment& s) { return off < s.begin; });
    if (it == item.segments.begin()) return;
    Buffer* b = std::prev(it)->buffer;
    if (!b->lease.valid()) return;  // Finish() took it back already
    b->unreleased -= std::min(n, b->unreleased);
    if (b->unreleased != 0) return;
    b->lease.Release();
    --held_;
  }
  changed_.SignalAll();
}

double SaveStager::stall_seconds() const {
  MutexLock l(&mu_);
  return stall_seconds_;
}

uint64_t SaveStager::peak_bytes() const {
  MutexLock l(&mu_);
  return static_cast<uint64_t>(peak_held_) * pool_->buffer_bytes();
}

}  // namespace ckpt::internal

#include "staging/load_stager.h"

#include <algorithm>

#include "ckpt/format/status_macros.h"

namespace ckpt::internal {

std::vector<DeviceCopy> CoalesceRuns(const std::vector<CopyRun>& runs,
                                     const char* src, char* dst) {
  std::vector<DeviceCopy> out;
  size_t i = 0;
  while (i < runs.size()) {
    const CopyRun& a = runs[i];
    size_t j = i + 1;
    if (j < runs.size() && runs[j].bytes == a.bytes &&
        runs[j].src_off > a.src_off && runs[j].dst_off > a.dst_off &&
        runs[j].src_off - a.src_off >= a.bytes &&
        runs[j].dst_off - a.dst_off >= a.bytes) {
      const uint64_t sp = runs[j].src_off - a.src_off,
                     dp = runs[j].dst_off - a.dst_off;
      while (j < runs.size() && runs[j].bytes == a.bytes &&
             runs[j].src_off == a.src_off + (j - i) * sp &&
             runs[j].dst_off == a.dst_off + (j - i) * dp) {
        ++j;
      }
    }
    DeviceCopy c;
    c.src = src + a.src_off;
    c.dst = dst + a.dst_off;
    c.row_bytes = a.bytes;
    c.rows = j - i;
    if (c.rows > 1) {
      c.src_pitch = runs[i + 1].src_off - a.src_off;
      c.dst_pitch = runs[i + 1].dst_off - a.dst_off;
    }
    out.push_back(c);
    i = j;
  }
  return out;
}

LoadStager::~LoadStager() {
  for (Slot& s : slots_) {
    for (auto& e : s.events) (void)e->Wait();
  }
}

absl::Status LoadStager::Complete(Slot& slot) {
  absl::Status status;
  for (auto& e : slot.events) {
    absl::Status s = e->Wait();
    if (status.ok() && !s.ok()) status = Annotate(s, "host-to-device copy");
  }
  slot.events.clear();
  if (status.ok()) {
    for (auto [request, bytes] : slot.done) done_(request, bytes);
  }
  slot.done.clear();
  return status;
}

absl::StatusOr<char*> LoadStager::Next(uint64_t n) {
  if (n > pool_->buffer_bytes()) return nullptr;
  current_ = current_ == 0 ? 1 : 0;
  Slot& slot = slots_[current_];
  CKPT_RETURN_IF_ERROR(Complete(slot));
  if (!slot.lease.valid()) {
    CKPT_ASSIGN_OR_RETURN(slot.lease, pool_->Acquire());
  }
  devices_.clear();
  return slot.lease.data();
}

absl::StatusOr<DeviceStream*> LoadStager::StreamFor(int device) {
  for (auto& [d, s] : streams_) {
    if (d == device) return s.get();
  }
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<DeviceStream> s,
                        dm_->CreateStream(device));
  if (after_ != nullptr) CKPT_RETURN_IF_ERROR(s->WaitEvent(*after_));
  streams_.emplace_back(device, std::move(s));
  return streams_.back().second.get();
}

absl::Status LoadStager::Copy(int device, const std::vector<DeviceCopy>& copies,
                              size_t request, uint64_t bytes) {
  CKPT_ASSIGN_OR_RETURN(DeviceStream * s, StreamFor(device));
  CKPT_RETURN_IF_ERROR(s->CopyAsync(CopyKind::kHostToDevice, copies));
  if (std::find(devices_.begin(), devices_.end(), device) == devices_.end()) {
    devices_.push_back(device);
  }
  slots_[current_].done.emplace_back(request, bytes);
  return absl::OkStatus();
}

absl::Status LoadStager::Submit() {
  for (int device : devices_) {
    CKPT_ASSIGN_OR_RETURN(DeviceStream * s, StreamFor(device));
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<DeviceEvent> e, s->Record());
    slots_[current_].events.push_back(std::move(e));
  }
  devices_.clear();
  return absl::OkStatus();
}

absl::Status LoadStager::Drain() {
  absl::Status status;
  for (Slot& s : slots_) {
    absl::Status st = Complete(s);
    if (status.ok()) status = st;
    s.lease.Release();
  }
  return status;
}

}  // namespace ckpt::internal

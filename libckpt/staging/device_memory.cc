// Defaults of DeviceMemory: a synchronous stream over the two copy calls,
// and ordinary aligned host memory for staging.
#include "ckpt/device_memory.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

class CompleteEvent final : public DeviceEvent {
 public:
  bool Done() override { return true; }
  absl::Status Wait() override { return absl::OkStatus(); }
};

// Copies run at once, on the calling thread; an error is returned by
// CopyAsync itself, so every recorded event is complete and OK.
class SyncStream final : public DeviceStream {
 public:
  SyncStream(DeviceMemory* dm, int device) : dm_(dm), device_(device) {}

  absl::Status WaitEvent(DeviceEvent& event) override { return event.Wait(); }

  absl::Status CopyAsync(CopyKind kind,
                         absl::Span<const DeviceCopy> copies) override {
    if (kind == CopyKind::kDeviceToDevice) {
      return absl::UnimplementedError(
          "this DeviceMemory has no device-to-device copies");
    }
    for (const DeviceCopy& c : copies) {
      for (size_t r = 0; r < c.rows; ++r) {
        const char* src = static_cast<const char*>(c.src) + r * c.src_pitch;
        char* dst = static_cast<char*>(c.dst) + r * c.dst_pitch;
        absl::Status s =
            kind == CopyKind::kDeviceToHost
                ? dm_->CopyToHost(dst, src, c.row_bytes, device_)
                : dm_->CopyFromHost(dst, src, c.row_bytes, device_);
        if (!s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<DeviceEvent>> Record() override {
    return std::unique_ptr<DeviceEvent>(new CompleteEvent());
  }

 private:
  DeviceMemory* dm_;
  int device_;
};

constexpr size_t kHostAlignment = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceStream>> DeviceMemory::CreateStream(
    int device) {
  return std::unique_ptr<DeviceStream>(new SyncStream(this, device));
}

absl::StatusOr<void*> DeviceMemory::AllocateHost(size_t n) {
  const size_t rounded =
      (n + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  void* p = std::aligned_alloc(kHostAlignment,
                               rounded == 0 ? kHostAlignment : rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", n, " bytes of host staging memory"));
  }
  return p;
}

void DeviceMemory::FreeHost(void* p, size_t n) { std::free(p); }

absl::StatusOr<void*> DeviceMemory::AllocateDevice(size_t n, int device) {
  return absl::UnimplementedError(
      "this DeviceMemory does not allocate device memory");
}

void DeviceMemory::FreeDevice(void* p, size_t n, int device) {}

}  // namespace ckpt

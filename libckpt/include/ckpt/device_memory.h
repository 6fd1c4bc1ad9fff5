// The device interface of the library: how bytes move between host memory
// and accelerator memory. libckpt never includes CUDA; gpu/ implements this
// (ckpt::gpu::CudaDeviceMemory), tests implement it with a fake device
// (tests/testing/fake_device.h), and a trainer may implement it itself.
//
// Two levels:
//   - DeviceMemory::CopyToHost / CopyFromHost: synchronous copies. Enough
//     for a trainer's own implementation; every other member has a default
//     built on them (copies done at once, events always complete).
//   - DeviceStream: an in-order queue of asynchronous copies (batched and
//     strided), completing through DeviceEvents. The save and load
//     pipelines use one stream per I/O thread, so copies overlap reads,
//     hashing and writes. Implementations run streams that the library owns
//     and never synchronize a whole device: a stream orders its work after
//     the caller's only through the event the caller passes (WaitEvent).
#ifndef CKPT_DEVICE_MEMORY_H_
#define CKPT_DEVICE_MEMORY_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ckpt {

// Completion of the work queued on a DeviceStream before the event was
// recorded (or of a caller's work, for events a DeviceMemory implementation
// makes from its own handles, e.g. CudaDeviceMemory::RecordOn). Owned by the
// holder of the unique_ptr. Thread-safe.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // True once the work completed (successfully or not). Never blocks.
  virtual bool Done() = 0;
  // Blocks the calling thread until the work completed; its first error.
  [[nodiscard]] virtual absl::Status Wait() = 0;
};

enum class CopyKind : uint8_t {
  kDeviceToHost = 0,
  kHostToDevice = 1,
  // Within the stream's device (the device snapshot of SaveAsync, into
  // memory from AllocateDevice).
  kDeviceToDevice = 2,
};

// One copy of `rows` rows of `row_bytes` bytes each: row i goes from
// src + i * src_pitch to dst + i * dst_pitch. With rows == 1 the pitches are
// ignored (a contiguous copy). A strided region (one column block of a
// row-major matrix) is one DeviceCopy, and one call of the device API
// (cudaMemcpy2DAsync), not one per row.
// REQUIRES: rows > 1 implies dst_pitch >= row_bytes and src_pitch >= row_bytes.
struct DeviceCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t row_bytes = 0;
  size_t rows = 1;
  size_t dst_pitch = 0;
  size_t src_pitch = 0;

  size_t bytes() const { return row_bytes * rows; }
};

// An in-order queue of copies on one device. Created by
// DeviceMemory::CreateStream and owned by the library; used by one thread
// at a time. Destroying a stream waits for its queued work.
class DeviceStream {
 public:
  virtual ~DeviceStream() = default;
  // Work queued after this call starts only after `event` completed. Does
  // not block the caller. `event` may be destroyed once this returns.
  [[nodiscard]] virtual absl::Status WaitEvent(DeviceEvent& event) = 0;
  // Queues `copies` in order, each as one call of the device API, and
  // returns without waiting for them. Host buffers and device memory must
  // stay valid and untouched until an event recorded after this call
  // completes. An error of a queued copy is reported by that event's Wait.
  [[nodiscard]] virtual absl::Status CopyAsync(
      CopyKind kind, absl::Span<const DeviceCopy> copies) = 0;
  // An event that completes when everything queued so far has completed.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<DeviceEvent>>
  Record() = 0;
};

// Thread-safe: the library calls it from its I/O threads.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Copies n bytes from device pointer `src` on `device` to host `dst`;
  // the bytes are in `dst` when it returns OK.
  [[nodiscard]] virtual absl::Status CopyToHost(void* dst, const void* src,
                                                size_t n, int device) = 0;
  // Copies n bytes from host `src` to device pointer `dst` on `device`;
  // the bytes are on the device when it returns OK.
  [[nodiscard]] virtual absl::Status CopyFromHost(void* dst, const void* src,
                                                  size_t n, int device) = 0;

  // A new stream of copies on `device`. The default runs every copy at once
  // through CopyToHost / CopyFromHost (row by row for strided copies) and
  // returns events that are already complete.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<DeviceStream>>
  CreateStream(int device);

  // Host memory for staging buffers, aligned to 4096 bytes; page-locked
  // where the device needs that for asynchronous copies (CUDA: pinned with
  // cudaHostAlloc). The library allocates its staging buffers once and
  // keeps them across saves, so this is not on any per-save path.
  // ResourceExhausted when the memory cannot be had. The default returns
  // ordinary aligned memory.
  [[nodiscard]] virtual absl::StatusOr<void*> AllocateHost(size_t n);
  // Frees what AllocateHost returned (n as passed to it).
  virtual void FreeHost(void* p, size_t n);

  // Device memory on `device` for snapshots (Writer::Options::
  // device_snapshot_bytes), aligned to 256 bytes; the library allocates it
  // once and keeps it for a Writer's lifetime. An implementation that has
  // it also runs CopyKind::kDeviceToDevice on its streams. The default:
  // Unimplemented (the library then snapshots to host memory instead).
  [[nodiscard]] virtual absl::StatusOr<void*> AllocateDevice(size_t n,
                                                             int device);
  // Frees what AllocateDevice returned (n and device as passed to it).
  virtual void FreeDevice(void* p, size_t n, int device);
};

}  // namespace ckpt

#endif  // CKPT_DEVICE_MEMORY_H_

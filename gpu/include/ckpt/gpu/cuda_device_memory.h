// ckpt::gpu::CudaDeviceMemory: libckpt's device interface
// (ckpt/device_memory.h) over the CUDA runtime.
//
//   ckpt::gpu::CudaDeviceMemory cuda;
//   ckpt::Writer::Options wo;
//   wo.device_memory = &cuda;
//   ...
//   // Order the save's copies after the kernels that produce the tensors:
//   auto ready = ckpt::gpu::CudaDeviceMemory::RecordOn(train_stream).value();
//   ckpt::SaveOptions so;
//   so.device_ready = ready.get();
//   auto handle = writer->SaveAsync(root, step, so);
//
// Copies run on streams this object creates (cudaStreamNonBlocking, one per
// library I/O thread), never on the legacy default stream, and nothing here
// synchronizes a device or a stream other than its own: a stream is ordered
// after the caller's work only through an event (DeviceStream::WaitEvent).
// Staging memory is pinned once with cudaHostAlloc(cudaHostAllocPortable)
// and freed with cudaFreeHost when the library's pool is destroyed.
//
// Every CUDA error becomes a Status at CKPT_CUDA_RETURN_IF_ERROR
// (status_macros.h), naming the call. Thread-safe.
#ifndef CKPT_GPU_CUDA_DEVICE_MEMORY_H_
#define CKPT_GPU_CUDA_DEVICE_MEMORY_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/device_memory.h"

namespace ckpt::gpu {

class CudaDeviceMemory final : public DeviceMemory {
 public:
  CudaDeviceMemory();
  // Destroys the streams kept for synchronous copies (after their work).
  ~CudaDeviceMemory() override;

  // Synchronous copies on a stream of this object (not the default stream):
  // the bytes are at `dst` when OK is returned.
  absl::Status CopyToHost(void* dst, const void* src, size_t n,
                          int device) override;
  absl::Status CopyFromHost(void* dst, const void* src, size_t n,
                            int device) override;

  // A non-blocking stream on `device`. Its CopyAsync issues each run of
  // contiguous copies as one cudaMemcpyBatchAsync (CUDA 12.8 and later;
  // one cudaMemcpyAsync each before, or where the driver refuses the batch)
  // and one cudaMemcpy2DAsync per strided copy; kDeviceToDevice copies
  // within the device. WaitEvent takes events of this class (RecordOn,
  // WrapEvent, Record) with cudaStreamWaitEvent; any other DeviceEvent is
  // waited for on the calling thread.
  absl::StatusOr<std::unique_ptr<DeviceStream>> CreateStream(
      int device) override;
  // Pinned with cudaHostAlloc(cudaHostAllocPortable).
  absl::StatusOr<void*> AllocateHost(size_t n) override;
  void FreeHost(void* p, size_t n) override;
  // cudaMalloc / cudaFree on `device` (the device snapshot of SaveAsync).
  absl::StatusOr<void*> AllocateDevice(size_t n, int device) override;
  void FreeDevice(void* p, size_t n, int device) override;

  // An event recorded now on the caller's `stream` (owned by the caller):
  // it completes when the work queued there so far completes.
  static absl::StatusOr<std::unique_ptr<DeviceEvent>> RecordOn(
      cudaStream_t stream);
  // Wraps the caller's `event` (not owned; must outlive the returned object
  // and stay recorded as it is until the save or load using it returned).
  static std::unique_ptr<DeviceEvent> WrapEvent(cudaEvent_t event);

 private:
  // The streams of the synchronous copies, kept between calls
  // (cuda_device_memory.cc).
  class StreamPool;

  absl::Status CopySync(void* dst, const void* src, size_t n, int device,
                        cudaMemcpyKind kind);

  const std::unique_ptr<StreamPool> streams_;
};

}  // namespace ckpt::gpu

#endif  // CKPT_GPU_CUDA_DEVICE_MEMORY_H_

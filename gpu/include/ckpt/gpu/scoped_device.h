// Internal to gpu/: makes a CUDA device current on the calling thread for a
// scope, then restores the device that was current before. The CUDA
// runtime's current device is per thread, and the library's calls run on
// the caller's thread too (SaveAsync stages on it; a Reader's Load copies
// from it): a call into ckpt never leaves a trainer that drives several
// GPUs from one thread with another current device.
#ifndef CKPT_GPU_SCOPED_DEVICE_H_
#define CKPT_GPU_SCOPED_DEVICE_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "ckpt/gpu/status_macros.h"

namespace ckpt::gpu::internal {

class ScopedDevice {
 public:
  ScopedDevice() = default;
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  // Restores the caller's device if Enter changed it (errors ignored: a
  // destructor has no one to tell).
  ~ScopedDevice() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  // Makes `device` current; the first call that changes it remembers the
  // caller's device, so nested or repeated calls restore the original.
  absl::Status Enter(int device) {
    int current = 0;
    CKPT_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
    if (current == device) return absl::OkStatus();
    CKPT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    if (previous_ < 0) previous_ = current;
    return absl::OkStatus();
  }

 private:
  int previous_ = -1;
};

}  // namespace ckpt::gpu::internal

#endif  // CKPT_GPU_SCOPED_DEVICE_H_

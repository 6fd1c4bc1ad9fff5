// Whether this machine has a CUDA device: the gpu-labelled tests skip
// cleanly (GTEST_SKIP) where it has none.
#ifndef CKPT_TESTS_GPU_HAVE_DEVICE_H_
#define CKPT_TESTS_GPU_HAVE_DEVICE_H_

#include "ckpt/gpu/device.h"

namespace ckpt::gpu {

inline bool HaveDevice() {
  absl::StatusOr<std::vector<DeviceInfo>> devices = QueryDevices();
  return devices.ok() && !devices->empty();
}

}  // namespace ckpt::gpu

#endif  // CKPT_TESTS_GPU_HAVE_DEVICE_H_

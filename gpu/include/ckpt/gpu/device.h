// Discovery of the CUDA devices visible to this process.
#ifndef CKPT_GPU_DEVICE_H_
#define CKPT_GPU_DEVICE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::gpu {

// One CUDA device as the runtime reports it. Plain value type.
struct DeviceInfo {
  int ordinal = -1;                  // CUDA device index (cudaSetDevice).
  std::string name;                  // e.g. "NVIDIA H100 80GB HBM3".
  size_t total_memory_bytes = 0;     // Global memory.
  int compute_capability_major = 0;  // e.g. 9 for sm_90.
  int compute_capability_minor = 0;
  // "domain:bus:device.function" as cudaDeviceGetPCIBusId writes it,
  // e.g. "0000:3b:00.0". Identifies the device across processes and tools
  // (nvidia-smi), unlike `ordinal`, which depends on CUDA_VISIBLE_DEVICES.
  std::string pci_bus_id;
};

// Returns the devices visible to this process (after CUDA_VISIBLE_DEVICES),
// in ordinal order.
//
// A machine without a GPU or without a (new enough) driver is a normal
// configuration, not an error: when the runtime reports cudaErrorNoDevice,
// cudaErrorInsufficientDriver or cudaErrorStubLibrary this returns an empty
// vector. Any other CUDA failure is returned as a Status naming the call
// (see status_macros.h).
//
// Thread-safe. The first call initializes the CUDA runtime, which can take
// a noticeable fraction of a second.
[[nodiscard]] absl::StatusOr<std::vector<DeviceInfo>> QueryDevices();

}  // namespace ckpt::gpu

#endif  // CKPT_GPU_DEVICE_H_

#include "ckpt/gpu/device.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "ckpt/gpu/status_macros.h"

namespace ckpt::gpu {

absl::StatusOr<std::vector<DeviceInfo>> QueryDevices() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (internal::IsNoDeviceError(err)) {
    (void)cudaGetLastError();  // Leave no latched error behind.
    return std::vector<DeviceInfo>();
  }
  CKPT_CUDA_RETURN_IF_ERROR(err);

  std::vector<DeviceInfo> devices;
  devices.reserve(count);
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    CKPT_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, i));
    // 13 characters plus NUL suffice for "dddd:bb:dd.f"; leave room for
    // longer domains.
    char bus_id[64] = {};
    CKPT_CUDA_RETURN_IF_ERROR(
        cudaDeviceGetPCIBusId(bus_id, static_cast<int>(sizeof(bus_id)), i));

    DeviceInfo info;
    info.ordinal = i;
    info.name = prop.name;
    info.total_memory_bytes = prop.totalGlobalMem;
    info.compute_capability_major = prop.major;
    info.compute_capability_minor = prop.minor;
    info.pci_bus_id = bus_id;
    devices.push_back(std::move(info));
  }
  return devices;
}

}  // namespace ckpt::gpu

// Vocabulary types of the public API: element types, shapes and regions
// (defined by the format codec and re-exported here), and where a buffer's
// memory lives.
#ifndef CKPT_TYPES_H_
#define CKPT_TYPES_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "format/dtype.h"     // IWYU pragma: export
#include "format/geometry.h"  // IWYU pragma: export

namespace ckpt {

enum class MemoryKind : uint8_t {
  kHost = 0,  // ordinary (or pinned) host memory
  kCuda = 1,  // CUDA device memory; needs a DeviceMemory in the options
};

// Copies between host memory and device memory. Implemented by gpu/
// (ckpt::gpu::CudaDeviceMemory) or by a trainer. Must be thread-safe: the
// library calls it from its I/O threads.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Copies n bytes from device pointer `src` on `device` to host `dst`;
  // the bytes are in `dst` when it returns OK.
  [[nodiscard]] virtual absl::Status CopyToHost(void* dst, const void* src,
                                                size_t n, int device) = 0;
  // Copies n bytes from host `src` to device pointer `dst` on `device`.
  [[nodiscard]] virtual absl::Status CopyFromHost(void* dst, const void* src,
                                                  size_t n, int device) = 0;
};

}  // namespace ckpt

#endif  // CKPT_TYPES_H_

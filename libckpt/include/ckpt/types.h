// Vocabulary types of the public API: element types, shapes and regions
// (defined by the format codec and re-exported here), and where a buffer's
// memory lives.
#ifndef CKPT_TYPES_H_
#define CKPT_TYPES_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "ckpt/device_memory.h"    // IWYU pragma: export
#include "ckpt/format/dtype.h"     // IWYU pragma: export
#include "ckpt/format/geometry.h"  // IWYU pragma: export

namespace ckpt {

enum class MemoryKind : uint8_t {
  kHost = 0,  // ordinary (or pinned) host memory
  kCuda = 1,  // CUDA device memory; needs a DeviceMemory in the options
};

// DeviceMemory, the interface of device copies, is in ckpt/device_memory.h.

}  // namespace ckpt

#endif  // CKPT_TYPES_H_

// Borrowing a Python object's memory without a copy: the buffer protocol
// (numpy arrays, bytearray, memoryview) or DLPack (__dlpack__: torch
// tensors). A non-contiguous or read-only (when writing into it) object is
// refused, never copied.
#ifndef CKPT_PYTHON_BUFFERS_H_
#define CKPT_PYTHON_BUFFERS_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ckpt/device_memory.h"
#include "ckpt/types.h"

namespace ckpt::python {

// A view of an object's memory. `keepalive` holds the exporter's view
// (Py_buffer or DLPack tensor) and releases it when the last copy goes;
// REQUIRES: the last copy is destroyed with the GIL held.
struct BorrowedBuffer {
  void* data = nullptr;
  uint64_t nbytes = 0;
  MemoryKind memory = MemoryKind::kHost;
  int device = 0;
  // The element type the exporter reports, when ckpt has it.
  std::optional<DType> element;
  int itemsize = 1;
  bool is_unsigned_int = false;  // a raw view (uint8/16/32/64)
  std::shared_ptr<void> keepalive;
};

// Borrows `obj`'s memory. `what` names it in errors ("entry 'w'").
// Throws StatusError (InvalidArgument) for an object that is neither a
// buffer nor a DLPack tensor, is not C-contiguous, or is read-only when
// `writable`.
BorrowedBuffer Borrow(pybind11::handle obj, bool writable,
                      const std::string& what);

// Checks that `buf` holds `elements` elements of `dtype`: its element type
// is `dtype` or an unsigned integer of the same width (a raw view, e.g.
// uint16 for bfloat16), and its size matches. Throws StatusError
// (InvalidArgument) naming `what`, both types or both sizes otherwise.
void CheckFits(const BorrowedBuffer& buf, DType dtype, uint64_t elements,
               const std::string& what);

// Whether the package was built with ckpt_gpu (CKPT_PYTHON_CUDA): CUDA
// tensors are accepted. Without it Borrow refuses them, saying so.
bool PythonBuiltWithCuda();
// The DeviceMemory of CUDA tensors (kCuda views) for Writers and Readers:
// one process-wide ckpt::gpu::CudaDeviceMemory when built with ckpt_gpu and
// the CUDA runtime sees a device (asked once, at the first call), else null.
DeviceMemory* PythonDeviceMemory();

}  // namespace ckpt::python

#endif  // CKPT_PYTHON_BUFFERS_H_

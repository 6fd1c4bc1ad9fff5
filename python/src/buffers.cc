#include "buffers.h"

#include <dlpack/dlpack.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "errors.h"
#ifdef CKPT_PYTHON_CUDA
#include "ckpt/gpu/cuda_device_memory.h"
#include "ckpt/gpu/device.h"
#endif

namespace ckpt::python {
namespace py = pybind11;
namespace {

[[noreturn]] void Refuse(const std::string& what, const std::string& why) {
  throw StatusError(absl::InvalidArgumentError(absl::StrCat(what, ": ", why)));
}

// The ckpt element type of an integer or float of `kind` ('i' signed, 'u'
// unsigned, 'f' float, 'b' bool) and `bytes`, when there is one.
std::optional<DType> ElementType(char kind, int bytes) {
  switch (kind) {
    case 'b':
      return bytes == 1 ? std::optional<DType>(DType::kBool) : std::nullopt;
    case 'i':
      switch (bytes) {
        case 1:
          return DType::kInt8;
        case 2:
          return DType::kInt16;
        case 4:
          return DType::kInt32;
        case 8:
          return DType::kInt64;
      }
      break;
    case 'u':
      switch (bytes) {
        case 1:
          return DType::kUInt8;
        case 2:
          return DType::kUInt16;
        case 4:
          return DType::kUInt32;
        case 8:
          return DType::kUInt64;
      }
      break;
    case 'f':
      switch (bytes) {
        case 2:
          return DType::kFloat16;
        case 4:
          return DType::kFloat32;
        case 8:
          return DType::kFloat64;
      }
      break;
    case 'B':  // bfloat16 (DLPack only)
      if (bytes == 2) return DType::kBFloat16;
      break;
  }
  return std::nullopt;
}

// A struct-module format character ('<f', 'H', '?') as ElementType's kind.
char FormatKind(const char* format) {
  std::string f = format ? format : "B";
  while (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@' ||
                        f[0] == '!' || f[0] == '>')) {
    f.erase(0, 1);
  }
  if (f.size() != 1) return '?';
  switch (f[0]) {
    case '?':
      return 'b';
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
    case 'n':
      return 'i';
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q':
    case 'N':
      return 'u';
    case 'e':
    case 'f':
    case 'd':
      return 'f';
  }
  return '?';
}

BorrowedBuffer BorrowBufferProtocol(py::handle obj, bool writable,
                                    const std::string& what) {
  auto view = std::make_unique<Py_buffer>();
  int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), view.get(), flags) != 0) {
    py::error_already_set e;
    Refuse(what, absl::StrCat(
                     writable ? "cannot write into this " : "cannot read this ",
                     Py_TYPE(obj.ptr())->tp_name, " (", e.what(), ")"));
  }
  std::shared_ptr<void> keepalive(view.release(), [](void* p) {
    auto* v = static_cast<Py_buffer*>(p);
    PyBuffer_Release(v);
    delete v;
  });
  auto* v = static_cast<Py_buffer*>(keepalive.get());
  if (!PyBuffer_IsContiguous(v, 'C')) {
    Refuse(what,
           "the array is not C-contiguous (a copy is never made silently; "
           "pass a contiguous array, e.g. numpy.ascontiguousarray)");
  }
  BorrowedBuffer b;
  b.data = v->buf;
  b.nbytes = static_cast<uint64_t>(v->len);
  b.itemsize = static_cast<int>(v->itemsize);
  char kind = FormatKind(v->format);
  b.element = ElementType(kind, b.itemsize);
  b.is_unsigned_int = kind == 'u';
  b.keepalive = std::move(keepalive);
  return b;
}

// Whether a DLPack tensor is compact row-major (dims of size 1 may carry
// any stride).
bool IsCompact(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  int64_t expected = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

// Calls obj.__dlpack__() and consumes the capsule: the returned pointer
// owns the DLManagedTensor and calls its deleter.
std::shared_ptr<DLManagedTensor> TakeDlpackTensor(py::handle obj,
                                                  const std::string& what) {
  py::object capsule;
  try {
    capsule = obj.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    Refuse(what, absl::StrCat("__dlpack__ failed: ", e.what()));
  }
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
    Refuse(what, "__dlpack__ did not return a DLPack capsule");
  }
  auto* managed = static_cast<DLManagedTensor*>(
      PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  // The capsule is consumed: from here on the deleter is ours to call.
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  return std::shared_ptr<DLManagedTensor>(managed, [](DLManagedTensor* m) {
    if (m->deleter) m->deleter(m);
  });
}

// Where a DLPack tensor's bytes live, refusing devices ckpt cannot reach.
MemoryKind DlpackMemory(const DLTensor& t, const std::string& what) {
  switch (t.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      return MemoryKind::kHost;
    case kDLCUDA:
      if (!PythonBuiltWithCuda()) {
        Refuse(what,
               "a CUDA tensor, but this ckpt Python package was built without "
               "CUDA support (ckpt_gpu: the CUDA Toolkit was not found); pass "
               "tensor.cpu()");
      }
      if (PythonDeviceMemory() == nullptr)
        Refuse(what, "a CUDA tensor, but the CUDA runtime sees no device");
      return MemoryKind::kCuda;
    default:
      Refuse(what, absl::StrCat("DLPack device type ", t.device.device_type,
                                " is not supported"));
  }
}

// A DLPack type code as ElementType's kind.
char DlpackKind(uint8_t code) {
  switch (code) {
    case kDLInt:
      return 'i';
    case kDLUInt:
      return 'u';
    case kDLFloat:
      return 'f';
    case kDLBfloat:
      return 'B';
  }
  return '?';
}

BorrowedBuffer BorrowDlpack(py::handle obj, const std::string& what) {
  std::shared_ptr<DLManagedTensor> managed = TakeDlpackTensor(obj, what);
  const DLTensor& t = managed->dl_tensor;
  if (!IsCompact(t)) {
    Refuse(what,
           "the tensor is not contiguous (a copy is never made silently; "
           "pass tensor.contiguous())");
  }
  if (t.dtype.lanes != 1)
    Refuse(what, "vector element types are not supported");
  BorrowedBuffer b;
  b.memory = DlpackMemory(t, what);
  b.device = t.device.device_id;
  b.itemsize = (t.dtype.bits + 7) / 8;
  uint64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= static_cast<uint64_t>(t.shape[d]);
  b.nbytes = n * b.itemsize;
  b.data = static_cast<char*>(t.data) + t.byte_offset;
  const char kind = DlpackKind(t.dtype.code);
  b.element = ElementType(kind, b.itemsize);
  b.is_unsigned_int = kind == 'u';
  b.keepalive = std::move(managed);
  return b;
}

}  // namespace

BorrowedBuffer Borrow(py::handle obj, bool writable, const std::string& what) {
  if (PyObject_CheckBuffer(obj.ptr()))
    return BorrowBufferProtocol(obj, writable, what);
  if (py::hasattr(obj, "__dlpack__")) return BorrowDlpack(obj, what);
  Refuse(what, absl::StrCat(
                   "a ", Py_TYPE(obj.ptr())->tp_name,
                   " is neither a buffer (numpy array) nor a DLPack tensor"));
}

void CheckFits(const BorrowedBuffer& buf, DType dtype, uint64_t elements,
               const std::string& what) {
  bool same_type = buf.element.has_value() && *buf.element == dtype;
  bool raw_view = buf.is_unsigned_int && buf.itemsize == DTypeSize(dtype);
  if (!same_type && !raw_view) {
    std::string have =
        buf.element ? std::string(DTypeName(*buf.element))
                    : absl::StrCat("an unknown ", buf.itemsize, "-byte type");
    Refuse(what,
           absl::StrCat(
               "the buffer holds ", have, ", the entry is ", DTypeName(dtype),
               " (a raw view must be an unsigned integer of the same width)"));
  }
  uint64_t want = elements * DTypeSize(dtype);
  if (buf.nbytes != want) {
    Refuse(what,
           absl::StrCat("the buffer holds ", buf.nbytes / DTypeSize(dtype),
                        " elements, the region has ", elements));
  }
}

bool PythonBuiltWithCuda() {
#ifdef CKPT_PYTHON_CUDA
  return true;
#else
  return false;
#endif
}

DeviceMemory* PythonDeviceMemory() {
#ifdef CKPT_PYTHON_CUDA
  // Never destroyed: Writers and Readers use it until the interpreter
  // exits. Only where a device is visible: without one, the staging pool
  // must not ask CUDA for pinned memory.
  static DeviceMemory* const cuda = []() -> DeviceMemory* {
    absl::StatusOr<std::vector<gpu::DeviceInfo>> devices = gpu::QueryDevices();
    if (!devices.ok() || devices->empty()) return nullptr;
    return new gpu::CudaDeviceMemory();
  }();
  return cuda;
#else
  return nullptr;
#endif
}

}  // namespace ckpt::python

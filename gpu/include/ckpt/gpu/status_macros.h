// The one place where CUDA runtime return codes become absl::Status.
// Every CUDA runtime call in gpu/ goes through
// CKPT_CUDA_RETURN_IF_ERROR, so an error names the call that failed.
#ifndef CKPT_GPU_STATUS_MACROS_H_
#define CKPT_GPU_STATUS_MACROS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace ckpt::gpu::internal {

// Returns OK for cudaSuccess. Otherwise returns a Status whose message is
//   "<call> failed at <file>:<line>: <cudaGetErrorName>: <cudaGetErrorString>"
// where `call` is the source text of the failing expression. Codes:
//   - the machine has no usable device or driver (IsNoDeviceError(), plus
//     driver/runtime mismatches)                         -> FailedPrecondition
//   - cudaErrorMemoryAllocation                          -> ResourceExhausted
//   - anything else                                      -> Internal
// Also clears the calling thread's CUDA last-error state (cudaGetLastError)
// so that a later, unrelated check does not report this error again.
// `call` and `file` must be NUL-terminated; they are copied.
// Thread-safe.
[[nodiscard]] absl::Status CudaErrorToStatus(cudaError_t err, const char* call,
                                             const char* file, int line);

// True for the errors that mean "this process cannot see any CUDA device":
// cudaErrorNoDevice, cudaErrorInsufficientDriver (no driver, or one older
// than the runtime) and cudaErrorStubLibrary (linked against the driver
// stub). Callers that treat "no GPU" as a normal configuration test this.
bool IsNoDeviceError(cudaError_t err);

}  // namespace ckpt::gpu::internal

// Evaluates `expr` (a cudaError_t) once; when it is not cudaSuccess, returns
// the corresponding absl::Status from the enclosing function (which must
// return absl::Status or absl::StatusOr<T>).
#define CKPT_CUDA_RETURN_IF_ERROR(expr)                                      \
  do {                                                                       \
    const cudaError_t ckpt_cuda_err_ = (expr);                               \
    if (ckpt_cuda_err_ != cudaSuccess) {                                     \
      return ::ckpt::gpu::internal::CudaErrorToStatus(ckpt_cuda_err_, #expr, \
                                                      __FILE__, __LINE__);   \
    }                                                                        \
  } while (0)

#endif  // CKPT_GPU_STATUS_MACROS_H_

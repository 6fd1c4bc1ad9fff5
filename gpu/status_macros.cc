#include "ckpt/gpu/status_macros.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace ckpt::gpu::internal {
namespace {

// Messages carry the file's base name only: build paths are noise.
const char* BaseName(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash == nullptr ? path : slash + 1;
}

absl::StatusCode CodeFor(cudaError_t err) {
  if (IsNoDeviceError(err)) return absl::StatusCode::kFailedPrecondition;
  switch (err) {
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorDevicesUnavailable:
      return absl::StatusCode::kFailedPrecondition;
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

bool IsNoDeviceError(cudaError_t err) {
  return err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
         err == cudaErrorStubLibrary;
}

absl::Status CudaErrorToStatus(cudaError_t err, const char* call,
                               const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  // Non-sticky errors stay latched per thread until read; reset it here so
  // the error is reported exactly once.
  (void)cudaGetLastError();
  return absl::Status(
      CodeFor(err),
      absl::StrCat(call, " failed at ", BaseName(file), ":", line, ": ",
                   cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

}  // namespace ckpt::gpu::internal

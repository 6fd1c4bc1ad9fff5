#include "ckpt/gpu/nccl_communicator.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/gpu/scoped_device.h"
#include "ckpt/gpu/status_macros.h"

// The one place where NCCL return codes become absl::Status: evaluates
// `expr` (an ncclResult_t) once and returns its Status when it failed.
#define CKPT_NCCL_RETURN_IF_ERROR(expr, comm)                            \
  do {                                                                   \
    const ncclResult_t ckpt_nccl_result_ = (expr);                       \
    if (ckpt_nccl_result_ != ncclSuccess) {                              \
      return ::ckpt::gpu::internal::NcclErrorToStatus(ckpt_nccl_result_, \
                                                      #expr, (comm));    \
    }                                                                    \
  } while (0)

namespace ckpt::gpu {
namespace internal {

absl::Status NcclErrorToStatus(ncclResult_t result, absl::string_view call,
                               ncclComm_t comm) {
  if (result == ncclSuccess) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (result == ncclInvalidArgument || result == ncclInvalidUsage) {
    code = absl::StatusCode::kInvalidArgument;
  } else if (result == ncclSystemError || result == ncclRemoteError) {
    code = absl::StatusCode::kUnavailable;
  }
  std::string message =
      absl::StrCat(call, " failed: ", ncclGetErrorString(result),
                   " (ncclResult_t ", static_cast<int>(result), ")");
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&message, ": ", last);
  return absl::Status(code, message);
}

}  // namespace internal

using internal::ScopedDevice;

namespace {

// AllToAll's sizes of a rank whose own arguments are bad, so that its
// peers report its error rather than a mismatch of its making.
constexpr uint64_t kBadArguments = ~uint64_t{0};

// Rank 0's ncclUniqueId, or its failure, as Init broadcasts it.
absl::StatusOr<std::string> MakeUniqueId() {
  ncclUniqueId id;
  CKPT_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id), nullptr);
  return std::string(id.internal, sizeof(id.internal));
}

// OK if `data` is memory of `device` (device or managed memory), so that
// a host pointer passed as kCuda is an error here rather than a fault in
// NCCL. `what` names the buffer.
absl::Status CheckOnDevice(const void* data, int device,
                           const std::string& what) {
  cudaPointerAttributes attributes;
  CKPT_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attributes, data));
  const bool on_device = attributes.type == cudaMemoryTypeDevice ||
                         attributes.type == cudaMemoryTypeManaged;
  if (on_device && attributes.device == device) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " is not memory of CUDA device ", device,
      on_device ? absl::StrCat(" (it is on device ", attributes.device, ")")
                : std::string(" (it is host memory)")));
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    Communicator* cpu, int device) {
  if (cpu == nullptr) {
    return absl::InvalidArgumentError(
        "NcclCommunicator::Create: the CPU communicator is null");
  }
  std::unique_ptr<NcclCommunicator> comm(new NcclCommunicator(cpu, device));
  CKPT_RETURN_IF_ERROR(comm->Init());
  return comm;
}

// Three steps, each agreed over the CPU communicator before the next, so
// that no rank enters NCCL's initialisation while another has given up.
absl::Status NcclCommunicator::Init() {
  ScopedDevice scope;  // the device stays current until NCCL is set up
  CKPT_RETURN_IF_ERROR(AgreeOnFirstError(PrepareDevice(&scope)));
  std::string id;  // rank 0's unique id reaches every rank, or its failure
  absl::Status made;
  if (rank() == 0) {
    absl::StatusOr<std::string> unique = MakeUniqueId();
    made = unique.status();
    if (unique.ok()) id = *std::move(unique);
  }
  CKPT_RETURN_IF_ERROR(AgreeOnFirstError(made));
  CKPT_RETURN_IF_ERROR(Broadcast(&id, 0));
  if (id.size() != sizeof(ncclUniqueId)) {
    return absl::InternalError(
        absl::StrCat("NcclCommunicator::Create: rank 0's unique id has ",
                     id.size(), " bytes"));  // the same on every rank
  }
  ncclUniqueId unique;
  std::memcpy(unique.internal, id.data(), sizeof(unique.internal));
  const ncclResult_t result = ncclCommInitRank(&comm_, size(), unique, rank());
  if (result != ncclSuccess) comm_ = nullptr;
  return AgreeOnFirstError(internal::NcclErrorToStatus(
      result, "ncclCommInitRank(&comm_, size(), unique, rank())", nullptr));
}

absl::Status NcclCommunicator::PrepareDevice(ScopedDevice* scope) {
  if (device_ < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclCommunicator::Create on rank ", rank(), ": device ",
                     device_, " is not a CUDA device ordinal"));
  }
  CKPT_RETURN_IF_ERROR(scope->Enter(device_));
  CKPT_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  return absl::OkStatus();
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr && stream_ == nullptr) return;
  ScopedDevice scope;
  if (!scope.Enter(device_).ok()) return;  // nobody to report to
  if (comm_ != nullptr) (void)ncclCommDestroy(comm_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

absl::Status NcclCommunicator::AllToAll(absl::Span<const SendBuffer> send,
                                        absl::Span<const RecvBuffer> recv,
                                        MemoryKind memory) {
  if (memory == MemoryKind::kHost) return cpu_->AllToAll(send, recv, memory);
  CKPT_RETURN_IF_ERROR(AgreeOnDeviceSizes(send, recv));
  // A rank that failed in NCCL may leave its peers blocked there (as with
  // any NCCL collective); those that return agree on the outcome.
  return AgreeOnFirstError(ExchangeOnDevice(send, recv));
}

absl::Status NcclCommunicator::AgreeOnDeviceSizes(
    absl::Span<const SendBuffer> send, absl::Span<const RecvBuffer> recv) {
  const int n = size();
  absl::Status verdict =
      CheckAllToAllArguments(send.size(), recv.size(), MemoryKind::kCuda);
  if (verdict.ok()) verdict = CheckBuffersOnDevice(send, recv);
  std::vector<uint64_t> sent(n, kBadArguments), arriving(n);
  if (verdict.ok()) {
    for (int p = 0; p < n; ++p) sent[p] = send[p].size;
  }
  std::vector<SendBuffer> size_out(n);
  std::vector<RecvBuffer> size_in(n);
  for (int p = 0; p < n; ++p) {
    size_out[p] = {&sent[p], sizeof(uint64_t)};
    size_in[p] = {&arriving[p], sizeof(uint64_t)};
  }
  CKPT_RETURN_IF_ERROR(cpu_->AllToAll(size_out, size_in, MemoryKind::kHost));
  for (int s = 0; s < n && verdict.ok(); ++s) {
    if (arriving[s] != kBadArguments && arriving[s] != recv[s].size)
      verdict = AllToAllSizeMismatch(s, arriving[s], rank(), recv[s].size);
  }
  return AgreeOnFirstError(verdict);
}

absl::Status NcclCommunicator::CheckBuffersOnDevice(
    absl::Span<const SendBuffer> send, absl::Span<const RecvBuffer> recv) {
  for (int p = 0; p < size(); ++p) {
    if (send[p].size > 0) {
      CKPT_RETURN_IF_ERROR(
          CheckOnDevice(send[p].data, device_,
                        absl::StrCat("AllToAll on rank ", rank(),
                                     ": the send buffer for rank ", p)));
    }
    if (recv[p].size > 0) {
      CKPT_RETURN_IF_ERROR(
          CheckOnDevice(recv[p].data, device_,
                        absl::StrCat("AllToAll on rank ", rank(),
                                     ": the receive buffer from rank ", p)));
    }
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::ExchangeOnDevice(
    absl::Span<const SendBuffer> send, absl::Span<const RecvBuffer> recv) {
  ScopedDevice scope;
  CKPT_RETURN_IF_ERROR(scope.Enter(device_));
  const int me = rank();
  if (send[me].size > 0) {
    CKPT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(recv[me].data, send[me].data, send[me].size,
                        cudaMemcpyDeviceToDevice, stream_));
  }
  CKPT_NCCL_RETURN_IF_ERROR(ncclGroupStart(), comm_);
  absl::Status issued;
  for (int p = 0; p < size() && issued.ok(); ++p) {
    if (p == me) continue;
    if (send[p].size > 0) {
      issued = internal::NcclErrorToStatus(
          ncclSend(send[p].data, send[p].size, ncclUint8, p, comm_, stream_),
          "ncclSend", comm_);
    }
    if (issued.ok() && recv[p].size > 0) {
      issued = internal::NcclErrorToStatus(
          ncclRecv(recv[p].data, recv[p].size, ncclUint8, p, comm_, stream_),
          "ncclRecv", comm_);
    }
  }
  // The group is closed even after a failed call, which NCCL then reports.
  const ncclResult_t ended = ncclGroupEnd();
  CKPT_RETURN_IF_ERROR(issued);
  CKPT_NCCL_RETURN_IF_ERROR(ended, comm_);
  CKPT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  ncclResult_t async = ncclSuccess;
  CKPT_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &async), comm_);
  return internal::NcclErrorToStatus(async, "NCCL (asynchronous error)", comm_);
}

}  // namespace ckpt::gpu

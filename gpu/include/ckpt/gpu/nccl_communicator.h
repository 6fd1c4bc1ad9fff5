// ckpt::gpu::NcclCommunicator: a Communicator whose data plane (AllToAll of
// device memory) runs over NCCL, while its metadata collectives run over
// the trainer's CPU communicator. Built as the separate library
// ckpt::ckpt_nccl (only when CMake finds NCCL under the CUDA Toolkit), so
// neither ckpt nor ckpt_gpu depends on NCCL.
//
//   // CMake: target_link_libraries(trainer PRIVATE ckpt::ckpt_nccl)
//   auto cpu = ckpt::MpiCommunicator::Create(MPI_COMM_WORLD).value();
//   auto nccl =
//       ckpt::gpu::NcclCommunicator::Create(cpu.get(), local_gpu).value();
//   // Pass nccl.get() wherever ckpt takes a Communicator: metadata goes
//   // over MPI, the device bytes of a cooperative load over NCCL.
//
// Every rank uses one CUDA device (`device`); ranks of one node use
// different devices. rank() and size() are those of the CPU communicator.
//
// Thread safety: thread-compatible, like every Communicator. Calls leave
// the calling thread's current CUDA device as they found it.
#ifndef CKPT_GPU_NCCL_COMMUNICATOR_H_
#define CKPT_GPU_NCCL_COMMUNICATOR_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ckpt/communicator.h"

namespace ckpt::gpu {

namespace internal {
class ScopedDevice;  // ckpt/gpu/scoped_device.h
}  // namespace internal

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `cpu` (every rank of it calls Create with its own
  // device): rank 0 makes an ncclUniqueId and broadcasts it over `cpu`;
  // every rank creates a non-blocking CUDA stream and its NCCL
  // communicator (ncclCommInitRank) on `device`. `cpu` is not owned and
  // must outlive the result. A failure on any rank before
  // ncclCommInitRank (a bad device, a stream, rank 0's unique id) fails
  // Create on every rank with that rank's status, so no rank is left
  // waiting in NCCL's initialisation, which (like any NCCL collective)
  // blocks until every rank has entered it.
  // Errors: InvalidArgument for a null `cpu` or a negative `device`; CUDA
  // errors as status_macros.h maps them (FailedPrecondition without a
  // device); NCCL errors as internal::NcclErrorToStatus.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      Communicator* cpu, int device);

  // Destroys the NCCL communicator and the stream (after its work).
  // REQUIRES: no AllToAll in progress.
  ~NcclCommunicator() override;

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return cpu_->rank(); }
  int size() const override { return cpu_->size(); }

  // The metadata collectives are the CPU communicator's.
  absl::StatusOr<std::vector<std::string>> AllGather(
      absl::string_view mine) override {
    return cpu_->AllGather(mine);
  }
  absl::StatusOr<std::vector<std::string>> Gather(absl::string_view mine,
                                                  int root) override {
    return cpu_->Gather(mine, root);
  }
  absl::Status Broadcast(std::string* data, int root) override {
    return cpu_->Broadcast(data, root);
  }
  absl::Status Barrier() override { return cpu_->Barrier(); }
  absl::Status AllReduceMax(std::vector<int64_t>* values) override {
    return cpu_->AllReduceMax(values);
  }
  std::string NodeName() const override { return cpu_->NodeName(); }

  // kHost: the CPU communicator's AllToAll. kCuda (every buffer on this
  // rank's device; a non-empty buffer elsewhere, host memory included, is
  // InvalidArgument): the sizes go first through the CPU communicator's
  // AllToAll and errors are agreed there (see Communicator::AllToAll: no
  // rank enters NCCL when any rank found a mismatch or a bad buffer); then one
  // ncclGroupStart/ncclGroupEnd of an ncclSend and an ncclRecv per
  // non-empty part on this object's stream, the self-part copied with
  // cudaMemcpyAsync on the same stream; then this rank waits for that
  // stream only (never the device), and the ranks agree on the outcome.
  // REQUIRES (kCuda): the send buffers are complete when AllToAll is
  // called (the caller has synchronised the work that writes them), and
  // nothing reads or writes the receive buffers until it returns. On
  // return the received bytes are in place for any stream.
  absl::Status AllToAll(absl::Span<const SendBuffer> send,
                        absl::Span<const RecvBuffer> recv,
                        MemoryKind memory) override;
  bool SupportsDeviceMemory() const override { return true; }

  int device() const { return device_; }
  // Owned by this object; valid until it is destroyed.
  ncclComm_t nccl_comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }

 private:
  NcclCommunicator(Communicator* cpu, int device)
      : cpu_(cpu), device_(device) {}
  // Create's collective steps, and its local preparation of the device.
  absl::Status Init();
  absl::Status PrepareDevice(internal::ScopedDevice* scope);
  // AllToAll of device memory: the size check, then the NCCL exchange.
  absl::Status AgreeOnDeviceSizes(absl::Span<const SendBuffer> send,
                                  absl::Span<const RecvBuffer> recv);
  // InvalidArgument naming the first non-empty buffer that is not memory
  // of this rank's device (cudaPointerGetAttributes). Local.
  absl::Status CheckBuffersOnDevice(absl::Span<const SendBuffer> send,
                                    absl::Span<const RecvBuffer> recv);
  absl::Status ExchangeOnDevice(absl::Span<const SendBuffer> send,
                                absl::Span<const RecvBuffer> recv);

  Communicator* const cpu_;
  const int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

namespace internal {

// `result` (an NCCL return code) as a Status: OK for ncclSuccess;
// otherwise InvalidArgument for ncclInvalidArgument and ncclInvalidUsage,
// Unavailable for ncclSystemError and ncclRemoteError (a peer or the
// network failed), Internal for the rest, with the message
// "<call> failed: <ncclGetErrorString> (ncclResult_t N)" followed by
// ": <ncclGetLastError>" when NCCL has more to say. `comm` may be null.
absl::Status NcclErrorToStatus(ncclResult_t result, absl::string_view call,
                               ncclComm_t comm);

}  // namespace internal

}  // namespace ckpt::gpu

#endif  // CKPT_GPU_NCCL_COMMUNICATOR_H_

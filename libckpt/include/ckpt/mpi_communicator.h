// MpiCommunicator: ckpt::Communicator over an MPI communicator, for
// trainers launched with mpirun/srun. Built as the separate library
// ckpt::ckpt_mpi (only when CMake finds MPI), so the core library never
// depends on MPI.
//
//   // CMake: target_link_libraries(trainer PRIVATE ckpt::ckpt_mpi)
//   #include "ckpt/mpi_communicator.h"
//   #include "ckpt/writer.h"
//
//   int provided;                    // the caller initialises MPI...
//   MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
//   {
//     // Collective over MPI_COMM_WORLD: duplicates it, so checkpoint
//     // traffic never matches the trainer's own messages.
//     auto comm = ckpt::MpiCommunicator::Create(MPI_COMM_WORLD).value();
//     ckpt::Writer::Options wo;
//     wo.comm = comm.get();
//     auto writer = ckpt::Writer::Create(wo).value();
//     uint64_t r = comm->rank();     // 4 ranks, 1024 rows each
//     absl::Status s = writer->AddTensor("w", ckpt::DType::kFloat32, {4096,
//     1024},
//                                        ckpt::Box{{r * 1024, 0}, {1024,
//                                        1024}}, w);
//     if (s.ok()) s = writer->Save("/ckpt/run1", step, {}).status();
//     // s is the same on every rank.
//   }                                // ...destroys its communicators...
//   MPI_Finalize();                  // ...and finalises MPI.
//
// Errors: every MPI call runs with MPI_ERRORS_RETURN on the duplicated
// communicator; a failed call becomes an Internal status (ResourceExhausted
// for MPI_ERR_NO_MEM) naming the Communicator call, the MPI function and
// MPI's error string. As with any MPI program, a rank whose peer failed or
// died may block instead of observing an error; ckpt treats every error as
// fatal for the save or load in progress (see ckpt/communicator.h).
//
// Sizes: MPI counts are C ints. Transfers larger than
// Options::max_bytes_per_call (at most INT_MAX) are split into several MPI
// calls, so AllGather, Broadcast and AllToAll move any number of bytes.
//
// Thread safety: thread-compatible; like every Communicator it is used by
// one thread at a time. ckpt's I/O threads never call MPI, so MPI_Init_thread
// with MPI_THREAD_FUNNELED suffices when that thread is the one that
// initialised MPI; otherwise MPI_THREAD_SERIALIZED is needed.
#ifndef CKPT_MPI_COMMUNICATOR_H_
#define CKPT_MPI_COMMUNICATOR_H_

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/communicator.h"

namespace ckpt {
namespace internal {

// How MpiCommunicator::AllToAll splits its transfer into MPI_Alltoallv
// calls: `groups` groups of peer distances (receiver - sender modulo size,
// `shifts_per_group` distances each, starting at 1) times `rounds` rounds
// of `piece` bytes of each part. No calls when groups is 0.
struct AllToAllPlan {
  int64_t groups = 0, rounds = 0, piece = 0;
  int shifts_per_group = 0;
};

// The plan every rank derives from the maxima over ranks of its largest
// part, its total sent or received and the number of peers it sends to or
// receives from (self excluded), for `size` ranks and a limit of `limit`
// bytes per call (1 to INT_MAX).
AllToAllPlan PlanAllToAll(int64_t largest_part, int64_t largest_total,
                          int64_t widest_fan, int size, int64_t limit);

}  // namespace internal

class MpiCommunicator final : public Communicator {
 public:
  struct Options {
    // Largest count passed to one MPI data-moving call, in bytes (1 to
    // INT_MAX). Larger AllGather and Broadcast payloads take several calls.
    // The default stays well below INT_MAX: some transports misbehave on
    // messages near 2 GiB. Tests lower it to exercise the split path.
    int64_t max_bytes_per_call = int64_t{1} << 30;
  };

  // Duplicates `comm` (MPI_Comm_dup: collective over `comm`, so every rank
  // of it calls Create) and sets MPI_ERRORS_RETURN on the duplicate. `comm`
  // itself is neither owned nor modified. The duplicate is freed by the
  // destructor.
  // REQUIRES: MPI is initialised and not finalised (the caller calls
  // MPI_Init/MPI_Init_thread and MPI_Finalize; ckpt never does).
  // Errors: FailedPrecondition if MPI is not initialised or already
  // finalised; InvalidArgument for MPI_COMM_NULL, an intercommunicator or
  // bad options; Internal if an MPI call fails.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Create(
      MPI_Comm comm, const Options& options);
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Create(
      MPI_Comm comm) {
    return Create(comm, Options());
  }

  // Frees the duplicated communicator. REQUIRES: runs before MPI_Finalize
  // (if MPI is already finalised the handle is left alone).
  ~MpiCommunicator() override;

  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // MPI_Allgather of the int64 lengths, then MPI_Allgatherv of the bytes
  // (several rounds when the total exceeds max_bytes_per_call).
  absl::StatusOr<std::vector<std::string>> AllGather(
      absl::string_view mine) override;
  // MPI_Allgather of the int64 lengths (so that every rank derives the same
  // rounds), then MPI_Gatherv of the bytes to `root` only (several rounds
  // when the total exceeds max_bytes_per_call). InvalidArgument on every
  // rank if `root` is not a rank of the communicator.
  absl::StatusOr<std::vector<std::string>> Gather(absl::string_view mine,
                                                  int root) override;
  // MPI_Bcast of the length, then of the bytes (in pieces of at most
  // max_bytes_per_call). InvalidArgument on every rank if `root` is not a
  // rank of the communicator. REQUIRES: data != nullptr.
  absl::Status Broadcast(std::string* data, int root) override;
  absl::Status Barrier() override;
  // MPI_Allreduce(MPI_INT64_T, MPI_MAX), preceded by a check that every
  // rank passed the same count (InvalidArgument on every rank otherwise,
  // instead of MPI's undefined behaviour). REQUIRES: values != nullptr.
  absl::Status AllReduceMax(std::vector<int64_t>* values) override;
  // MPI_Alltoall of the uint64 send sizes, so that each receiver checks
  // what arrives against its receive sizes; one MPI_Allreduce to agree on
  // errors (then, on error, MPI_Bcast of the message: every rank returns
  // the same status, see Communicator::AllToAll) and on the rounds; then
  // MPI_Alltoallv of the bytes in rounds. One round when every rank sends
  // and receives at most max_bytes_per_call bytes; otherwise each round
  // moves at most max_bytes_per_call / F bytes of each part, F being the
  // largest number of peers any rank sends to or receives from (and only
  // some peers per round when the limit is below F), so no count, nor
  // count plus displacement, of a call exceeds max_bytes_per_call on
  // either side (internal::PlanAllToAll).
  // A round's parts are passed to MPI in place when they lie within
  // max_bytes_per_call bytes of each other (e.g. packed in one buffer), and
  // through a staging buffer of at most that size otherwise. Self-sends are
  // copied with memcpy. Host memory only.
  absl::Status AllToAll(absl::Span<const SendBuffer> send,
                        absl::Span<const RecvBuffer> recv,
                        MemoryKind memory) override;

  // MPI_Get_processor_name, read once by Create.
  std::string NodeName() const override { return node_name_; }

  // The duplicated communicator ckpt's traffic runs on. Owned by this
  // object; valid until it is destroyed.
  MPI_Comm comm() const { return comm_; }

 private:
  MpiCommunicator(MPI_Comm comm, int rank, int size, std::string node_name,
                  const Options& options)
      : comm_(comm),
        rank_(rank),
        size_(size),
        node_name_(std::move(node_name)),
        options_(options) {}

  // AllGather (root < 0: every rank receives) and Gather (only `root`
  // receives): the lengths, then the bytes in rounds within
  // max_bytes_per_call. `call` names the public call in errors.
  absl::StatusOr<std::vector<std::string>> GatherBytes(absl::string_view mine,
                                                       int root,
                                                       const char* call);
  // AllToAll's exchange of the sizes and the agreement on errors and on
  // the plan of its calls.
  absl::Status AgreeOnAllToAll(absl::Span<const SendBuffer> send,
                               absl::Span<const RecvBuffer> recv,
                               MemoryKind memory, internal::AllToAllPlan* plan);
  // AllToAll's transfer, once agreed: the plan's MPI_Alltoallv calls.
  absl::Status AllToAllRounds(absl::Span<const SendBuffer> send,
                              absl::Span<const RecvBuffer> recv,
                              const internal::AllToAllPlan& plan);

  MPI_Comm comm_;
  const int rank_;
  const int size_;
  const std::string node_name_;
  const Options options_;
};

namespace internal {

// `rc` (an MPI return code) as a Status: OK for MPI_SUCCESS, otherwise
// Internal (ResourceExhausted for MPI_ERR_NO_MEM) with the message
// "<what>: <MPI error string> (MPI error class N)". `what` names the
// Communicator call and the MPI function, e.g. "AllGather: MPI_Allgatherv".
absl::Status MpiStatus(int rc, absl::string_view what);

}  // namespace internal

}  // namespace ckpt

#endif  // CKPT_MPI_COMMUNICATOR_H_

// Communicator: the collectives a multi-rank save or load needs. ckpt ships
// an in-process implementation (ranks as threads), an MPI one, and the
// trivial single-process one below; a trainer can adapt its own process
// group (torch.distributed, NCCL, ...) by implementing rank, size and the
// four collectives AllGather, Broadcast, Barrier and AllReduceMax (Gather and
// AllToAll have defaults built on AllGather; overriding them saves traffic at
// scale: see AllToAll for the implementations that move each byte once).
//
// Contract for implementations: every rank calls the same sequence of
// collectives with the same `root`; calls block until the collective is
// complete on this rank; an implementation need not be thread-safe (ckpt
// calls it from one thread per rank). A failed collective returns an error
// on every rank that can observe it; ckpt treats any error as fatal for the
// save or load in progress.
#ifndef CKPT_COMMUNICATOR_H_
#define CKPT_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ckpt/types.h"

namespace ckpt {

// Bytes this rank sends to one peer (AllToAll). `data` may be null when
// `size` is 0.
struct SendBuffer {
  const void* data = nullptr;
  size_t size = 0;
};
// Where this rank receives the bytes of one peer (AllToAll); `size` is
// exactly what that peer sends.
struct RecvBuffer {
  void* data = nullptr;
  size_t size = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Every rank contributes `mine`; every rank receives all contributions in
  // rank order (lengths may differ).
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> AllGather(
      absl::string_view mine) = 0;
  // Every rank contributes `mine`; `root` receives all contributions in
  // rank order, every other rank an empty vector. The coordinator of a save
  // gathers the local plans and the shard reports this way: at thousands of
  // ranks, sending them to one rank moves 1/size of what AllGather moves.
  // InvalidArgument on every rank if `root` is not a rank. The default
  // calls AllGather, so an adapter that implements only the other calls
  // works (and pays AllGather's traffic); MpiCommunicator overrides it
  // with MPI_Gatherv.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> Gather(
      absl::string_view mine, int root) {
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Gather: root ", root, " is not a rank of the communicator (size ",
          size(), ")"));
    }
    absl::StatusOr<std::vector<std::string>> all = AllGather(mine);
    if (all.ok() && rank() != root) all->clear();
    return all;
  }
  // `root`'s `*data` is copied to every rank's `*data`.
  [[nodiscard]] virtual absl::Status Broadcast(std::string* data, int root) = 0;
  [[nodiscard]] virtual absl::Status Barrier() = 0;
  // Element-wise maximum over ranks of a few integers (in place). Used to
  // agree on flags ("did any rank fail", "did any structure change").
  [[nodiscard]] virtual absl::Status AllReduceMax(
      std::vector<int64_t>* values) = 0;

  // The data plane of a cooperative load: every rank passes size() send
  // and size() receive buffers, indexed by peer rank; send[d] of this rank
  // arrives in recv[r] of rank d (r = this rank). The caller plans both
  // sides, so recv[s].size equals what rank s sends here; a mismatch is
  // InvalidArgument "AllToAll: rank S sends N bytes to rank R, which
  // expects M". `memory` is where all the buffers of this call live: kHost,
  // or kCuda for an implementation that reports SupportsDeviceMemory()
  // (NCCL). Self-sends (d == rank) are copied locally. Buffers must not
  // overlap; send buffers are only read, and stay the caller's.
  //
  // Errors: bad arguments on any rank (a buffer count other than size(),
  // device memory where unsupported) and size mismatches fail the call on
  // every rank with the same status, that of the lowest rank that found
  // one, and every rank returns (no rank waits for a transfer that the
  // others skip). The receive buffers' contents are then unspecified.
  //
  // The default works for any adapter: it moves everything through
  // AllGather (each rank receives every rank's payload, size() times the
  // traffic) and supports only host memory. These implementations move
  // each byte once (from the sender's buffer to the receiver's, at most
  // through a bounded staging buffer): InProcessCommunicator (receivers
  // copy straight from the senders' buffers), MpiCommunicator
  // (MPI_Alltoallv, in rounds within its byte limit), ckpt::gpu::
  // NcclCommunicator (grouped ncclSend/ncclRecv for device memory; host
  // memory goes to the CPU communicator it wraps), and the Python adapter
  // of an object with an all_to_all method when that method does.
  [[nodiscard]] virtual absl::Status AllToAll(absl::Span<const SendBuffer> send,
                                              absl::Span<const RecvBuffer> recv,
                                              MemoryKind memory);
  // Whether AllToAll accepts MemoryKind::kCuda buffers.
  virtual bool SupportsDeviceMemory() const { return false; }
  // Whether all ranks run in one address space: a host pointer of any rank
  // is valid, and its memory readable and writable, in every rank (ranks
  // are threads of one process). Must be the same on every rank. A
  // cooperative load then writes the bytes each rank reads straight into
  // the other ranks' host destinations instead of exchanging them with
  // AllToAll. True for InProcessCommunicator; false by default (processes,
  // MPI, Python adapters).
  virtual bool SharesAddressSpace() const { return false; }
  // The name of the node (machine) this rank runs on, e.g. its host name:
  // ranks that report the same non-empty name share that node's storage
  // bandwidth and network link, and a cooperative load spreads its reads
  // evenly over nodes first, then over the ranks of each node. Empty (the
  // default) means unknown: the rank counts as a node of its own. Local (no
  // communication); differs between ranks of different nodes. MPI reports
  // MPI_Get_processor_name, the Python adapters the host name.
  virtual std::string NodeName() const { return ""; }

 protected:
  // Building blocks of AllToAll implementations, so that every one checks
  // and reports alike.
  //
  // OK, or InvalidArgument (naming this rank) when `sends` or `recvs` is
  // not size() or `memory` is device memory and SupportsDeviceMemory() is
  // false. Local: no communication.
  absl::Status CheckAllToAllArguments(size_t sends, size_t recvs,
                                      MemoryKind memory) const;
  // The InvalidArgument of a receive buffer whose size differs from what
  // its sender sends.
  static absl::Status AllToAllSizeMismatch(int sender, uint64_t sent,
                                           int receiver, uint64_t expected);
  // Collective (one AllReduceMax, plus one Broadcast when some rank
  // failed): every rank passes its own verdict; every rank returns the
  // verdict of the lowest rank whose verdict is an error (code and
  // message), or OK. `max_values` (null, or the same count on every rank)
  // are reduced with max in the same AllReduceMax, so that a caller agrees
  // on its parameters and on success in one round trip. A failure of the
  // collectives themselves is returned as it is.
  absl::Status AgreeOnFirstError(const absl::Status& mine,
                                 std::vector<int64_t>* max_values = nullptr);
};

// World of one: rank 0 of size 1. Stateless and thread-compatible.
class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::StatusOr<std::vector<std::string>> AllGather(
      absl::string_view mine) override {
    return std::vector<std::string>{std::string(mine)};
  }
  absl::Status Broadcast(std::string*, int) override {
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
  absl::Status AllReduceMax(std::vector<int64_t>*) override {
    return absl::OkStatus();
  }
};

}  // namespace ckpt

#endif  // CKPT_COMMUNICATOR_H_

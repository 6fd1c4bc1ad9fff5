// Communicator: the collectives a multi-rank save or load needs. ckpt ships
// an in-process implementation (ranks as threads), an MPI one, and the
// trivial single-process one below; a trainer can adapt its own process
// group (torch.distributed, NCCL, ...) by implementing these five calls.
//
// Contract for implementations: every rank calls the same sequence of
// collectives with the same `root`; calls block until the collective is
// complete on this rank; an implementation need not be thread-safe (ckpt
// calls it from one thread per rank). A failed collective returns an error
// on every rank that can observe it; ckpt treats any error as fatal for the
// save or load in progress.
#ifndef CKPT_COMMUNICATOR_H_
#define CKPT_COMMUNICATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Every rank contributes `mine`; every rank receives all contributions in
  // rank order (lengths may differ).
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> AllGather(
      absl::string_view mine) = 0;
  // `root`'s `*data` is copied to every rank's `*data`.
  [[nodiscard]] virtual absl::Status Broadcast(std::string* data, int root) = 0;
  [[nodiscard]] virtual absl::Status Barrier() = 0;
  // Element-wise maximum over ranks of a few integers (in place). Used to
  // agree on flags ("did any rank fail", "did any structure change").
  [[nodiscard]] virtual absl::Status AllReduceMax(std::vector<int64_t>* values) = 0;
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
  absl::Status Broadcast(std::string*, int) override { return absl::OkStatus(); }
  absl::Status Barrier() override { return absl::OkStatus(); }
  absl::Status AllReduceMax(std::vector<int64_t>*) override {
    return absl::OkStatus();
  }
};

}  // namespace ckpt

#endif  // CKPT_COMMUNICATOR_H_

// In-process communicator: ranks are threads of one process. Tests and
// benchmarks model a multi-rank job with it, and the DCP import of
// interop/io (ckpt-convert --from dcp) saves the ranks it imports through it.
// Its AllToAll moves each byte once: every rank publishes the address of
// its send buffers, and each receiver copies its parts straight from them
// (the senders wait until every receiver has copied). Its ranks share one
// address space (Communicator::SharesAddressSpace).
//
//   ckpt::InProcessWorld world(4);
//   ckpt::RunRanks(world, [&](ckpt::Communicator& comm) { ... });
#ifndef CKPT_IN_PROCESS_H_
#define CKPT_IN_PROCESS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ckpt/communicator.h"

namespace ckpt {

// Shared state of `size` ranks. Thread-safe; outlives its communicators.
class InProcessWorld {
 public:
  explicit InProcessWorld(int size);
  // With node names: rank r's communicator reports node_names[r] as its
  // NodeName() (tests and benchmarks model a job of several nodes this
  // way; by default, and for ranks beyond node_names.size(), "": unknown).
  InProcessWorld(int size, std::vector<std::string> node_names);
  ~InProcessWorld();
  int size() const { return size_; }
  // The communicator of `rank`, owned by the world. Each is used by one
  // thread at a time.
  Communicator* comm(int rank);

 private:
  friend class InProcessCommunicator;
  // Deposits `mine`, waits for all ranks, returns every rank's contribution.
  std::vector<std::string> Exchange(int rank, std::string mine);

  class Rendezvous;  // in_process.cc

  const int size_;
  const std::vector<std::string> node_names_;
  const std::unique_ptr<Rendezvous> rendezvous_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

// Runs fn(comm) on one thread per rank of `world` and waits for all.
// Returns the first non-OK status in rank order.
absl::Status RunRanks(InProcessWorld& world,
                      const std::function<absl::Status(Communicator&)>& fn);

}  // namespace ckpt

#endif  // CKPT_IN_PROCESS_H_

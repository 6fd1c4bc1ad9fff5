// Internal to libckpt: steps shared by the two ways a cooperative load
// delivers bytes (coop_load.cc: exchanged with AllToAll; coop_direct.cc:
// written straight into the destinations of ranks that share one address
// space).
#ifndef CKPT_LIBCKPT_LOAD_COOP_LOAD_H_
#define CKPT_LIBCKPT_LOAD_COOP_LOAD_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "ckpt/communicator.h"
#include "ckpt/reader.h"
#include "read/read_executor.h"

namespace ckpt::internal {

// The destinations of every rank of a cooperative load as one list, for
// ranks that share one address space (Communicator::SharesAddressSpace):
// local request i of rank r is all.reqs[first[r] + i], a 1-d uint8
// request of its bytes at the rank's host pointer, without on_complete.
struct AllDestinations {
  Prepared all;
  std::vector<uint32_t> first;  // ranks + 1 offsets
};

// Collective: OK on every rank if `local` is OK on every rank; otherwise,
// on every rank, the status of the lowest failing rank R, its message
// prefixed with "rank R of N: ".
absl::Status Agree(Communicator* comm, const absl::Status& local);

// Fills the figures of `report` that every cooperative load reports alike
// once its bytes are delivered: bytes loaded (of `p`), bytes read and
// blocks verified (by `run`), and sorts the entry lists.
void FinishReport(const Prepared& p, const LoadRun& run, LoadReport* report);

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_LOAD_COOP_LOAD_H_

// Send buffers that the other ranks of one machine read in place: the
// host-memory exchange of a cooperative load between processes of one
// machine, without AllToAll (docs/cooperative-load.md, "Exchange").
//
// Each rank creates a POSIX shared-memory segment of two halves, writes
// what it sends in a round into one half, and, once every rank's reads of
// that round are done (the round's agreement), every receiver copies its
// bytes straight out of the senders' halves into its destinations. Rounds
// alternate halves, so a rank writing round k + 2 into a half never
// overlaps a receiver still reading round k from it: the agreement of
// round k + 1 lies between them on every rank. Through AllToAll the same
// bytes cost two more copies each (into and out of the transport).
//
// Segments are created with O_EXCL, mode 0600 and a random name; each
// carries a random cookie in its first bytes, which a peer checks after
// mapping it. Once every rank mapped every other rank's segment (or one
// failed), each unlinks its own: a segment outlives its name only while
// mapped, and a crash leaves at most the segments of ranks between create
// and unlink.
#ifndef CKPT_LIBCKPT_LOAD_COOP_SHARED_ARENA_H_
#define CKPT_LIBCKPT_LOAD_COOP_SHARED_ARENA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/communicator.h"

namespace ckpt::internal {

class SharedArenas {
 public:
  // Collective: every rank of `comm` calls it, `half_bytes` being the most
  // this rank sends in one round (ranks may differ) and `wanted` whether
  // it offers shared memory at all. Returns the arenas on every rank, or
  // null on every rank when some rank does not want them or cannot
  // create its segment (no /dev/shm, too little room in it: the space is
  // reserved with posix_fallocate, so a full tmpfs is refused here and
  // never faults later) or map another rank's (another machine). Errors
  // are those of the communicator's collectives only.
  static absl::StatusOr<std::unique_ptr<SharedArenas>> Create(
      Communicator* comm, uint64_t half_bytes, bool wanted);

  SharedArenas(const SharedArenas&) = delete;
  SharedArenas& operator=(const SharedArenas&) = delete;
  ~SharedArenas();  // unmaps every segment

  // This rank's half `half` (0 or 1), at least half_bytes long.
  char* Mine(uint32_t half) const;
  // Rank `rank`'s half `half`, read-only (this rank's own too).
  const char* Of(uint32_t rank, uint32_t half) const;

 private:
  struct Mapping {
    char* base = nullptr;  // the whole segment (header first)
    uint64_t size = 0;
    uint64_t half = 0;  // bytes in each half
  };
  explicit SharedArenas(uint32_t me) : me_(me) {}

  uint32_t me_;
  std::vector<Mapping> maps_;  // [rank]
};

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_LOAD_COOP_SHARED_ARENA_H_

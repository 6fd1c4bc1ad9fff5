// load/coop/: cooperative loads (ckpt/reader.h, "Cooperative loads"; how
// they work: docs/cooperative-load.md), in which the ranks of a
// communicator read every needed stored block once between them and deliver
// its bytes to the ranks whose requests need them. This header: one such
// load, which the Reader runs over its shards (CooperativeLoad::Source).
//
// Every rank goes through the same collectives in the same order whatever
// happens locally: a step that can fail on one rank is followed by an
// agreement that makes every rank return the first failing rank's status.
#ifndef CKPT_LIBCKPT_LOAD_COOP_COOPERATIVE_LOAD_H_
#define CKPT_LIBCKPT_LOAD_COOP_COOPERATIVE_LOAD_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/communicator.h"
#include "ckpt/device_memory.h"
#include "ckpt/format/records.h"
#include "ckpt/reader.h"
#include "load/coop/coop_plan.h"
#include "read/read_executor.h"
#include "read/read_plan.h"
#include "read/shard_set.h"
#include "staging/staging_pool.h"

namespace ckpt::internal {

// The destinations of every rank of a cooperative load as one list, for
// ranks that share one address space (Communicator::SharesAddressSpace):
// local request i of rank r is all.reqs[first[r] + i], a 1-d uint8
// request of its bytes at the rank's host pointer, without on_complete.
struct AllDestinations {
  Prepared all;
  std::vector<uint32_t> first;  // ranks + 1 offsets
};

class CooperativeLoad {
 public:
  // What the load uses of the Reader that runs it; all must outlive the
  // load.
  struct Source {
    const format::Manifest* manifest = nullptr;
    ShardSet* shards = nullptr;  // of that manifest's checkpoint
    Communicator* comm = nullptr;
    DeviceMemory* device_memory = nullptr;  // may be null
    // CoopOptions::min_read_bytes (kObjectStoreMinReadBytes on an object
    // store, else 0).
    uint64_t min_read_bytes = 0;
    // The pinned buffers of loads into device memory (made on first need).
    std::function<absl::StatusOr<StagingPool*>()> upload_pool;
    // This rank's load of its own requests alone (the Reader's single-rank
    // load): what Run does when sharing would save under 1% of the reads
    // (docs/cooperative-load.md, "Reading alone").
    std::function<absl::StatusOr<LoadReport>(const Prepared&, LoadReport)>
        load_alone;
  };

  // A load on `threads` I/O threads per rank.
  CooperativeLoad(Source source, int threads)
      : src_(std::move(source)), threads_(threads) {}

  // Collective: every rank of source.comm calls it with its checked
  // requests (the Reader's Prepare), or with why they are not: then the
  // load fails on every rank. `report` holds what Prepare listed. Returns
  // this rank's report, or on every rank the status of the lowest failing
  // rank R, its message prefixed with "rank R of N: " (failures of the
  // collectives themselves as they are).
  absl::StatusOr<LoadReport> Run(const absl::StatusOr<Prepared>& prepared,
                                 const LoadOptions& options, LoadReport report);

 private:
  // OK on every rank if `local` is OK on every rank; otherwise, on every
  // rank, the status of the lowest failing rank R, prefixed "rank R of N: ".
  absl::Status Agree(const absl::Status& local);
  // Every rank's `mine` in rank order when it is OK on every rank;
  // otherwise, as Agree, the status of the lowest failing rank. One
  // collective (an Agree and an AllGather in one).
  absl::StatusOr<std::vector<std::string>> GatherOrAgree(
      const absl::StatusOr<std::string>& mine);
  // Opens the shards of `ids` between the ranks (shard ids[i] on rank
  // i % size) and shares their indexes, so that every rank holds every
  // one (ShardSet::Adopt). Collective (one): returns the first rank's
  // error in opening its shards, as Agree; *adopted is this rank's own
  // outcome of adopting the others' indexes, for the caller's next Agree.
  absl::Status ShareShards(const std::vector<uint32_t>& ids,
                           absl::Status* adopted);
  // This rank's requests as GroupRequests takes them, or why there are
  // none (`p`'s error).
  absl::StatusOr<std::string> EncodedRequests(
      const absl::StatusOr<Prepared>& p);
  // This rank's shards of ShareShards, opened, and their metas as bytes.
  absl::StatusOr<std::string> OwnShardMetas(const std::vector<uint32_t>& own);
  // What this rank checks before the plan, for the ranks' one agreement:
  // `adopted` (ShareShards), its chunkless entries (ShardSet::
  // CheckChunkless), and the upload pool when `p` has device
  // destinations, which it returns (else null).
  absl::StatusOr<StagingPool*> ReadyToRead(const Prepared& p,
                                           const absl::Status& adopted);
  // Runs `reads` (reads[i] of shard shards[i]) on threads_ threads.
  absl::Status RunReads(ReadExecutor* run, const std::vector<BlockRead>& reads,
                        const std::vector<uint32_t>& shards);
  // The bytes exchanged with AllToAll, in rounds of at most
  // LoadOptions::exchange_bytes_per_round (and device memory through
  // device_exchange.h where the communicator can). pool: ReadyToRead's.
  absl::StatusOr<LoadReport> RunExchange(const Prepared& p,
                                         const RequestGroups& groups,
                                         const CoopPlan& plan,
                                         const LoadOptions& options,
                                         StagingPool* pool, LoadReport report);

  // With a communicator that SharesAddressSpace (direct_delivery.cc):
  // every rank's destinations as one list, or nullopt on every rank if
  // some rank has a destination that is not host memory. Collective (one
  // AllGather).
  absl::StatusOr<std::optional<AllDestinations>> ShareDestinations(
      const Prepared& p);
  // The load without exchange: each rank runs its reads of `plan` with the
  // copies going straight to `all`'s destinations, then the ranks agree,
  // and each calls its own requests' on_complete.
  absl::StatusOr<LoadReport> RunDirect(const Prepared& p,
                                       const AllDestinations& all,
                                       const RequestGroups& groups,
                                       const CoopPlan& plan, LoadReport report);

  // Fills the figures of `report` that every cooperative load reports
  // alike once its bytes are delivered: bytes loaded (of `p`), bytes read
  // and blocks verified (by `run`), and sorts the entry lists.
  static void FinishReport(const Prepared& p, const ReadExecutor& run,
                           LoadReport* report);

  const Source src_;
  const int threads_;
};

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_LOAD_COOP_COOPERATIVE_LOAD_H_

// Internal to ckpt (not part of the installed API): the plan of a
// cooperative load, in which the ranks of a job read every needed stored
// block once between them and exchange the bytes (Reader::Load with
// ReaderOptions::communicator). Pure functions of the manifest, the block
// tables and every rank's requests: no I/O, no communication, no threads,
// deterministic, so that every rank computes the same plan from the same
// inputs and the plan can be tested (and timed at 16,384 ranks, by
// ckpt-bench-plan --load) on its own.
//
// Stages, as for a single rank (read_plan.h):
//  1. GroupRequests: every rank's encoded requests, with identical
//     (entry, region) pairs merged into one unique request that lists its
//     holders (rank, local index): data-parallel replicas that all want the
//     same pieces plan once per piece, not once per rank.
//  2. PairRequests (read_plan.h) on the unique requests.
//  3. PlanCooperativeReads: PlanBlockReads over the unique requests (each
//     needed block read once per job), each read assigned to one rank and
//     one exchange round.
#ifndef CKPT_LIBCKPT_LOAD_COOP_COOP_PLAN_H_
#define CKPT_LIBCKPT_LOAD_COOP_COOP_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/format/records.h"
#include "read/read_plan.h"

namespace ckpt::internal {

// One rank's node name (Communicator::NodeName) and requests as exchanged
// between ranks: [varint length][node name][varint count] then per request
// [varint entry][region] (a region: u8 0 = box, varint rank, offsets,
// sizes; u8 1 = flat range, varint offset, count).
std::string EncodeRankRequests(absl::string_view node_name,
                               const std::vector<PlanRequest>& requests);

// A request's holder: local request `index` of rank `rank`.
struct Holder {
  uint32_t rank = 0;
  uint32_t index = 0;
};

// The distinct requests of all ranks and who holds each, in CSR form:
// the holders of unique request u are holders[first[u] .. first[u + 1]),
// by rank then index. Unique requests are numbered in order of first
// appearance (rank 0's first, ...).
// node[r] is the node of rank r: ranks that sent the same non-empty node
// name share one, a rank that sent "" is a node of its own; nodes are
// numbered 0 .. nodes - 1 in order of first appearance. named_nodes: the
// distinct non-empty names (two or more: ranks on different machines).
struct RequestGroups {
  std::vector<PlanRequest> unique;
  std::vector<uint64_t> first;  // unique.size() + 1 offsets
  std::vector<Holder> holders;
  uint32_t ranks = 0;
  std::vector<uint32_t> node;  // [rank]
  uint32_t nodes = 0;
  uint32_t named_nodes = 0;
};

// Decodes every rank's EncodeRankRequests bytes (encoded[r] of rank r) and
// merges identical requests. Internal naming the rank for bytes that do
// not decode; InvalidArgument "rank R: request I: entry E is not in the
// manifest (N entries)" or its region's ValidateRegion error for a request
// that does not fit `manifest`.
absl::StatusOr<RequestGroups> GroupRequests(
    const format::Manifest& manifest, const std::vector<std::string>& encoded);

// One read of the cooperative plan: `read` (its copies' Copy::request are
// unique request indexes) of shard `shard`, done by rank `reader` in
// exchange round `round`.
struct CoopRead {
  uint32_t shard = 0;
  uint32_t reader = 0;
  uint32_t round = 0;
  BlockRead read;
};

// CoopOptions::min_read_bytes of loads from an object store (issue 26: no
// request under 1 MiB but the last piece of an object).
inline constexpr uint64_t kObjectStoreMinReadBytes = uint64_t{1} << 20;

struct CoopOptions {
  // Reads are cut to at most this many bytes (whole blocks), and smaller
  // (down to min_read_bytes, and at least one block) when the job's needed
  // bytes would otherwise make too few reads to spread evenly over the
  // ranks.
  uint64_t max_read_bytes = 8ull << 20;
  // The floor of that cut: each read is a request to the storage, and on
  // an object store a request costs about as much as a megabyte
  // (kObjectStoreMinReadBytes). 0: down to one block.
  uint64_t min_read_bytes = 0;
  // A rank sends at most this many bytes and receives at most this many in
  // one round (a read larger than that goes alone into a round).
  uint64_t round_bytes = 16ull << 20;  // LoadOptions::exchange_bytes_per_round
};

struct CoopPlan {
  std::vector<CoopRead> reads;       // by shard, then file offset
  uint32_t rounds = 0;               // exchange rounds (0: nothing to read)
  std::vector<uint64_t> bytes_read;  // stored bytes each rank reads
  uint64_t stored_bytes = 0;         // sum of bytes_read
};

// The stored bytes each node (RequestGroups::node) reads in `plan`.
std::vector<uint64_t> BytesReadPerNode(const RequestGroups& groups,
                                       const CoopPlan& plan);

// Every block that `pieces` (PairRequests on groups.unique) need is read
// once, by one rank, spread evenly over nodes and then over the ranks of
// each node (groups.node; with no node names every rank is a node and the
// two levels are one):
//  1. a read that one rank alone needs (all its deliveries are to that
//     rank: a resharded load's blocks but those its new boundaries cut) is
//     that rank's, so that its bytes go straight to their destinations and
//     never through the communicator; the other reads are taken largest
//     first, each by a holder of one of its requests: one on the node that
//     reads the fewest bytes so far, and there the rank with the fewest;
//  2. a node that reads more than the mean over nodes plus the largest
//     read gives reads (its smallest first, reads that several ranks need
//     before those of one rank) to the least loaded node, to its least
//     loaded rank, while that lowers its load (so that all nodes read when
//     few need the data);
//  3. within each node, a rank that reads more than the node's mean gives
//     reads that several ranks need to the node's least loaded rank alike
//     (moving bytes between ranks of one node costs no node more reading or
//     network traffic), and one that still reads more than that mean plus
//     the largest read gives reads that it alone needs.
// So a rank reads what it alone needs itself unless the ranks' needs are
// that unbalanced (e.g. one rank needs everything, the others nothing).
// A rank's reads are then put into rounds in plan order so that each round
// respects options.round_bytes on both sides. REQUIRES: as PlanBlockReads.
CoopPlan PlanCooperativeReads(const format::Manifest& manifest,
                              const RequestGroups& groups,
                              const std::vector<ChunkPiece>& pieces,
                              const BlockTableLookup& lookup,
                              const CoopOptions& options);

// Calls fn(holder, copy) for each delivery of `read`: every copy of the
// read with every holder of its unique request, in the order both the
// sending and the receiving rank use to lay out and take apart the bytes
// exchanged (copies in order, holders in order).
template <typename Fn>
void ForEachDelivery(const RequestGroups& groups, const BlockRead& read,
                     Fn&& fn) {
  for (const Copy& c : read.copies) {
    for (uint64_t h = groups.first[c.request]; h < groups.first[c.request + 1];
         ++h) {
      fn(groups.holders[h], c);
    }
  }
}

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_LOAD_COOP_COOP_PLAN_H_

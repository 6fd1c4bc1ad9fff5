// Cooperative loads of ranks that share one address space
// (Communicator::SharesAddressSpace): the plan is that of
// cooperative_load.cc, but
// each reading rank writes the verified bytes of its reads straight into
// the destinations of every rank that needs them (read directly into a
// destination when all its bytes go to one, else read once, verified, and
// copied once per destination) instead of copying them into send buffers,
// through AllToAll and out of receive buffers. No rounds: one agreement
// after all reads, then each rank calls its own on_complete callbacks.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/status_macros.h"
#include "load/coop/cooperative_load.h"
#include "util/parallel_for.h"

namespace ckpt::internal {
namespace {

uint64_t RequestBytes(const LoadRequest& r) {
  return RegionElements(r.region) * DTypeSize(r.dtype);
}

// [u64 address][u64 bytes][u8 0 = host, 1 = other] per request.
std::string EncodeDestinations(const Prepared& p) {
  std::string out;
  for (const LoadRequest& r : p.reqs) {
    format::PutFixed64(&out, reinterpret_cast<uintptr_t>(r.data));
    format::PutFixed64(&out, RequestBytes(r));
    out.push_back(r.memory == MemoryKind::kHost ? 0 : 1);
  }
  return out;
}

// Adds rank `rank`'s destinations (EncodeDestinations) to `out`; false if
// one is not host memory.
absl::StatusOr<bool> DecodeDestinations(absl::string_view bytes, size_t rank,
                                        AllDestinations* out) {
  format::ByteReader r(bytes);
  while (!r.empty()) {
    LoadRequest d;
    CKPT_ASSIGN_OR_RETURN(uint64_t address, r.Read64("address"));
    CKPT_ASSIGN_OR_RETURN(uint64_t size, r.Read64("size"));
    CKPT_ASSIGN_OR_RETURN(uint8_t memory, r.Read8("memory"));
    if (memory != 0) return false;
    d.name = absl::StrCat("(request ", out->all.reqs.size() - out->first[rank],
                          " of rank ", rank, ")");
    d.dtype = DType::kUInt8;
    d.region = FlatRange{0, size};
    d.data = reinterpret_cast<void*>(static_cast<uintptr_t>(address));
    out->all.reqs.push_back(std::move(d));
  }
  return true;
}

// This rank's reads of `plan`, their copies going to every holder's
// destination in `all`; and the shard of each.
std::vector<BlockRead> DirectReads(const RequestGroups& g, const CoopPlan& plan,
                                   const AllDestinations& all, uint32_t me,
                                   std::vector<uint32_t>* shards) {
  std::vector<BlockRead> reads;
  for (const CoopRead& cr : plan.reads) {
    if (cr.reader != me) continue;
    BlockRead r = cr.read;
    r.copies.clear();
    ForEachDelivery(g, cr.read, [&](const Holder& h, const Copy& c) {
      r.copies.emplace_back(c).request = all.first[h.rank] + h.index;
    });
    reads.push_back(std::move(r));
    shards->push_back(cr.shard);
  }
  return reads;
}

// The completion accounting of this rank's requests once every rank's
// reads succeeded: the bytes the plan delivers to each must be all of it
// (InternalError naming the first that is short). Adds the bytes other
// ranks wrote to `received`.
absl::Status CheckDelivered(const RequestGroups& g, const CoopPlan& plan,
                            const Prepared& p, uint32_t me,
                            uint64_t* received) {
  std::vector<uint64_t> delivered(p.reqs.size(), 0);
  for (const CoopRead& cr : plan.reads) {
    ForEachDelivery(g, cr.read, [&](const Holder& h, const Copy& c) {
      if (h.rank != me) return;
      delivered[h.index] += c.bytes();
      if (cr.reader != me) *received += c.bytes();
    });
  }
  for (size_t i = 0; i < p.reqs.size(); ++i) {
    const uint64_t want = RequestBytes(p.reqs[i]);
    if (delivered[i] != want) {
      return absl::InternalError(absl::StrCat("entry '", p.reqs[i].name,
                                              "': ", want - delivered[i],
                                              " bytes were not loaded"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<AllDestinations>>
CooperativeLoad::ShareDestinations(const Prepared& p) {
  Communicator* comm = src_.comm;
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> encoded,
                        comm->AllGather(EncodeDestinations(p)));
  // Every rank decodes the same bytes: the same outcome on every rank.
  AllDestinations out;
  bool host = true;
  for (size_t r = 0; r < encoded.size() && host; ++r) {
    out.first.push_back(static_cast<uint32_t>(out.all.reqs.size()));
    auto decoded = DecodeDestinations(encoded[r], r, &out);
    if (!decoded.ok()) {
      return absl::InternalError(
          absl::StrCat("the destinations sent by rank ", r,
                       " do not decode: ", decoded.status().message()));
    }
    host = *decoded;
  }
  if (!host) return std::nullopt;
  out.first.push_back(static_cast<uint32_t>(out.all.reqs.size()));
  return out;
}

absl::StatusOr<LoadReport> CooperativeLoad::RunDirect(
    const Prepared& p, const AllDestinations& all, const RequestGroups& groups,
    const CoopPlan& plan, LoadReport report) {
  Communicator* comm = src_.comm;
  const uint32_t me = comm->rank();
  for (const LoadRequest& r : p.reqs) {  // as ReadExecutor::CompleteEmpty
    if (RequestBytes(r) == 0 && r.on_complete) r.on_complete();
  }
  ReadExecutor run(all.all, src_.device_memory, nullptr, nullptr, threads_);
  std::vector<uint32_t> shards;
  const std::vector<BlockRead> reads =
      DirectReads(groups, plan, all, me, &shards);
  absl::Status pending = RunReads(&run, reads, shards);
  if (pending.ok()) {
    pending = CheckDelivered(groups, plan, p, me, &report.bytes_received);
  }
  // After this, every rank's reads are done: this rank's destinations are
  // complete and verified.
  CKPT_RETURN_IF_ERROR(Agree(pending));
  for (const LoadRequest& r : p.reqs) {
    if (RequestBytes(r) != 0 && r.on_complete) r.on_complete();
  }
  FinishReport(p, run, &report);
  return report;
}

}  // namespace ckpt::internal

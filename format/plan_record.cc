#include "ckpt/format/plan_record.h"

#include "absl/strings/str_cat.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::format {

std::string EncodePlanRecord(const PlanRecord& plan) {
  std::string out;
  PutVarint(&out, kPlanRecordVersion);
  PutVarint(&out, plan.ranks.size());
  for (const PlanRecord::Rank& r : plan.ranks) {
    out.append(reinterpret_cast<const char*>(r.fingerprint.data()),
               r.fingerprint.size());
    PutVarint(&out, r.writes.size());
    // Delta-coded: the first position, then each gap (>= 1) minus one.
    uint64_t prev = 0;
    for (size_t i = 0; i < r.writes.size(); ++i) {
      PutVarint(&out, i == 0 ? r.writes[0] : r.writes[i] - prev - 1);
      prev = r.writes[i];
    }
  }
  return out;
}

absl::StatusOr<PlanRecord> DecodePlanRecord(absl::string_view body) {
  ByteReader r(body);
  CKPT_ASSIGN_OR_RETURN(uint64_t version, r.ReadVarint("PLAN version"));
  if (version != kPlanRecordVersion) {
    return absl::DataLossError(absl::StrCat("PLAN: version ", version,
                                            ", expected ", kPlanRecordVersion));
  }
  CKPT_ASSIGN_OR_RETURN(uint64_t world,
                        r.ReadVarintAtMost("PLAN world_size", kMaxShards));
  if (world == 0) return absl::DataLossError("PLAN: world_size 0");
  PlanRecord plan;
  // Each rank takes at least 17 bytes: never allocate past the input.
  if (world > r.remaining() / 17) {
    return absl::DataLossError(
        absl::StrCat("PLAN: world_size ", world, " needs at least ", world * 17,
                     " bytes, ", r.remaining(), " left"));
  }
  plan.ranks.resize(world);
  for (uint64_t k = 0; k < world; ++k) {
    PlanRecord::Rank& rank = plan.ranks[k];
    CKPT_ASSIGN_OR_RETURN(absl::string_view fp,
                          r.ReadBytes("PLAN fingerprint", 16));
    std::copy(fp.begin(), fp.end(), rank.fingerprint.begin());
    CKPT_ASSIGN_OR_RETURN(
        uint64_t n, r.ReadVarintAtMost("PLAN write count",
                                       std::min(kMaxEntries, r.remaining())));
    rank.writes.resize(n);
    uint64_t prev = 0;
    for (uint64_t i = 0; i < n; ++i) {
      CKPT_ASSIGN_OR_RETURN(uint64_t v,
                            r.ReadVarintAtMost("PLAN position", UINT32_MAX));
      uint64_t pos = i == 0 ? v : prev + 1 + v;
      if (pos > UINT32_MAX) {
        return absl::DataLossError(absl::StrCat("PLAN: rank ", k, ": position ",
                                                pos, " exceeds 2^32-1"));
      }
      rank.writes[i] = static_cast<uint32_t>(pos);
      prev = pos;
    }
  }
  if (!r.empty()) {
    return absl::DataLossError(absl::StrCat(
        "PLAN: ", r.remaining(), " trailing bytes at offset ", r.offset()));
  }
  return plan;
}

}  // namespace ckpt::format

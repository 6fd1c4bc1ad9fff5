// The body of the manifest's optional PLAN section (spec/FORMAT.md §7.4):
// the save plan a writer used, recorded so that a restarted job with the
// same structure can reuse it on its first save instead of replanning.
//
// It is a cache, never a source of data: a reader of tensors ignores it, and
// a writer uses it only when every rank's structure fingerprint equals the
// one recorded for that rank and its coordinator finds that it writes every
// registered piece exactly once (libckpt/save/save_plan.h's PlanOnCoordinator).
#ifndef CKPT_FORMAT_PLAN_RECORD_H_
#define CKPT_FORMAT_PLAN_RECORD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/format/records.h"

namespace ckpt::format {

inline constexpr uint64_t kPlanRecordVersion = 1;

struct PlanRecord {
  // One per rank, in rank order (so size() is the world size).
  struct Rank {
    Fingerprint fingerprint{};  // that rank's local structure (opaque)
    // Positions, in that rank's registration order, of the pieces it
    // writes; strictly increasing.
    std::vector<uint32_t> writes;
    friend bool operator==(const Rank& a, const Rank& b) {
      return a.fingerprint == b.fingerprint && a.writes == b.writes;
    }
  };
  std::vector<Rank> ranks;
  friend bool operator==(const PlanRecord& a, const PlanRecord& b) {
    return a.ranks == b.ranks;
  }
};

// REQUIRES: 1 <= ranks.size() <= kMaxShards; each writes list strictly
// increasing.
std::string EncodePlanRecord(const PlanRecord& plan);

// DataLoss for truncation, trailing bytes, a version other than 1, a world
// size of 0 or above 2^20, a write list that is not strictly increasing or
// longer than kMaxEntries. The caller checks the world size against the
// checkpoint's and the positions against its own registrations.
absl::StatusOr<PlanRecord> DecodePlanRecord(absl::string_view body);

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_PLAN_RECORD_H_

// Fuzzes DecodePlanRecord (format/plan_record.h), the body of the manifest's
// PLAN section (spec/FORMAT.md §7.4).
//
// Whenever a decode succeeds, the record must keep what the header promises
// (1 <= world size <= kMaxShards; each rank's write positions strictly
// increasing) and survive EncodePlanRecord -> DecodePlanRecord unchanged,
// encoding to the same bytes again. (The input itself need not be the
// canonical encoding: a varint may be written with redundant bytes.)
#include <cstddef>
#include <cstdint>
#include <string>

#include "ckpt/format/format_constants.h"
#include "ckpt/format/plan_record.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt::format;
  absl::StatusOr<PlanRecord> plan =
      DecodePlanRecord(ckpt::fuzz::AsView(data, size));
  if (!plan.ok()) return 0;
  FUZZ_CHECK(!plan->ranks.empty());
  FUZZ_CHECK(plan->ranks.size() <= kMaxShards);
  for (const PlanRecord::Rank& r : plan->ranks) {
    for (size_t i = 1; i < r.writes.size(); ++i) {
      FUZZ_CHECK(r.writes[i - 1] < r.writes[i]);
    }
  }
  std::string re = EncodePlanRecord(*plan);
  absl::StatusOr<PlanRecord> back = DecodePlanRecord(re);
  if (!back.ok()) {
    std::fprintf(stderr, "re-encoded plan rejected: %s\n",
                 std::string(back.status().message()).c_str());
  }
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(*back == *plan);
  FUZZ_CHECK(EncodePlanRecord(*back) == re);
  return 0;
}

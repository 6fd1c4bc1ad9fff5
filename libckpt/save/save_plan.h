// save/: ckpt::Writer, from the registrations of every rank to a committed
// checkpoint (plan, write, commit; synchronous and asynchronous). This
// header: the save planner. Every rank describes what it holds (a
// LocalPlan); the coordinator checks the union, de-duplicates replicas and
// assigns every unique chunk to one holder, balancing bytes across ranks.
// The coordinator decodes the ranks' plans straight into a columnar
// PlanTable (plan_table.h) and plans from it without per-item allocations:
// a 16,384-rank x 1,000-tensor job plans in about 2 s of one core and
// 0.9 GiB, the gathered messages included (ckpt-bench-plan
// --synthetic-ranks 16384 --tensors 1000).
#ifndef CKPT_LIBCKPT_SAVE_SAVE_PLAN_H_
#define CKPT_LIBCKPT_SAVE_SAVE_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/plan_record.h"
#include "ckpt/format/records.h"
#include "ckpt/types.h"
#include "save/plan_table.h"

namespace ckpt::internal {

// One registered piece on one rank. Objects have shape {size}, dtype uint8,
// region FlatRange{0, size}.
struct LocalItem {
  std::string name;
  format::EntryKind kind = format::EntryKind::kTensor;
  DType dtype = DType::kFloat32;
  Shape shape;
  Region region;
  bool replica = false;
  bool partial = false;
};

using LocalPlan = std::vector<LocalItem>;

std::string EncodeLocalPlan(const LocalPlan& plan);
absl::StatusOr<LocalPlan> DecodeLocalPlan(absl::string_view bytes);

// The checks of a tensor's registration that every writer makes (Writer,
// batch save): a valid entry name, shape and region, and data unless the
// region is empty. InvalidArgument naming the entry.
absl::Status CheckTensorArguments(const std::string& name, DType dtype,
                                  const Shape& shape, const Region& local,
                                  const void* data);

// The structure fingerprint of a local plan is CombineFingerprints(n, i ->
// ItemFingerprint(plan[i])): names, kinds, dtypes, shapes, regions, replica
// and partial flags; not values. Object sizes are excluded (they change
// from save to save without changing the plan). A writer fingerprints each
// item once, when it is registered.
format::Fingerprint ItemFingerprint(const LocalItem& item);
format::Fingerprint CombineFingerprints(
    size_t n, absl::FunctionRef<const format::Fingerprint&(size_t)> item);

struct GlobalPlan {
  // writes[r] = indices into rank r's LocalPlan of the items rank r writes.
  std::vector<std::vector<uint32_t>> writes;
  uint64_t unique_bytes = 0;
};

// Checks the union of all ranks' plans (rank r = ranks.rank(r)) and assigns
// writers. Chunks of a tensor are ordered by region (offsets, then sizes),
// names by bytes, so the plan depends only on the ranks' items. Objects are
// planned with their size as it is now (sizes are not in the fingerprint,
// but an object is always written by the one rank that holds it).
// InvalidArgument naming the entry and the ranks for: dtype, shape, kind or
// partial flag disagreeing between ranks; two ranks holding an object of
// one name; overlapping non-replica chunks; a tensor not covered.
absl::StatusOr<GlobalPlan> PlanSave(const PlanTable& ranks);
// PlanSave (its checks and errors), but keeping the writers of `recorded`
// (a plan recorded earlier, from a file) where they are a plan of these
// registrations: one rank per rank of the table, and every chunk written
// by exactly one of its holders, nothing else. Otherwise assigns writers
// as PlanSave does. *reused says which. A plan never decides what is
// saved: a record with a piece removed, or written twice, is not reused.
absl::StatusOr<GlobalPlan> PlanSave(const PlanTable& ranks,
                                    const format::PlanRecord& recorded,
                                    bool* reused);
// The same over plans not yet in a table (tests, small worlds).
absl::StatusOr<GlobalPlan> PlanSave(const std::vector<LocalPlan>& ranks);

// The structure fingerprint of a whole job (CHECKPOINT_INFO's): a hash of
// the ranks' fingerprints in rank order.
format::Fingerprint GlobalFingerprint(const format::PlanRecord& record);

// What the coordinator's planning decided: the encoded PlanRecord
// (ckpt/format/plan_record.h) that every rank adopts, with each rank's
// fingerprint, and whether it is the recorded plan it was offered.
struct CoordinatorPlan {
  std::string body;
  bool reused = false;
};

// The coordinator's half of planning a save: decodes every rank's
// RankPlan message (save_messages.h), in rank order, straight into one
// PlanTable, releasing each message once decoded, and plans (PlanSave).
// `recorded` (empty: none) is the body of a PLAN section from the root's latest
// checkpoint: it is reused when it decodes, records every rank's current
// fingerprint and passes PlanSave's check of its writers. Internal for a
// malformed message, else PlanSave's errors; a recorded plan that does not
// fit is never an error.
absl::StatusOr<CoordinatorPlan> PlanOnCoordinator(
    std::vector<std::string> rank_plans, absl::string_view recorded = {});

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_SAVE_SAVE_PLAN_H_

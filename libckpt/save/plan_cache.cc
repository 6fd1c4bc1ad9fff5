#include "save/plan_cache.h"

#include <utility>

#include "ckpt/format/format_constants.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/status_macros.h"
#include "save/save_messages.h"
#include "save/save_plan.h"
#include "storage/checkpoint_dir.h"
#include "util/rank_status.h"

namespace ckpt::internal {

format::Fingerprint LocalFingerprint(const std::vector<Registration>& items) {
  return CombineFingerprints(
      items.size(),
      [&](size_t i) -> const format::Fingerprint& { return items[i].fp; });
}

std::string RecordedPlan(Storage* storage, const std::string& root) {
  auto dir = ResolveCheckpointDir(storage, root);
  if (!dir.ok()) return "";
  auto bytes = storage->ReadFile(JoinPath(*dir, format::kManifestFileName));
  if (!bytes.ok()) return "";
  auto m = format::DecodeManifest(*bytes);
  return m.ok() ? std::move(m->plan) : "";
}

bool PlanCache::AdoptRecord(int rank, int world,
                            const format::PlanRecord& record,
                            absl::string_view body,
                            const format::Fingerprint& local_fp, size_t items) {
  if (static_cast<int>(record.ranks.size()) != world) return false;
  const auto& mine = record.ranks[rank];
  if (mine.fingerprint != local_fp) return false;
  // The fingerprint covers the item count, but a cache is never trusted
  // further than it can be checked.
  for (uint32_t i : mine.writes) {
    if (i >= items) return false;
  }
  valid_ = true;
  world_ = world;
  local_fp_ = local_fp;
  writes_ = mine.writes;
  if (rank == 0) {
    global_fp_ = GlobalFingerprint(record);
    plan_section_ = std::string(body);
  }
  return true;
}

absl::StatusOr<bool> PlanCache::CachedPlanFits(Communicator* comm,
                                               const format::Fingerprint& fp,
                                               bool* some_rank_has_none) const {
  const int world = comm->size();
  std::vector<int64_t> flags = {
      (valid_ && world_ == world && local_fp_ == fp) ? 0 : 1, valid_ ? 0 : 1};
  CKPT_RETURN_IF_ERROR(comm->AllReduceMax(&flags));
  *some_rank_has_none = flags[1] != 0;
  return flags[0] == 0;
}

absl::StatusOr<bool> PlanCache::Replan(Communicator* comm,
                                       const std::vector<Registration>& items,
                                       absl::string_view recorded) {
  valid_ = false;
  RankPlan mine;
  mine.fingerprint = LocalFingerprint(items);
  mine.plan.reserve(items.size());
  for (const Registration& r : items) mine.plan.push_back(r.item);
  // Only the coordinator needs them (empty elsewhere).
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> plans,
                        comm->Gather(EncodeRankPlan(mine), 0));
  CKPT_ASSIGN_OR_RETURN(
      std::string msg, OnRankZero(comm, [&]() -> absl::StatusOr<std::string> {
        CKPT_ASSIGN_OR_RETURN(CoordinatorPlan planned,
                              PlanOnCoordinator(std::move(plans), recorded));
        return EncodeCoordinatorPlan(planned);
      }));
  CKPT_ASSIGN_OR_RETURN(CoordinatorPlan planned, DecodeCoordinatorPlan(msg));
  CKPT_ASSIGN_OR_RETURN(format::PlanRecord record,
                        format::DecodePlanRecord(planned.body));
  if (!AdoptRecord(comm->rank(), comm->size(), record, planned.body,
                   mine.fingerprint, items.size())) {
    return absl::InternalError(
        "the coordinator's plan does not fit this rank's registrations");
  }
  return planned.reused;
}

absl::StatusOr<bool> PlanCache::Plan(Communicator* comm, Storage* storage,
                                     const std::string& root,
                                     const SaveOptions& options,
                                     const std::vector<Registration>& items) {
  // One small collective decides whether every rank's structure is what
  // the cached plan was made for; only then is it reused.
  bool some_rank_has_none = false;
  CKPT_ASSIGN_OR_RETURN(bool hit, CachedPlanFits(comm, LocalFingerprint(items),
                                                 &some_rank_has_none));
  if (hit) return true;
  // A restarted job: the root's latest checkpoint may record a plan. It
  // came from a file, so it only offers writers: the coordinator checks it
  // against every rank's registrations as it plans (the collectives of a
  // miss), since a plan must never decide what is saved.
  std::string recorded;
  if (some_rank_has_none && options.reuse_recorded_plan && comm->rank() == 0) {
    recorded = RecordedPlan(storage, root);
  }
  return Replan(comm, items, recorded);
}

}  // namespace ckpt::internal

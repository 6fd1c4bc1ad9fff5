// The plan of a Writer's last save, kept while every rank's registrations
// keep their structure, and the plan phase of a save, which reuses it,
// adopts the plan recorded in the root's latest checkpoint, or makes a new
// one (spec/FORMAT.md §7.4, PLAN).
#ifndef CKPT_LIBCKPT_SAVE_PLAN_CACHE_H_
#define CKPT_LIBCKPT_SAVE_PLAN_CACHE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/communicator.h"
#include "ckpt/format/plan_record.h"
#include "ckpt/format/records.h"
#include "ckpt/storage.h"
#include "ckpt/writer.h"
#include "save/registration.h"

namespace ckpt::internal {

// Not thread-safe (a Writer plans from one thread per rank).
class PlanCache {
 public:
  // The plan phase of a save, collective over `comm`: reuses the cached
  // plan if every rank's structure (`items`) still fits it, else replans,
  // keeping the writers of the plan recorded in `root`'s latest checkpoint
  // where the coordinator finds they fit (options.reuse_recorded_plan).
  // Returns whether a cached or recorded plan was reused; on success the
  // cache is valid for `items`.
  absl::StatusOr<bool> Plan(Communicator* comm, Storage* storage,
                            const std::string& root, const SaveOptions& options,
                            const std::vector<Registration>& items);

  // The positions in the registrations that this rank writes.
  // REQUIRES: Plan succeeded since the registrations last changed.
  const std::vector<uint32_t>& writes() const { return writes_; }
  // Coordinator (rank 0) only: what the manifest records.
  const format::Fingerprint& global_fp() const { return global_fp_; }
  const std::string& plan_section() const { return plan_section_; }

 private:
  // Agrees across ranks (one small collective) whether the plan in memory
  // fits every rank's structure (`fp`); *some_rank_has_none says whether a
  // rank has no plan in memory (the first save of a restarted job).
  absl::StatusOr<bool> CachedPlanFits(Communicator* comm,
                                      const format::Fingerprint& fp,
                                      bool* some_rank_has_none) const;
  // Full planning: gathers every local plan; the coordinator checks the
  // union and assigns writers, keeping those of `recorded` (a PLAN body,
  // meaningful on the coordinator only; empty: none) where they write
  // every registered piece exactly once. Returns whether `recorded` was
  // reused.
  absl::StatusOr<bool> Replan(Communicator* comm,
                              const std::vector<Registration>& items,
                              absl::string_view recorded);
  // Adopts `record` if it fits this rank (`items` registrations whose
  // fingerprint is `local_fp`); false otherwise.
  bool AdoptRecord(int rank, int world, const format::PlanRecord& record,
                   absl::string_view body, const format::Fingerprint& local_fp,
                   size_t items);

  // Valid for exactly one local structure (local_fp_) on every rank of a
  // world of world_ ranks.
  bool valid_ = false;
  int world_ = 0;
  format::Fingerprint local_fp_{};
  std::vector<uint32_t> writes_;
  format::Fingerprint global_fp_{};
  std::string plan_section_;  // PLAN section body
};

// The fingerprint of a rank's registrations (spec/FORMAT.md §7.4).
format::Fingerprint LocalFingerprint(const std::vector<Registration>& items);

// The PLAN section body of `root`'s latest checkpoint; empty where there is
// none or it cannot be read (a miss, never an error).
std::string RecordedPlan(Storage* storage, const std::string& root);

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_SAVE_PLAN_CACHE_H_

// The messages ranks exchange during a save, encoded and decoded here and
// nowhere else (each wrapped in util/rank_status.h's EncodeStatusOr).
// Messages never reach a disk and are exchanged between processes of one
// job (one library version): a decoder failure means a bug or a torn
// transport, reported as Internal naming the message.
#ifndef CKPT_LIBCKPT_SAVE_SAVE_MESSAGES_H_
#define CKPT_LIBCKPT_SAVE_SAVE_MESSAGES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/format/records.h"
#include "save/save_plan.h"

namespace ckpt::internal {

// Rank -> coordinator when planning: the rank's structure fingerprint and
// its local plan.
struct RankPlan {
  format::Fingerprint fingerprint{};
  LocalPlan plan;
};
std::string EncodeRankPlan(const RankPlan& plan);
absl::StatusOr<RankPlan> DecodeRankPlan(absl::string_view bytes);
// Decodes a RankPlan straight into `table` as its next rank (the
// coordinator's form: no LocalItem is made) and its fingerprint into *fp.
// On error `table` is unchanged.
absl::Status AppendRankPlan(absl::string_view bytes, format::Fingerprint* fp,
                            PlanTable* table);

// Coordinator -> every rank when planning: the plan (save_plan.h).
std::string EncodeCoordinatorPlan(const CoordinatorPlan& plan);
absl::StatusOr<CoordinatorPlan> DecodeCoordinatorPlan(absl::string_view bytes);

// Coordinator -> every rank before the shards are written: what only the
// coordinator decides, so that every shard index carries the manifest's
// CHECKPOINT_INFO (spec/FORMAT.md §7.1), and the temporary directory.
struct SavePrep {
  format::CheckpointId id{};
  format::Fingerprint fingerprint{};
  int64_t created_unix_ns = 0;
  std::string tmp_dir;
};
std::string EncodeSavePrep(const SavePrep& prep);
absl::StatusOr<SavePrep> DecodeSavePrep(absl::string_view bytes);

// Rank -> coordinator after writing its shard file: the file's size and
// the manifest view of its entries (chunk records without block tables).
struct ShardReport {
  uint64_t file_size = 0;
  std::vector<format::EntryRecord> entries;
};
std::string EncodeShardReport(const ShardReport& report);
absl::StatusOr<ShardReport> DecodeShardReport(absl::string_view bytes);

// Coordinator -> every rank after the commit.
struct CommitSummary {
  uint64_t stored_bytes = 0;   // payload bytes of all shards
  uint64_t logical_bytes = 0;  // unique tensor and object bytes
};
std::string EncodeCommitSummary(const CommitSummary& summary);
absl::StatusOr<CommitSummary> DecodeCommitSummary(absl::string_view bytes);

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_SAVE_SAVE_MESSAGES_H_

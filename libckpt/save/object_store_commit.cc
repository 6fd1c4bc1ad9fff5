#include "save/object_store_commit.h"

#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/shard.h"
#include "ckpt/format/status_macros.h"
#include "save/commit.h"

namespace ckpt::internal {
namespace {

constexpr absl::string_view kMarkerPrefix = ".tmp-save.";

std::string SaveTag(const format::CheckpointId& id) {
  return format::IdToHex(id).substr(0, 16);
}

std::string MarkerPath(const std::string& root,
                       const format::CheckpointInfo& info) {
  return JoinPath(root,
                  SaveMarkerName({SaveTag(info.id), info.step, info.world_size,
                                  info.created_unix_ns / 1000000000}));
}

// The shard file names `dir`'s MANIFEST lists; NotFound when it has none.
absl::StatusOr<std::set<std::string>> NamedShards(Storage* storage,
                                                  const std::string& dir,
                                                  format::CheckpointId* id) {
  CKPT_ASSIGN_OR_RETURN(format::Manifest m, ReadManifest(storage, dir));
  std::set<std::string> names;
  for (const format::ShardInfo& s : m.shards) names.insert(s.file_name);
  if (id != nullptr) *id = m.info.id;
  return names;
}

// Removes the shard files of the save `tag` (ranks < world) under `dir`
// that `keep` does not name. NotFound (already gone) is fine.
absl::Status RemoveShardsOf(Storage* storage, const std::string& dir,
                            const std::string& tag, uint32_t world,
                            const std::set<std::string>& keep) {
  absl::Status first;
  for (uint32_t r = 0; r < world; ++r) {
    const std::string name = absl::StrCat(
        absl::StripSuffix(format::ShardFileName(r), format::kShardFileSuffix),
        ".", tag, format::kShardFileSuffix);
    if (keep.count(name) != 0) continue;
    absl::Status s = storage->RemoveFile(JoinPath(dir, name));
    if (!s.ok() && !absl::IsNotFound(s) && first.ok()) first = s;
  }
  return first;
}

// §4.3 "Leftovers": removes what the dead saves of `root` left (their
// markers older than the stale age): their own shard files, by name, and
// never a step's prefix as a whole, where a save that began after the
// listing may be writing. Stops at the first error.
absl::Status RemoveDeadSaves(Storage* storage, const std::string& root,
                             const std::string& own_tag) {
  auto names = storage->List(root);
  if (absl::IsNotFound(names.status())) return absl::OkStatus();
  CKPT_RETURN_IF_ERROR(names.status());
  const int64_t now_s = absl::ToUnixSeconds(absl::Now());
  const int64_t stale_s =
      absl::ToInt64Seconds(storage->traits(root).stale_save_age);
  for (const std::string& name : *names) {
    SaveMarker m;
    if (!ParseSaveMarkerName(name, &m) || m.save == own_tag ||
        now_s - m.created_s < stale_s) {
      continue;
    }
    const std::string dir = JoinPath(root, format::StepDirName(m.step));
    // The save may have committed before it died: its shards stay then.
    auto named = NamedShards(storage, dir, nullptr);
    if (!named.ok() && !absl::IsNotFound(named.status())) {
      continue;  // a MANIFEST that cannot be read: leave everything
    }
    CKPT_RETURN_IF_ERROR(
        RemoveShardsOf(storage, dir, m.save, m.world,
                       named.ok() ? *named : std::set<std::string>()));
    absl::Status s = storage->RemoveFile(JoinPath(root, name));
    if (!s.ok() && !absl::IsNotFound(s)) return s;
  }
  return absl::OkStatus();
}

// UpdateLatest (commit.h) without a rename: one ReplaceFile.
absl::Status ReplaceLatest(Storage* storage, const std::string& root,
                           const std::string& dir_name, uint64_t step) {
  const std::string latest = JoinPath(root, format::kLatestFileName);
  if (LatestIsNewerThan(storage, root, step)) {
    return absl::OkStatus();  // a newer checkpoint is already latest
  }
  return storage->ReplaceFile(latest, format::EncodeLatest(dir_name));
}

}  // namespace

std::string ShardFileNameFor(const Storage& storage, const std::string& dir,
                             uint32_t rank, const format::CheckpointId& id) {
  std::string name = format::ShardFileName(rank);
  if (storage.traits(dir).atomic_rename) return name;
  return absl::StrCat(absl::StripSuffix(name, format::kShardFileSuffix), ".",
                      SaveTag(id), format::kShardFileSuffix);
}

std::string SaveMarkerName(const SaveMarker& m) {
  return absl::StrCat(kMarkerPrefix, m.save, ".", m.step, ".", m.world, ".",
                      m.created_s);
}

bool ParseSaveMarkerName(absl::string_view name, SaveMarker* m) {
  if (!absl::ConsumePrefix(&name, kMarkerPrefix)) return false;
  std::vector<absl::string_view> f = absl::StrSplit(name, '.');
  if (f.size() != 4 || f[0].size() != 16) return false;
  for (char c : f[0]) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  SaveMarker out;
  out.save = std::string(f[0]);
  if (!absl::SimpleAtoi(f[1], &out.step) ||
      !absl::SimpleAtoi(f[2], &out.world) ||
      !absl::SimpleAtoi(f[3], &out.created_s) ||
      SaveMarkerName(out) != absl::StrCat(kMarkerPrefix, name)) {
    return false;
  }
  *m = std::move(out);
  return true;
}

absl::StatusOr<SavePrep> BeginObjectStoreSave(
    Storage* storage, const std::string& root, uint64_t step, uint32_t world,
    bool overwrite, const format::Fingerprint& fingerprint) {
  SavePrep prep;
  prep.id = RandomId();
  prep.fingerprint = fingerprint;
  prep.created_unix_ns = absl::GetCurrentTimeNanos();
  prep.tmp_dir = JoinPath(root, format::StepDirName(step));
  format::CheckpointInfo info = CheckpointInfoOf(prep, step, world);
  const std::string marker = MarkerPath(root, info);
  CKPT_RETURN_IF_ERROR(storage->CreateExclusive(marker, ""));
  // Best effort: a later save tries again.
  (void)RemoveDeadSaves(storage, root, SaveTag(prep.id));
  if (!overwrite) {
    auto m = storage->Stat(JoinPath(prep.tmp_dir, format::kManifestFileName));
    if (m.ok() || !absl::IsNotFound(m.status())) {
      (void)storage->RemoveFile(marker);
      if (!m.ok()) return m.status();
      return absl::AlreadyExistsError(
          absl::StrCat(prep.tmp_dir, ": a checkpoint of step ", step,
                       " already exists (set overwrite to replace it)"));
    }
  }
  return prep;
}

absl::Status CommitObjectStoreCheckpoint(Storage* storage,
                                         const std::string& root,
                                         const std::string& step_dir,
                                         const format::Manifest& manifest,
                                         bool overwrite, int keep_last) {
  const format::CheckpointInfo& info = manifest.info;
  const absl::Duration stale = storage->traits(root).stale_save_age;
  const absl::Duration age =
      absl::Now() - absl::FromUnixNanos(info.created_unix_ns);
  if (age >= stale / 2) {
    return absl::DeadlineExceededError(absl::StrCat(
        step_dir, ": not committed: the save began ", absl::FormatDuration(age),
        " ago, and a later save may have taken it for dead after ",
        absl::FormatDuration(stale), " (spec/FORMAT.md §4.3)"));
  }
  format::Manifest m = manifest;
  for (format::ShardInfo& s : m.shards) {
    s.file_name = ShardFileNameFor(*storage, step_dir, s.shard_id, info.id);
  }
  const std::string path = JoinPath(step_dir, format::kManifestFileName);
  const std::string bytes = format::EncodeManifest(m);
  if (!overwrite) {
    absl::Status s = storage->CreateExclusive(path, bytes);
    if (absl::IsAlreadyExists(s)) {
      return absl::AlreadyExistsError(absl::StrCat(
          step_dir,
          ": a checkpoint of this step already exists (set overwrite to "
          "replace it)"));
    }
    CKPT_RETURN_IF_ERROR(s);
  } else {
    std::set<std::string> replaced;
    format::CheckpointId old_id{};
    auto named = NamedShards(storage, step_dir, &old_id);
    if (named.ok()) replaced = *std::move(named);
    CKPT_RETURN_IF_ERROR(storage->ReplaceFile(path, bytes));
    // Committed. The replaced checkpoint's shards go; ours stay.
    for (const format::ShardInfo& s : m.shards) replaced.erase(s.file_name);
    for (const std::string& name : replaced) {
      absl::Status s = storage->RemoveFile(JoinPath(step_dir, name));
      if (!s.ok() && !absl::IsNotFound(s)) return s;
    }
  }
  CKPT_RETURN_IF_ERROR(
      ReplaceLatest(storage, root, format::StepDirName(info.step), info.step));
  CKPT_RETURN_IF_ERROR(PruneOld(storage, root, keep_last));
  absl::Status s = storage->RemoveFile(MarkerPath(root, info));
  return absl::IsNotFound(s) ? absl::OkStatus() : s;
}

absl::Status DiscardSave(Storage* storage, const std::string& tmp,
                         const format::CheckpointInfo& info) {
  if (storage->traits(tmp).atomic_rename) return storage->RemoveAll(tmp);
  format::CheckpointId committed{};
  auto named = NamedShards(storage, tmp, &committed);
  std::set<std::string> keep;
  if (named.ok()) {
    if (committed == info.id) keep = *std::move(named);
  } else if (!absl::IsNotFound(named.status())) {
    return named.status();  // unknown: a later save's cleanup decides
  }
  CKPT_RETURN_IF_ERROR(
      RemoveShardsOf(storage, tmp, SaveTag(info.id), info.world_size, keep));
  // The root is the step prefix's parent.
  std::string root = tmp;
  const size_t slash = root.rfind('/');
  root = slash == std::string::npos ? "" : root.substr(0, slash);
  absl::Status s = storage->RemoveFile(MarkerPath(root, info));
  return absl::IsNotFound(s) ? absl::OkStatus() : s;
}

}  // namespace ckpt::internal

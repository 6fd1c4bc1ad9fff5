#include "save/commit.h"

#include <algorithm>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/names.h"
#include "ckpt/format/records.h"
#include "ckpt/format/shard.h"
#include "ckpt/format/status_macros.h"
#include "save/object_store_commit.h"

namespace ckpt::internal {

std::array<uint8_t, 16> RandomId() {
  std::random_device rd;
  std::array<uint8_t, 16> id;
  for (size_t i = 0; i < id.size(); i += 4) {
    uint32_t v = rd();
    for (int k = 0; k < 4; ++k) id[i + k] = static_cast<uint8_t>(v >> (8 * k));
  }
  return id;
}

namespace {

// The directory holding `path`: "a/b" -> "a", "/a" -> "/", "a" -> ".".
std::string ParentDir(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::Status EnsureRoot(Storage* storage, const std::string& root) {
  auto st = storage->Stat(root);
  if (st.ok()) {
    if (!st->is_dir) {
      return absl::InvalidArgumentError(
          absl::StrCat(root, ": exists and is not a directory"));
    }
    return absl::OkStatus();
  }
  if (!absl::IsNotFound(st.status())) return st.status();
  absl::Status s = storage->CreateDir(root);
  if (absl::IsAlreadyExists(s)) return absl::OkStatus();  // a concurrent writer
  CKPT_RETURN_IF_ERROR(s);
  // The new root's entry in its parent must be durable before anything
  // committed inside it can be (spec/FORMAT.md §4.1).
  // F1 of spec/FORMAT.md §4.1.
  return storage->SyncDir(ParentDir(root));
}

absl::StatusOr<std::string> CreateTempDir(Storage* storage,
                                          const std::string& root,
                                          uint64_t step) {
  std::string name =
      absl::StrCat(format::kTempDirPrefix, format::StepDirName(step), "-",
                   format::IdToHex(RandomId()).substr(0, 16));
  std::string path = JoinPath(root, name);
  CKPT_RETURN_IF_ERROR(storage->CreateDir(path));
  return path;
}

absl::Status CommitDir(Storage* storage, const std::string& root,
                       const std::string& tmp, const std::string& final_dir,
                       bool overwrite) {
  std::string aside;
  if (overwrite && storage->Stat(final_dir).ok()) {
    // The old checkpoint keeps existing (under a temporary name) until the
    // new one is in place.
    aside = absl::StrCat(tmp, "-replaced");
    CKPT_RETURN_IF_ERROR(storage->Rename(final_dir, aside));
  }
  absl::Status s = storage->RenameNoReplace(tmp, final_dir);
  if (!s.ok()) {
    if (!aside.empty()) (void)storage->Rename(aside, final_dir);
    if (absl::IsAlreadyExists(s)) {
      return absl::AlreadyExistsError(
          absl::StrCat(final_dir,
                       ": a checkpoint of this step already exists (set "
                       "overwrite to replace it)"));
    }
    return s;
  }
  // F5: the checkpoint is committed.
  CKPT_RETURN_IF_ERROR(storage->SyncDir(root));
  if (!aside.empty()) CKPT_RETURN_IF_ERROR(storage->RemoveAll(aside));
  return absl::OkStatus();
}

bool LatestIsNewerThan(Storage* storage, const std::string& root,
                       uint64_t step) {
  auto current = storage->ReadFile(JoinPath(root, format::kLatestFileName));
  if (!current.ok()) return false;
  auto dir = format::DecodeLatest(*current);
  uint64_t cur_step;
  return dir.ok() && format::ParseStepDirName(*dir, &cur_step) &&
         cur_step > step &&
         storage
             ->Stat(JoinPath(JoinPath(root, *dir), format::kManifestFileName))
             .ok();
}

absl::Status UpdateLatest(Storage* storage, const std::string& root,
                          const std::string& dir_name, uint64_t step) {
  const std::string latest = JoinPath(root, format::kLatestFileName);
  if (LatestIsNewerThan(storage, root, step)) {
    return absl::OkStatus();  // a newer checkpoint is already latest
  }
  std::string tmp =
      JoinPath(root, absl::StrCat(format::kTempDirPrefix, "latest-",
                                  format::IdToHex(RandomId()).substr(0, 16)));
  // F6.
  absl::Status s =
      storage->WriteFileAndSync(tmp, format::EncodeLatest(dir_name));
  if (s.ok()) s = storage->Rename(tmp, latest);
  if (!s.ok()) {
    (void)storage->RemoveFile(tmp);
    return s;
  }
  // F7.
  return storage->SyncDir(root);
}

absl::Status PruneOld(Storage* storage, const std::string& root, int keep) {
  if (keep <= 0) return absl::OkStatus();
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, storage->List(root));
  std::string latest_dir;
  auto current = storage->ReadFile(JoinPath(root, format::kLatestFileName));
  if (current.ok()) {
    auto dir = format::DecodeLatest(*current);
    if (dir.ok()) latest_dir = *dir;
  }
  std::vector<std::pair<uint64_t, std::string>> steps;
  for (const std::string& n : names) {
    uint64_t step;
    if (format::ParseStepDirName(n, &step)) steps.emplace_back(step, n);
  }
  std::sort(steps.begin(), steps.end());
  if (steps.size() <= static_cast<size_t>(keep)) return absl::OkStatus();
  for (size_t i = 0; i + keep < steps.size(); ++i) {
    if (steps[i].second == latest_dir) continue;
    // Remove the manifest first, durably: the directory stops being a
    // committed checkpoint at once, even if the rest of the removal is
    // interrupted, and no power loss can keep the manifest while losing a
    // shard (the disk may persist unsynced unlinks in any order).
    std::string dir = JoinPath(root, steps[i].second);
    // An interrupted earlier removal may have taken the manifest already.
    absl::Status s =
        storage->RemoveFile(JoinPath(dir, format::kManifestFileName));
    if (!s.ok() && !absl::IsNotFound(s)) return s;
    // F8.
    CKPT_RETURN_IF_ERROR(storage->SyncDir(dir));
    CKPT_RETURN_IF_ERROR(storage->RemoveAll(dir));
  }
  // F9.
  return storage->SyncDir(root);
}

format::Manifest AssembleManifest(const format::CheckpointInfo& info,
                                  const format::Metadata& metadata,
                                  std::string plan,
                                  std::vector<ShardReport> reports,
                                  CommitSummary* summary) {
  format::Manifest m;
  m.info = info;
  m.metadata = metadata;
  m.plan = std::move(plan);
  *summary = CommitSummary{};
  std::map<std::string, format::EntryRecord> merged;
  for (size_t r = 0; r < reports.size(); ++r) {
    m.shards.push_back({static_cast<uint32_t>(r), format::ShardFileName(r),
                        reports[r].file_size});
    for (format::EntryRecord& e : reports[r].entries) {
      for (const auto& c : e.chunks) summary->stored_bytes += c.stored_length;
      auto [it, inserted] = merged.try_emplace(e.name, e);
      if (!inserted) {
        for (auto& c : e.chunks) it->second.chunks.push_back(std::move(c));
      }
    }
  }
  for (auto& [name, e] : merged) {
    for (const auto& c : e.chunks) {
      summary->logical_bytes += RegionElements(c.region) * DTypeSize(e.dtype);
    }
    m.entries.push_back(std::move(e));
  }
  return m;
}

absl::Status CommitCheckpoint(Storage* storage, const std::string& root,
                              const std::string& tmp,
                              const format::Manifest& manifest, bool overwrite,
                              int keep_last) {
  if (!storage->traits(root).atomic_rename) {
    return CommitObjectStoreCheckpoint(storage, root, tmp, manifest, overwrite,
                                       keep_last);
  }
  const std::string dir_name = format::StepDirName(manifest.info.step);
  // F3, then F4.
  CKPT_RETURN_IF_ERROR(
      storage->WriteFileAndSync(JoinPath(tmp, format::kManifestFileName),
                                format::EncodeManifest(manifest)));
  CKPT_RETURN_IF_ERROR(storage->SyncDir(tmp));
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<FileLock> commit_lock,
                        LockRootForCommit(storage, root));
  CKPT_RETURN_IF_ERROR(
      CommitDir(storage, root, tmp, JoinPath(root, dir_name), overwrite));
  CKPT_RETURN_IF_ERROR(
      UpdateLatest(storage, root, dir_name, manifest.info.step));
  return PruneOld(storage, root, keep_last);
}

absl::StatusOr<std::unique_ptr<FileLock>> LockRootForSave(
    Storage* storage, const std::string& root,
    std::vector<std::string>* removed) {
  const std::string path = JoinPath(root, kSaveLockName);
  auto lock = storage->Lock(path, LockMode::kExclusive, /*wait=*/false);
  if (absl::IsUnimplemented(lock.status())) return std::unique_ptr<FileLock>();
  if (lock.ok()) {
    // No other save is in progress: every temporary is a crashed save's.
    CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, storage->List(root));
    for (const std::string& n : names) {
      if (n.rfind(format::kTempDirPrefix, 0) != 0) continue;
      CKPT_RETURN_IF_ERROR(storage->RemoveAll(JoinPath(root, n)));
      if (removed) removed->push_back(n);
    }
    CKPT_RETURN_IF_ERROR((*lock)->Downgrade());
    return std::move(*lock);
  }
  if (!absl::IsUnavailable(lock.status())) return lock.status();
  // Another save is in progress (its temporaries are live): share.
  return storage->Lock(path, LockMode::kShared, /*wait=*/true);
}

absl::StatusOr<std::unique_ptr<FileLock>> LockRootForCommit(
    Storage* storage, const std::string& root) {
  auto lock = storage->Lock(JoinPath(root, kCommitLockName),
                            LockMode::kExclusive, true);
  if (absl::IsUnimplemented(lock.status())) return std::unique_ptr<FileLock>();
  return lock;
}

absl::StatusOr<SavePrep> BeginSave(Storage* storage, const std::string& root,
                                   uint64_t step, uint32_t world,
                                   bool overwrite,
                                   const format::Fingerprint& fingerprint,
                                   std::unique_ptr<FileLock>* lock) {
  if (!storage->traits(root).atomic_rename) {
    return BeginObjectStoreSave(storage, root, step, world, overwrite,
                                fingerprint);
  }
  CKPT_RETURN_IF_ERROR(EnsureRoot(storage, root));
  CKPT_ASSIGN_OR_RETURN(*lock, LockRootForSave(storage, root, nullptr));
  const std::string final_dir = JoinPath(root, format::StepDirName(step));
  if (!overwrite && storage->Stat(final_dir).ok()) {
    return absl::AlreadyExistsError(
        absl::StrCat(final_dir, ": a checkpoint of step ", step,
                     " already exists (set overwrite to replace it)"));
  }
  SavePrep prep;
  CKPT_ASSIGN_OR_RETURN(prep.tmp_dir, CreateTempDir(storage, root, step));
  prep.id = RandomId();
  prep.fingerprint = fingerprint;
  prep.created_unix_ns = absl::GetCurrentTimeNanos();
  return prep;
}

format::CheckpointInfo CheckpointInfoOf(const SavePrep& prep, uint64_t step,
                                        uint32_t world) {
  format::CheckpointInfo info;
  info.id = prep.id;
  info.fingerprint = prep.fingerprint;
  info.created_unix_ns = prep.created_unix_ns;
  info.step = step;
  info.world_size = world;
  info.writer = "ckpt " CKPT_VERSION_STRING;
  return info;
}

}  // namespace ckpt::internal

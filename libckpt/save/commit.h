// Internal: directory-level steps of the commit protocol (spec/FORMAT.md
// §4.1). Assumptions, written down: rename(2) of a file or directory within
// one file system is atomic; fsync of a directory makes the entries created,
// renamed or removed in it durable; a crash at any point leaves either the
// old or the new name visible, never a mix. Nothing else is assumed: not
// that unsynced operations reach the disk in order. The fsyncs F1-F9 of
// §4.1 are marked where they are made; reliability_power_loss_test fails
// without any one of them.
#ifndef CKPT_LIBCKPT_SAVE_COMMIT_H_
#define CKPT_LIBCKPT_SAVE_COMMIT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/format/records.h"
#include "ckpt/storage.h"
#include "save/save_messages.h"
#include "storage/checkpoint_dir.h"  // ResolveCheckpointDir

namespace ckpt::internal {

// Creates `root` if it does not exist (its parent must), and then fsyncs
// the parent so that the new root survives a power loss.
absl::Status EnsureRoot(Storage* storage, const std::string& root);

// Creates root/.tmp-step-NNNNNNNN-<random> and returns its path.
absl::StatusOr<std::string> CreateTempDir(Storage* storage,
                                          const std::string& root,
                                          uint64_t step);

// Renames the finished temporary directory to its final name and fsyncs the
// root. With `overwrite`, an existing checkpoint of the same step is first
// moved aside under a temporary name and removed after the commit.
absl::Status CommitDir(Storage* storage, const std::string& root,
                       const std::string& tmp, const std::string& final_dir,
                       bool overwrite);

// Whether root/latest names a committed checkpoint (its MANIFEST exists) of
// a step after `step`; false when latest is missing or does not decode.
bool LatestIsNewerThan(Storage* storage, const std::string& root,
                       uint64_t step);

// Points root/latest at `dir_name` (write temp, fsync, rename, fsync root)
// unless it already points at a checkpoint of a later step.
absl::Status UpdateLatest(Storage* storage, const std::string& root,
                          const std::string& dir_name, uint64_t step);

// Removes all but the newest `keep` committed step directories, never the
// one `latest` names.
absl::Status PruneOld(Storage* storage, const std::string& root, int keep);

// Writers of one root coordinate through two lock files in it (spec §4.1):
//   .ckpt-save.lock    held shared by every save in progress, from before
//                      its temporary directory is created until it returns;
//                      a save that can take it exclusively knows no other
//                      save is in progress and removes leftover temporaries
//                      (.tmp-*) of crashed saves first.
//   .ckpt-commit.lock  held exclusively around rename, `latest` and pruning,
//                      so `latest` never moves back to an older step.
inline constexpr char kSaveLockName[] = ".ckpt-save.lock";
inline constexpr char kCommitLockName[] = ".ckpt-commit.lock";

// Takes the save lock on `root` (cleaning leftovers when alone). Returns
// null where the storage has no locks. `removed` (may be null) receives the
// names of the temporaries removed.
absl::StatusOr<std::unique_ptr<FileLock>> LockRootForSave(
    Storage* storage, const std::string& root,
    std::vector<std::string>* removed);
// The commit lock; null where the storage has no locks.
absl::StatusOr<std::unique_ptr<FileLock>> LockRootForCommit(
    Storage* storage, const std::string& root);

// The coordinator's merge of every rank's shard report (reports[r] from rank
// r, consumed) into the checkpoint's manifest: one ShardInfo per rank,
// entries sorted by name holding the chunks of all ranks in rank order,
// `info`, `metadata` and the PLAN section `plan` as given. `summary`
// receives the payload bytes of all shards and the logical bytes of all
// chunks. Pure: no I/O.
format::Manifest AssembleManifest(const format::CheckpointInfo& info,
                                  const format::Metadata& metadata,
                                  std::string plan,
                                  std::vector<ShardReport> reports,
                                  CommitSummary* summary);

// The single-writer commit of a checkpoint whose shard files are durable in
// `tmp` (each fsynced by its writer), in this order:
//   1. MANIFEST written into `tmp` and fsynced, then `tmp` fsynced (the
//      shard and manifest entries of the directory are durable);
//   2. under the commit lock: `tmp` renamed to root/step-NNNNNNNN, root
//      fsynced (CommitDir);
//   3. `latest` replaced (UpdateLatest) and old steps pruned (PruneOld).
// The checkpoint is committed once step 2's fsync returns. On error `tmp`
// is left for the caller to remove; a checkpoint already renamed stays
// committed. REQUIRES: the caller holds the save lock of `root`. Where
// renames are not atomic, CommitObjectStoreCheckpoint (object_store_commit.h)
// with `tmp` the step's prefix instead.
absl::Status CommitCheckpoint(Storage* storage, const std::string& root,
                              const std::string& tmp,
                              const format::Manifest& manifest, bool overwrite,
                              int keep_last);

// 16 random bytes.
std::array<uint8_t, 16> RandomId();

// The coordinator's first step of a save of `step` into `root` (the Writer
// and the batch save): EnsureRoot; the save lock, into *lock (held until
// the save returns); AlreadyExists "<root>/step-NNNNNNNN: a checkpoint of
// step S already exists (set overwrite to replace it)" unless `overwrite`;
// CreateTempDir. Returns the temporary directory, a new checkpoint id,
// `fingerprint` and the creation time. Where renames are not atomic, a save
// of `world` ranks by BeginObjectStoreSave (object_store_commit.h) instead.
absl::StatusOr<SavePrep> BeginSave(Storage* storage, const std::string& root,
                                   uint64_t step, uint32_t world,
                                   bool overwrite,
                                   const format::Fingerprint& fingerprint,
                                   std::unique_ptr<FileLock>* lock);

// The CHECKPOINT_INFO of the save `prep` began: its id, fingerprint and
// creation time, `step`, `world` ranks, this library as the writer.
format::CheckpointInfo CheckpointInfoOf(const SavePrep& prep, uint64_t step,
                                        uint32_t world);

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_SAVE_COMMIT_H_

// Internal: the commit protocol on storages without atomic rename (object
// stores: spec/FORMAT.md §4.3), beside the rename-based one of commit.h,
// which branches here once, on Storage::traits(root).atomic_rename. What it
// assumes of the storage, written down: a file created by Open(kCreateNew)
// and closed appears whole or not at all; CreateExclusive lets one of two
// creators of a path succeed (unless traits(path).conditional_create is
// false: then the user promised a single writer); ReplaceFile replaces a
// file whole; an acknowledged write is durable. Nothing about renames,
// directories, fsync or locks.
//
// The save's "temporary directory" (SavePrep::tmp_dir) is the step's own
// prefix, root/step-NNNNNNNN, and shard files carry the save in their
// names (ShardFileNameFor), so that a failed save removes only its own
// objects (DiscardSave), never the prefix, which another writer may have
// committed.
#ifndef CKPT_LIBCKPT_OBJECT_STORE_COMMIT_H_
#define CKPT_LIBCKPT_OBJECT_STORE_COMMIT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/format/records.h"
#include "ckpt/storage.h"
#include "save/save_messages.h"

namespace ckpt::internal {

// The name of rank `rank`'s shard file in directory `dir` in the save of
// checkpoint `id`: shard-NNNNN.ckpt where renames are atomic,
// shard-NNNNN.<save>.ckpt otherwise (<save>: the first 8 bytes of the id
// in hex; §4.3 "Names").
std::string ShardFileNameFor(const Storage& storage, const std::string& dir,
                             uint32_t rank, const format::CheckpointId& id);

// A save in progress, as its marker object in the root names it:
// .tmp-save.<save>.<step>.<world>.<created seconds> (§4.3 "Names").
struct SaveMarker {
  std::string save;  // 16 hex digits
  uint64_t step = 0;
  uint32_t world = 0;
  int64_t created_s = 0;  // Unix seconds, by the writer's clock
};
std::string SaveMarkerName(const SaveMarker& marker);
// False for any name that is not exactly a marker's.
bool ParseSaveMarkerName(absl::string_view name, SaveMarker* marker);

// BeginSave (commit.h) where renames are not atomic: draws the checkpoint
// id, creates the save's marker by CreateExclusive (whose errors stop the
// save: FailedPrecondition on a store without conditional writes not in
// single-writer mode), removes the leftovers of dead saves (best effort:
// their errors do not fail this save), and refuses an existing step
// unless `overwrite`, with BeginSave's message. tmp_dir: root/step-N.
absl::StatusOr<SavePrep> BeginObjectStoreSave(
    Storage* storage, const std::string& root, uint64_t step, uint32_t world,
    bool overwrite, const format::Fingerprint& fingerprint);

// CommitCheckpoint (commit.h) where renames are not atomic, for the save
// whose shard files are complete under `step_dir`: MANIFEST by
// CreateExclusive (the commit point; AlreadyExists if another writer
// committed the step), or by ReplaceFile with `overwrite` followed by the
// removal of the replaced checkpoint's shard files; then `latest` by
// ReplaceFile, pruning to `keep_last`, and the marker's removal.
// DeadlineExceeded, committing nothing, when the save began half the stale
// age ago or more. On error after the commit point the checkpoint stays
// committed (DiscardSave keeps it).
absl::Status CommitObjectStoreCheckpoint(Storage* storage,
                                         const std::string& root,
                                         const std::string& step_dir,
                                         const format::Manifest& manifest,
                                         bool overwrite, int keep_last);

// Removes what the failed save of `info` wrote into `tmp` (best effort):
// with atomic renames, tmp as a whole; without, the shard files named
// after the save and then its marker, unless the step's MANIFEST is the
// save's own (it committed, and an error came after: nothing is removed
// but the marker), or cannot be read (everything is left for a later
// save's cleanup).
absl::Status DiscardSave(Storage* storage, const std::string& tmp,
                         const format::CheckpointInfo& info);

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_OBJECT_STORE_COMMIT_H_

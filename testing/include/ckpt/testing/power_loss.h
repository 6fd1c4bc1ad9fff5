// PowerLossStorage: an in-memory Storage for tests that models what a disk
// holds after a power loss, so that a test can prove that every fsync a
// protocol relies on is made (and find the ones it forgets).
//
// The model is the page cache of a POSIX file system:
//   - a file's bytes (PWrite, and a new file's size) are volatile until
//     File::Sync of that file;
//   - a directory's entries (creating a file or directory in it, renaming
//     into or out of it, removing from it) are volatile until SyncDir of
//     that directory. A new file's entry is not made durable by syncing the
//     file, nor a new directory's entry by syncing the new directory.
// PowerCut() then drops everything volatile: files go back to the bytes of
// their last Sync (empty if never synced), directories to the entries of
// their last SyncDir, and whatever is no longer reachable from "/" is gone.
// Optionally some directory operations still volatile survive: the first
// few, in the order they were made, as a journaling file system may have
// committed them on its own, or any single one; unsynced file bytes never
// survive. Torn writes within a
// file are not modelled: a file is either its last synced bytes or, while
// the power is on, its latest bytes.
//
//   PowerLossStorage disk;
//   disk.HaltAtCall(17);          // the 17th call and all later ones fail
//   (void)writer->Save("/ck", 3, {});  // with storage = &disk
//   disk.PowerCut();              // what survives; the storage works again
//   auto reader = ckpt::Reader::Open("/ck", {.storage = &disk});
//
// Paths: "/"-separated; empty and "." components are ignored, so "a/b" and
// "/a/b" name the same file; ".." is not interpreted. "/" always exists.
// Errors name the operation and the path as POSIX storage does, with the
// same codes (NotFound, AlreadyExists...). Lock() is not implemented
// (Unimplemented, the Storage default): writers then rely on renames alone.
//
// Thread-safe: every call takes one lock, so the calls of several in-process
// ranks are numbered in the order they reach the storage.
#ifndef CKPT_TESTING_POWER_LOSS_H_
#define CKPT_TESTING_POWER_LOSS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/storage.h"
#include "util/mutex.h"

namespace ckpt {

class PowerLossStorage final : public Storage {
 public:
  // An empty file system: only "/" exists.
  PowerLossStorage();
  ~PowerLossStorage() override;
  PowerLossStorage(const PowerLossStorage&) = delete;
  PowerLossStorage& operator=(const PowerLossStorage&) = delete;

  // A copy of this file system, volatile and durable state and pending
  // directory operations included, powered on, with no halt scheduled and
  // a call count of 0. Files open here are not carried over.
  std::unique_ptr<PowerLossStorage> Fork() const ABSL_LOCKS_EXCLUDED(mu_);

  // The machine stops: the nth call counted from now (every Storage and
  // File call, reads and failed calls included) and every later call fail
  // with Unavailable("power lost") without any effect. REQUIRES: nth >= 1.
  void HaltAtCall(int64_t nth) ABSL_LOCKS_EXCLUDED(mu_);

  // Power loss and reboot: drops everything volatile (see above) except the
  // first `keep_pending` of the pending directory operations (all of them
  // if there are fewer). Files opened before fail with Unavailable from now
  // on; a scheduled or reached halt is cleared; the storage works again.
  void PowerCut(size_t keep_pending = 0) ABSL_LOCKS_EXCLUDED(mu_);
  // As PowerCut, but only pending directory operation number `index` (from
  // 0, oldest first) survives: POSIX does not order unsynced directory
  // operations, so any one of them may reach the disk without the others.
  // REQUIRES: index < pending_dir_ops().
  void PowerCutKeepingOnly(size_t index) ABSL_LOCKS_EXCLUDED(mu_);

  // Directory operations made but not yet durable (each rename and each
  // creation or removal of one name counts one; RemoveAll counts one per
  // name it removes).
  size_t pending_dir_ops() const ABSL_LOCKS_EXCLUDED(mu_);
  // Calls seen since construction or Fork, failed or not.
  int64_t calls() const ABSL_LOCKS_EXCLUDED(mu_);

  // Storage.
  absl::StatusOr<std::unique_ptr<File>> Open(
      const std::string& path, OpenMode mode,
      const OpenOptions& options = {}) override;
  absl::Status CreateDir(const std::string& path) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status RenameNoReplace(const std::string& from,
                               const std::string& to) override;
  absl::StatusOr<std::vector<std::string>> List(
      const std::string& dir) override;
  absl::StatusOr<FileInfo> Stat(const std::string& path) override;
  absl::Status RemoveFile(const std::string& path) override;
  absl::Status RemoveAll(const std::string& path) override;

 private:
  class MemFile;
  struct Node;
  using NodePtr = std::shared_ptr<Node>;
  // One directory entry change: `dir`'s entry `name` becomes `target`
  // (null: removed).
  struct Change {
    NodePtr dir;
    std::string name;
    NodePtr target;
  };
  // The changes of one call that a journal would commit together.
  using DirOp = std::vector<Change>;

  // Counts the call; Unavailable if the machine is halted (now or by it).
  absl::Status Enter(const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<NodePtr> Lookup(const std::string& path,
                                 const std::string& what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The directory that holds `path` and the last component of `path`.
  absl::StatusOr<std::pair<NodePtr, std::string>> Parent(
      const std::string& path, const std::string& what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies `op` to the volatile entries and records it as pending.
  void Apply(DirOp op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RenameLocked(const std::string& from, const std::string& to,
                            bool replace) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PowerCut, keeping the pending operations i with keep(i).
  void CutLocked(const std::vector<bool>& keep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every node reachable from root_ or a pending operation, through
  // volatile or durable entries.
  std::vector<NodePtr> AllNodes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  NodePtr root_ ABSL_GUARDED_BY(mu_);
  std::vector<DirOp> pending_ ABSL_GUARDED_BY(mu_);  // oldest first
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t halt_at_ ABSL_GUARDED_BY(mu_) = 0;  // 0: none scheduled
  bool halted_ ABSL_GUARDED_BY(mu_) = false;
  // Incremented by PowerCut; a file opened in an earlier epoch is stale.
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt

#endif  // CKPT_TESTING_POWER_LOSS_H_

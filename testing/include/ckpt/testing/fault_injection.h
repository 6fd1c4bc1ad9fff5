// FaultInjectingStorage: a Storage that forwards to another one and fails
// chosen calls, so that tests can prove what a writer or reader does when
// the disk fills, a write tears or the process dies between two system
// calls.
//
//   FaultInjectingStorage fs(DefaultStorage());
//   fs.ShortWriteAt(3, 100, absl::ResourceExhaustedError("disk full"));
//   // The 3rd PWrite writes its first 100 bytes, then fails with
//   // "injected fault: pwrite /ck/.tmp-.../shard-00000.ckpt: disk full".
//
// Limits: a crash is modelled as "nothing after this point reaches the
// storage"; data written before it stays, synced or not. To observe the
// loss of unsynced writes, use PowerLossStorage (power_loss.h), which
// models the page cache.
#ifndef CKPT_TESTING_FAULT_INJECTION_H_
#define CKPT_TESTING_FAULT_INJECTION_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/storage.h"
#include "util/mutex.h"

namespace ckpt {

// The operations a rule can target. Several Storage and File methods share
// one: File::Size and Storage::Stat are kStat, Rename and RenameNoReplace
// are kRename, RemoveFile and RemoveAll are kRemove.
enum class StorageOp {
  kOpen,
  kRead,
  kWrite,
  kSync,
  kClose,
  kCreateDir,
  kSyncDir,
  kRename,
  kList,
  kStat,
  kRemove,
};
inline constexpr int kNumStorageOps = 11;

// "open", "read", "write", "sync", "close", "create_dir", "sync_dir",
// "rename", "list", "stat", "remove": the name of the enumerator, for test
// output. (Fault messages use the system call's name, see below.)
const char* StorageOpName(StorageOp op);
std::ostream& operator<<(std::ostream& os, StorageOp op);

// Forwards every call to `base` unless a rule fires. Calls are numbered per
// StorageOp from 1, counting from construction or the last Reset(); a rule
// names the op and the number of the call it applies to.
//
// Files returned by Open are wrapped too, so their PRead/PWrite/Sync/Size/
// Close count and can fail. REQUIRES: this object outlives those files.
//
// Thread-safe: rules may be added and counts read while other threads do
// I/O through the object. Call numbers are assigned in the order calls
// reach the object, so with concurrent callers "the 3rd write" is whichever
// write arrived third. The base call itself runs outside the lock.
//
// Error messages of injected faults name the operation, as the system call
// that POSIX storage would make, and the path, and keep the code of the
// given status: "injected fault: pwrite <path>: <message>". The operation
// words are open, pread, pwrite, fsync (File::Sync and SyncDir), fstat,
// close, mkdir, rename (both renames, "rename <from> to <to>"), opendir,
// stat, unlink and remove_all.
class FaultInjectingStorage final : public Storage {
 public:
  // `base` is not owned and must outlive this object.
  explicit FaultInjectingStorage(Storage* base);
  ~FaultInjectingStorage() override;

  FaultInjectingStorage(const FaultInjectingStorage&) = delete;
  FaultInjectingStorage& operator=(const FaultInjectingStorage&) = delete;

  // The nth call of `op` fails with `error` (annotated as above) without
  // reaching `base`; for kWrite nothing is written. REQUIRES: nth >= 1,
  // !error.ok() (an OK `error` is replaced by Internal).
  void FailAt(StorageOp op, int64_t nth, absl::Status error);

  // The nth PWrite writes the first min(bytes_written, size) bytes of its
  // data through `base` and then fails with `error`: a torn write, or a disk
  // that fills mid-write. If the partial write itself fails, that error is
  // returned instead. REQUIRES: nth_write >= 1, !error.ok().
  void ShortWriteAt(int64_t nth_write, size_t bytes_written,
                    absl::Status error);

  // The nth PRead returns OK with at most `bytes_read` of the bytes asked
  // for (read through `base`): a file that ends early, as when it is
  // truncated under the reader. Breaks File::PRead's contract on purpose
  // (short only at end of file). REQUIRES: nth_read >= 1.
  void ShortReadAt(int64_t nth_read, size_t bytes_read);

  // The nth PRead returns OK, but with bit `bit % 8` of byte
  // `byte % count` of what it read inverted (no change when it read
  // nothing): a disk, cable or page cache that returns other bytes than the
  // file's. REQUIRES: nth_read >= 1.
  void CorruptReadAt(int64_t nth_read, uint64_t byte, int bit);

  // The nth call of `op` fails with `error` and so does every later
  // mutating call, of any op and on any path: PWrite, Sync, CreateDir,
  // SyncDir, Rename*, Remove* and Open other than kRead. Reads, List, Stat
  // and Close still work, as on a file system that went read-only or full.
  // REQUIRES: nth >= 1, !error.ok().
  void FailAllAfter(StorageOp op, int64_t nth, absl::Status error);

  // A simulated crash: the nth call of `op` and every later call of any kind
  // fail with Unavailable("injected crash") without reaching `base`, until
  // Reset(). REQUIRES: nth >= 1.
  void CrashAt(StorageOp op, int64_t nth);

  // Rules fire only for calls whose path contains `substr` (either path of
  // a rename); "" (the default) matches all. The call numbers that rules
  // name then count only matching calls, so set the filter before the calls
  // of interest. Once fired, FailAllAfter and CrashAt affect every path.
  void OnlyPathsContaining(std::string substr);

  // Clears counts, rules, the path filter, the crashed / failing state and
  // injected().
  void Reset();

  // Calls of `op` seen since construction or Reset(), on any path, failed
  // or not.
  int64_t count(StorageOp op) const;
  // Calls failed (wholly or by a short write) or whose reads were cut short
  // or corrupted by this object so far.
  int64_t injected() const;

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
  // The base storage's. Over a base with atomic renames, CreateExclusive
  // and ReplaceFile are Storage's defaults made of the calls above (faults
  // apply to each); over one without, each is one kOpen call ("create",
  // "replace"), then forwarded: its write is a single request.
  StorageTraits traits(const std::string& path) const override {
    return base_->traits(path);
  }
  absl::Status CreateExclusive(const std::string& path,
                               absl::string_view data) override;
  absl::Status ReplaceFile(const std::string& path,
                           absl::string_view data) override;
  // Forwarded to the base storage (no faults: a lock that cannot be taken
  // only costs the writer its mutual exclusion, see storage.h).
  absl::StatusOr<std::unique_ptr<FileLock>> Lock(const std::string& path,
                                                 LockMode mode,
                                                 bool wait) override {
    return base_->Lock(path, mode, wait);
  }

 private:
  class FaultFile;
  enum class RuleKind {
    kFail,
    kShortWrite,
    kFailAllAfter,
    kCrash,
    kShortRead,
    kCorruptRead
  };
  struct Rule {
    RuleKind kind;
    StorageOp op;
    int64_t nth;
    absl::Status error;
    size_t bytes = 0;
    int bit = 0;
  };
  // What one call should do.
  struct Decision {
    absl::Status error;         // OK: forward the call to base
    bool short_write = false;   // write `bytes`, then return `error`
    bool short_read = false;    // (error OK) read at most `bytes`
    bool corrupt_read = false;  // (error OK) flip bit `bit` of byte `bytes`
    size_t bytes = 0;
    int bit = 0;
  };

  // Counts the call and applies the rules. `what` is "<op> <path>" for
  // messages; `path2` is the second path of a rename ("" otherwise).
  Decision Check(StorageOp op, bool mutating, absl::string_view what,
                 absl::string_view path, absl::string_view path2 = "")
      ABSL_LOCKS_EXCLUDED(mu_);
  // Check() for calls that have no short-write form.
  absl::Status CheckStatus(StorageOp op, bool mutating, absl::string_view what,
                           absl::string_view path, absl::string_view path2 = "")
      ABSL_LOCKS_EXCLUDED(mu_);
  void AddRule(Rule rule) ABSL_LOCKS_EXCLUDED(mu_);

  Storage* const base_;
  mutable Mutex mu_;
  std::array<int64_t, kNumStorageOps> counts_ ABSL_GUARDED_BY(mu_) = {};
  // Calls that matched path_filter_: the numbers rules refer to.
  std::array<int64_t, kNumStorageOps> matched_ ABSL_GUARDED_BY(mu_) = {};
  std::vector<Rule> rules_ ABSL_GUARDED_BY(mu_);
  std::string path_filter_ ABSL_GUARDED_BY(mu_);
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  // Set once a FailAllAfter rule fired: every mutating call fails with it.
  absl::Status failing_ ABSL_GUARDED_BY(mu_);
  int64_t injected_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt

#endif  // CKPT_TESTING_FAULT_INJECTION_H_

// Storage: the one interface through which ckpt touches files. The POSIX
// implementation is the default; FaultInjectingStorage
// (ckpt/testing/fault_injection.h, in the test doubles' library
// ckpt_test_doubles) wraps any Storage to fail chosen operations in tests. A
// trainer may supply its own implementation (e.g. for a parallel file system
// client).
//
// Paths are plain strings; implementations do not interpret ".." or
// symlinks specially. Every error names the operation and the path, e.g.
// "pwrite /ck/.tmp-step-00000100-3f2a/shard-00000.ckpt at offset 4096
// (1048576 bytes): No space left on device". errno maps to codes:
// ENOENT -> NotFound, EEXIST/ENOTEMPTY -> AlreadyExists, EACCES/EPERM ->
// PermissionDenied, ENOSPC/EDQUOT/EFBIG -> ResourceExhausted, anything else
// -> Internal (EIO included: the bytes on disk are not known to be bad).
#ifndef CKPT_STORAGE_H_
#define CKPT_STORAGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt {

// An open file. Not thread-safe for Close(); PRead and PWrite on distinct or
// even overlapping ranges may be called from several threads at once.
class File {
 public:
  virtual ~File() = default;

  // Reads up to n bytes at `offset` into dst; returns the count, which is
  // short only at end of file. REQUIRES: dst has room for n bytes.
  [[nodiscard]] virtual absl::StatusOr<size_t> PRead(uint64_t offset, size_t n,
                                                     char* dst) = 0;
  // Writes all of `data` at `offset` (retrying short writes) or fails.
  [[nodiscard]] virtual absl::Status PWrite(uint64_t offset,
                                            absl::string_view data) = 0;
  // fsync(2): data and metadata durable on return.
  [[nodiscard]] virtual absl::Status Sync() = 0;
  [[nodiscard]] virtual absl::StatusOr<uint64_t> Size() = 0;
  // Releases the descriptor; the destructor closes too, ignoring errors.
  // Closing again is OK; other calls after Close() fail with
  // FailedPrecondition.
  [[nodiscard]] virtual absl::Status Close() = 0;
  virtual const std::string& path() const = 0;
};

enum class OpenMode {
  kRead,       // existing file, read-only
  kCreateNew,  // create; AlreadyExists if present (O_EXCL)
  kReadWrite,  // existing file, read-write
};

struct OpenOptions {
  // O_DIRECT for reads and writes whose offset, length and buffer address
  // are multiples of 4096; the implementation transparently uses buffered
  // I/O for other requests, and on file systems without O_DIRECT (tmpfs).
  bool direct = false;
};

struct FileInfo {
  bool is_dir = false;
  uint64_t size = 0;
};

// An advisory lock, released when destroyed (or when the process dies).
class FileLock {
 public:
  virtual ~FileLock() = default;
  // Exclusive -> shared, without releasing in between for other shared
  // holders (an exclusive waiter may get in first).
  [[nodiscard]] virtual absl::Status Downgrade() = 0;
};

enum class LockMode { kShared, kExclusive };

// What a storage offers at a path that the commit protocol depends on:
// writers branch on it once per save (spec/FORMAT.md §4.1 or §4.3). The
// defaults describe a POSIX file system.
struct StorageTraits {
  // Rename and RenameNoReplace are atomic: writers commit by renaming a
  // temporary directory (§4.1). False for object stores, which have no
  // rename: writers commit by CreateExclusive of MANIFEST (§4.3).
  bool atomic_rename = true;
  // Directories exist by themselves: CreateDir makes an empty one and a
  // file is created only in an existing directory. False: a directory is
  // the prefix of the names under it, exists while one does, and CreateDir
  // and SyncDir write nothing.
  bool directories = true;
  // CreateExclusive excludes a concurrent creator of the same path. False
  // where it is only emulated (an object store without conditional writes,
  // in single-writer mode: §4.3).
  bool conditional_create = true;
  // A file may be written with holes (ranges never written, which read as
  // zeros) at no cost. False where a hole costs memory until Close (an
  // object store uploads a part once every byte of it has arrived): the
  // shard writer then writes its alignment padding itself.
  bool sparse_files = true;
  // Without atomic_rename: a save whose marker is older than this is taken
  // for dead by later saves, which remove its leftovers (§4.3, "Leftovers").
  absl::Duration stale_save_age = absl::Hours(24);
};

class Storage {
 public:
  virtual ~Storage() = default;

  // Takes an advisory lock on `path` (a file, created if missing), as
  // flock(2) does: between processes, and between Lock calls of one
  // process. With `wait` false, Unavailable if it is held incompatibly.
  // Writers use it to serialise commits into one root (spec/FORMAT.md
  // §4.1); a storage without locks returns Unimplemented (the default) and
  // writers then rely on atomic renames alone.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<FileLock>> Lock(
      const std::string& path, LockMode mode, bool wait);

  // What this storage offers for `path` and the files under it
  // (StorageTraits); the default is POSIX's. A storage that serves several
  // kinds of paths (local paths and s3:// URLs) answers by the path.
  virtual StorageTraits traits(const std::string& path) const;

  // Writes the whole file `path`, which appears complete or not at all, and
  // only if nothing is at `path`: AlreadyExists otherwise, with nothing
  // written. The commit point of spec/FORMAT.md §4.3. The default writes a
  // temporary file beside `path`, fsyncs it, RenameNoReplace's it to
  // `path` and fsyncs the directory; on error the temporary is removed.
  [[nodiscard]] virtual absl::Status CreateExclusive(const std::string& path,
                                                     absl::string_view data);
  // Replaces (or creates) the whole file `path` atomically: a reader sees
  // its old bytes or the new ones, never a mix. The default: a temporary
  // file, fsynced, renamed over `path`, the directory fsynced.
  [[nodiscard]] virtual absl::Status ReplaceFile(const std::string& path,
                                                 absl::string_view data);

  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<File>> Open(
      const std::string& path, OpenMode mode,
      const OpenOptions& options = {}) = 0;
  // mkdir(2); AlreadyExists if present.
  [[nodiscard]] virtual absl::Status CreateDir(const std::string& path) = 0;
  // fsync of a directory, making renames and creations in it durable.
  [[nodiscard]] virtual absl::Status SyncDir(const std::string& path) = 0;
  // rename(2): atomically replaces `to` if it is a file.
  [[nodiscard]] virtual absl::Status Rename(const std::string& from,
                                            const std::string& to) = 0;
  // Atomic rename that fails with AlreadyExists if `to` exists (used to
  // commit a checkpoint directory without replacing one that another writer
  // committed meanwhile).
  [[nodiscard]] virtual absl::Status RenameNoReplace(const std::string& from,
                                                     const std::string& to) = 0;
  // Names in `dir` (not "." or ".."), sorted.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> List(
      const std::string& dir) = 0;
  [[nodiscard]] virtual absl::StatusOr<FileInfo> Stat(
      const std::string& path) = 0;
  [[nodiscard]] virtual absl::Status RemoveFile(const std::string& path) = 0;
  // Removes a directory and everything in it. OK if it does not exist.
  [[nodiscard]] virtual absl::Status RemoveAll(const std::string& path) = 0;

  // Whole-file read through Open/PRead (so faults apply). NotFound if absent.
  [[nodiscard]] absl::StatusOr<std::string> ReadFile(const std::string& path);
  // Writes a new file `path` (must not exist) and fsyncs it. On error the
  // file may be left behind with part of `data`; callers write into a
  // temporary directory that they discard on failure.
  [[nodiscard]] absl::Status WriteFileAndSync(const std::string& path,
                                              absl::string_view data);
};

// The process-wide POSIX storage. Never null; never destroyed.
// Thread-safe. The library installs no signal handlers: a process that runs
// under RLIMIT_FSIZE must ignore SIGXFSZ itself (signal(SIGXFSZ, SIG_IGN)),
// or a write past the limit kills it instead of failing with
// ResourceExhausted (EFBIG).
Storage* DefaultStorage();

// "a/b" from ("a", "b"); no normalisation beyond adding no "/" when `a` is
// empty or already ends in one.
std::string JoinPath(absl::string_view a, absl::string_view b);

}  // namespace ckpt

#endif  // CKPT_STORAGE_H_

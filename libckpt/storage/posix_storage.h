// storage/: the implementations of ckpt::Storage and the layout of a
// checkpoint root on any Storage (checkpoint_dir.h). This header: the POSIX
// (Linux) implementation of ckpt::Storage; callers get it through
// ckpt::DefaultStorage().
#ifndef CKPT_LIBCKPT_STORAGE_POSIX_STORAGE_H_
#define CKPT_LIBCKPT_STORAGE_POSIX_STORAGE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/storage.h"

namespace ckpt::internal {

// Storage on the local POSIX file system. Holds no state, so every method is
// thread-safe. Files are opened with O_CLOEXEC; new files get mode 0644 and
// new directories 0755 (both less the umask).
//
// A write past RLIMIT_FSIZE raises SIGXFSZ, whose default action kills the
// process. The library installs no signal handlers; a caller that runs under
// such a limit must ignore SIGXFSZ itself, and then gets ResourceExhausted
// (EFBIG) from PWrite.
class PosixStorage final : public Storage {
 public:
  absl::StatusOr<std::unique_ptr<File>> Open(
      const std::string& path, OpenMode mode,
      const OpenOptions& options) override;
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
  // flock(2). On network file systems flock may be local to one node (NFS
  // without lock support, Lustre without -o flock): see spec §4.1.
  absl::StatusOr<std::unique_ptr<FileLock>> Lock(const std::string& path,
                                                 LockMode mode,
                                                 bool wait) override;
};

// The status for a failed system call: the code from `err` as listed in
// storage.h and the message "<what>: <strerror(err)>". `what` names the
// operation and the path, e.g. "open /ck/shard-00000.ckpt".
absl::Status ErrnoToStatus(int err, absl::string_view what);

// RenameNoReplace for file systems whose renameat2(2) lacks
// RENAME_NOREPLACE: AlreadyExists if `to` exists, else rename(2). Not atomic
// (see the .cc). Exposed so tests can reach it on any file system.
absl::Status RenameNoReplaceWithoutRenameat2(const std::string& from,
                                             const std::string& to);

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_STORAGE_POSIX_STORAGE_H_

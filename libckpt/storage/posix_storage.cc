#include "storage/posix_storage.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

namespace ckpt::internal {
namespace {

// O_DIRECT needs offset, length and buffer aligned to the logical block size
// of the device; 4096 covers every device we run on.
constexpr uint64_t kDirectAlignment = 4096;

// strerror_r has a GNU form (returns char*) and an XSI form (returns int);
// these overloads accept whichever the C library declares.
[[maybe_unused]] const char* StrErrorResult(int rc, const char* buf) {
  return rc == 0 ? buf : "Unknown error";
}
[[maybe_unused]] const char* StrErrorResult(const char* msg, const char*) {
  return msg;
}

std::string StrError(int err) {
  char buf[256];
  buf[0] = '\0';
  return StrErrorResult(strerror_r(err, buf, sizeof(buf)), buf);
}

absl::StatusCode ErrnoCode(int err) {
  switch (err) {
    case ENOENT:
      return absl::StatusCode::kNotFound;
    case EEXIST:
#if ENOTEMPTY != EEXIST
    case ENOTEMPTY:
#endif
      return absl::StatusCode::kAlreadyExists;
    case EACCES:
    case EPERM:
      return absl::StatusCode::kPermissionDenied;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::StatusCode::kResourceExhausted;
    default:
      return absl::StatusCode::kInternal;
  }
}

std::string RangeWhat(absl::string_view op, const std::string& path,
                      uint64_t offset, size_t n) {
  return absl::StrCat(op, " ", path, " at offset ", offset, " (", n, " bytes)");
}

bool IsDirectAligned(uint64_t offset, size_t n, const void* p) {
  return offset % kDirectAlignment == 0 && n % kDirectAlignment == 0 &&
         reinterpret_cast<uintptr_t>(p) % kDirectAlignment == 0;
}

class PosixFile final : public File {
 public:
  // Takes ownership of both descriptors; direct_fd is -1 without O_DIRECT.
  PosixFile(std::string path, int fd, int direct_fd)
      : path_(std::move(path)),
        fd_(fd),
        direct_fd_(direct_fd),
        direct_ok_(direct_fd >= 0) {}
  ~PosixFile() override { (void)Close(); }

  absl::StatusOr<size_t> PRead(uint64_t offset, size_t n, char* dst) override {
    if (fd_ < 0) return ClosedError("pread");
    size_t done = 0;
    while (done < n) {
      ssize_t r =
          Transfer(/*write=*/false, dst + done, n - done, offset + done);
      if (r < 0) {
        int err = errno;
        if (err == EINTR) continue;
        return ErrnoToStatus(err, RangeWhat("pread", path_, offset, n));
      }
      if (r == 0) break;  // end of file
      done += static_cast<size_t>(r);
    }
    return done;
  }

  absl::Status PWrite(uint64_t offset, absl::string_view data) override {
    if (fd_ < 0) return ClosedError("pwrite");
    size_t done = 0;
    while (done < data.size()) {
      // pwrite does not modify the buffer; the cast only serves Transfer,
      // which is shared with pread.
      char* p = const_cast<char*>(data.data()) + done;
      ssize_t r =
          Transfer(/*write=*/true, p, data.size() - done, offset + done);
      if (r < 0) {
        int err = errno;
        if (err == EINTR) continue;
        return ErrnoToStatus(err,
                             RangeWhat("pwrite", path_, offset, data.size()));
      }
      if (r == 0) {
        // POSIX allows no progress without an error only for zero-length
        // writes; fail rather than spin.
        return absl::InternalError(
            absl::StrCat(RangeWhat("pwrite", path_, offset, data.size()),
                         ": no progress after ", done, " bytes"));
      }
      done += static_cast<size_t>(r);
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (fd_ < 0) return ClosedError("fsync");
    // fsync applies to the inode, so it also covers writes made through the
    // O_DIRECT descriptor.
    int rc;
    do {
      rc = ::fsync(fd_);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) return ErrnoToStatus(errno, absl::StrCat("fsync ", path_));
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Size() override {
    if (fd_ < 0) return ClosedError("fstat");
    struct stat st;
    if (::fstat(fd_, &st) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("fstat ", path_));
    }
    return static_cast<uint64_t>(st.st_size);
  }

  absl::Status Close() override {
    if (fd_ < 0) return absl::OkStatus();
    if (direct_fd_ >= 0) ::close(direct_fd_);
    direct_fd_ = -1;
    int fd = std::exchange(fd_, -1);
    // On Linux the descriptor is released even when close() reports EINTR,
    // so retrying could close a descriptor another thread just opened.
    if (::close(fd) != 0 && errno != EINTR) {
      return ErrnoToStatus(errno, absl::StrCat("close ", path_));
    }
    return absl::OkStatus();
  }

  const std::string& path() const override { return path_; }

 private:
  absl::Status ClosedError(absl::string_view op) const {
    return absl::FailedPreconditionError(
        absl::StrCat(op, " ", path_, ": file is closed"));
  }

  // One pread/pwrite, through the O_DIRECT descriptor when the request is
  // aligned. A file system may accept O_DIRECT at open and still reject the
  // I/O with EINVAL; then this and every later request use buffered I/O.
  // Returns the syscall's result with errno set.
  ssize_t Transfer(bool write, char* p, size_t n, uint64_t offset) {
    const off_t off = static_cast<off_t>(offset);
    if (direct_ok_.load(std::memory_order_relaxed) &&
        IsDirectAligned(offset, n, p)) {
      ssize_t r = write ? ::pwrite(direct_fd_, p, n, off)
                        : ::pread(direct_fd_, p, n, off);
      if (r >= 0 || errno != EINVAL) return r;
      direct_ok_.store(false, std::memory_order_relaxed);
    }
    return write ? ::pwrite(fd_, p, n, off) : ::pread(fd_, p, n, off);
  }

  const std::string path_;
  int fd_;
  int direct_fd_;
  std::atomic<bool> direct_ok_;
};

int RenameAt2NoReplace(const char* from, const char* to) {
#if defined(__GLIBC__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 28))
  return ::renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE);
#elif defined(SYS_renameat2)
  return static_cast<int>(
      ::syscall(SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE));
#else
  errno = ENOSYS;
  return -1;
#endif
}

std::string RenameWhat(const std::string& from, const std::string& to) {
  return absl::StrCat("rename ", from, " to ", to);
}

// Sorted entries of `dir` without "." and "..".
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoToStatus(errno, absl::StrCat("opendir ", dir));
  std::vector<std::string> names;
  while (true) {
    errno = 0;
    struct dirent* e = ::readdir(d);
    if (e == nullptr) {
      int err = errno;
      ::closedir(d);
      if (err != 0) return ErrnoToStatus(err, absl::StrCat("readdir ", dir));
      break;
    }
    absl::string_view name(e->d_name);
    if (name == "." || name == "..") continue;
    names.emplace_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Removes `path` and, if it is a directory, everything below it. Symbolic
// links are removed, never followed. Entries that vanish meanwhile are fine.
absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, absl::StrCat("lstat ", path));
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoToStatus(errno, absl::StrCat("unlink ", path));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<std::string>> names = ListDir(path);
  if (absl::IsNotFound(names.status())) return absl::OkStatus();
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    CKPT_RETURN_IF_ERROR(RemoveTree(JoinPath(path, name)));
  }
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, absl::StrCat("rmdir ", path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ErrnoToStatus(int err, absl::string_view what) {
  return absl::Status(ErrnoCode(err), absl::StrCat(what, ": ", StrError(err)));
}

absl::Status RenameNoReplaceWithoutRenameat2(const std::string& from,
                                             const std::string& to) {
  // Not atomic: a `to` created between the lstat and the rename is
  // replaced (a file) or, if it is an empty directory, replaced too. Only
  // file systems without RENAME_NOREPLACE get here, and there no atomic
  // alternative exists for directories.
  struct stat st;
  if (::lstat(to.c_str(), &st) == 0) {
    return ErrnoToStatus(EEXIST, RenameWhat(from, to));
  }
  if (errno != ENOENT) {
    return ErrnoToStatus(errno, absl::StrCat("lstat ", to));
  }
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoToStatus(errno, RenameWhat(from, to));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<File>> PosixStorage::Open(
    const std::string& path, OpenMode mode, const OpenOptions& options) {
  int flags = O_CLOEXEC;
  switch (mode) {
    case OpenMode::kRead:
      flags |= O_RDONLY;
      break;
    case OpenMode::kCreateNew:
      flags |= O_CREAT | O_EXCL | O_RDWR;
      break;
    case OpenMode::kReadWrite:
      flags |= O_RDWR;
      break;
  }
  // O_NONBLOCK: a FIFO (or device) put where a file is expected must not
  // block the open; anything but a regular file is refused below.
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_NONBLOCK, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  {
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return ErrnoToStatus(err, absl::StrCat("fstat ", path));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("open ", path, ": not a regular file"));
    }
    int fl = ::fcntl(fd, F_GETFL);
    if (fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
      int err = errno;
      ::close(fd);
      return ErrnoToStatus(err, absl::StrCat("fcntl ", path));
    }
  }

  int direct_fd = -1;
  if (options.direct) {
    // The file exists now, so the second open never creates it.
    const int direct_flags = (flags & ~(O_CREAT | O_EXCL)) | O_DIRECT;
    do {
      direct_fd = ::open(path.c_str(), direct_flags);
    } while (direct_fd < 0 && errno == EINTR);
    // EINVAL: the file system has no O_DIRECT; buffered I/O only.
    if (direct_fd < 0 && errno != EINVAL) {
      int err = errno;
      ::close(fd);
      return ErrnoToStatus(err, absl::StrCat("open ", path, " with O_DIRECT"));
    }
  }
  return std::unique_ptr<File>(new PosixFile(path, fd, direct_fd));
}

absl::Status PosixStorage::CreateDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("mkdir ", path));
  }
  return absl::OkStatus();
}

absl::Status PosixStorage::SyncDir(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  int rc;
  do {
    rc = ::fsync(fd);
  } while (rc != 0 && errno == EINTR);
  int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoToStatus(err, absl::StrCat("fsync ", path));
  return absl::OkStatus();
}

absl::Status PosixStorage::Rename(const std::string& from,
                                  const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoToStatus(errno, RenameWhat(from, to));
  }
  return absl::OkStatus();
}

absl::Status PosixStorage::RenameNoReplace(const std::string& from,
                                           const std::string& to) {
  if (RenameAt2NoReplace(from.c_str(), to.c_str()) == 0) {
    return absl::OkStatus();
  }
  const int err = errno;
  // ENOSYS: kernel before 3.15. EINVAL: the file system does not support
  // RENAME_NOREPLACE (or the rename itself is invalid, which rename(2)
  // then reports again).
  if (err == ENOSYS || err == EINVAL) {
    return RenameNoReplaceWithoutRenameat2(from, to);
  }
  return ErrnoToStatus(err, RenameWhat(from, to));
}

absl::StatusOr<std::vector<std::string>> PosixStorage::List(
    const std::string& dir) {
  return ListDir(dir);
}

absl::StatusOr<FileInfo> PosixStorage::Stat(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  }
  FileInfo info;
  info.is_dir = S_ISDIR(st.st_mode);
  info.size = static_cast<uint64_t>(st.st_size);
  return info;
}

absl::Status PosixStorage::RemoveFile(const std::string& path) {
  if (::unlink(path.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("unlink ", path));
  }
  return absl::OkStatus();
}

absl::Status PosixStorage::RemoveAll(const std::string& path) {
  return RemoveTree(path);
}

namespace {
class PosixLock final : public FileLock {
 public:
  PosixLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixLock() override { ::close(fd_); }  // releases the lock
  absl::Status Downgrade() override {
    if (::flock(fd_, LOCK_SH) != 0)
      return ErrnoToStatus(errno, absl::StrCat("flock ", path_));
    return absl::OkStatus();
  }

 private:
  int fd_;
  std::string path_;
};
}  // namespace

absl::StatusOr<std::unique_ptr<FileLock>> PosixStorage::Lock(
    const std::string& path, LockMode mode, bool wait) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  int op =
      (mode == LockMode::kExclusive ? LOCK_EX : LOCK_SH) | (wait ? 0 : LOCK_NB);
  int rc;
  do {
    rc = ::flock(fd, op);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return absl::UnavailableError(
          absl::StrCat("flock ", path, ": held by another writer"));
    }
    return ErrnoToStatus(err, absl::StrCat("flock ", path));
  }
  return std::unique_ptr<FileLock>(new PosixLock(fd, path));
}

}  // namespace ckpt::internal

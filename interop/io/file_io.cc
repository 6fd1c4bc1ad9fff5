#include "ckpt/interop/io/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace ckpt::interop {

absl::StatusOr<InputFile> InputFile::Open(const std::string& path) {
  // O_NONBLOCK: a FIFO in place of a file must not block the open; it is
  // then refused as not a regular file.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    std::string msg = absl::StrCat(path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg)
                         : absl::FailedPreconditionError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": not a regular file"));
  }
  return InputFile(path, fd, static_cast<uint64_t>(st.st_size));
}

InputFile::InputFile(InputFile&& o) noexcept
    : path_(std::move(o.path_)), fd_(o.fd_), size_(o.size_) {
  o.fd_ = -1;
}

InputFile& InputFile::operator=(InputFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    size_ = o.size_;
    o.fd_ = -1;
  }
  return *this;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status InputFile::ReadAt(uint64_t offset, uint64_t n, void* dst) const {
  if (offset > size_ || n > size_ - offset) {
    return absl::DataLossError(
        absl::StrCat(path_, ": bytes [", offset, ", ", offset + n,
                     ") lie outside the file (", size_, " bytes)"));
  }
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      return absl::DataLossError(
          absl::StrCat(path_, ": read at offset ", offset, ": ",
                       r == 0 ? "unexpected end" : std::strerror(errno)));
    }
    p += r;
    offset += r;
    n -= r;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> InputFile::Read(uint64_t offset, uint64_t n) const {
  if (offset > size_ || n > size_ - offset) {
    return absl::DataLossError(
        absl::StrCat(path_, ": bytes [", offset, ", ", offset + n,
                     ") lie outside the file (", size_, " bytes)"));
  }
  std::string s(n, '\0');
  absl::Status st = ReadAt(offset, n, s.data());
  if (!st.ok()) return st;
  return s;
}

absl::StatusOr<OutputFile> OutputFile::Create(const std::string& final_path) {
  const std::string tmp = absl::StrCat(final_path, ".tmp-", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(tmp, ": ", std::strerror(errno)));
  }
  return OutputFile(tmp, final_path, fd);
}

OutputFile::OutputFile(OutputFile&& o) noexcept
    : tmp_(std::move(o.tmp_)),
      final_(std::move(o.final_)),
      fd_(o.fd_),
      size_(o.size_) {
  o.fd_ = -1;
  o.tmp_.clear();
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

absl::Status OutputFile::Append(absl::string_view bytes) {
  const char* p = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0)
      return absl::InternalError(
          absl::StrCat(tmp_, ": write: ", std::strerror(errno)));
    p += w;
    n -= w;
    size_ += w;
  }
  return absl::OkStatus();
}

absl::Status OutputFile::Commit() {
  if (::fsync(fd_) != 0) {
    return absl::InternalError(
        absl::StrCat(tmp_, ": fsync: ", std::strerror(errno)));
  }
  ::close(fd_);
  fd_ = -1;
  if (std::rename(tmp_.c_str(), final_.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("renaming ", tmp_, " to ", final_,
                                            ": ", std::strerror(errno)));
  }
  tmp_.clear();
  std::string dir = std::filesystem::path(final_).parent_path().string();
  return SyncDir(dir.empty() ? "." : dir);
}

absl::Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    return absl::InternalError(
        absl::StrCat(dir, ": fsync: ", std::strerror(err)));
  }
  ::close(fd);
  return absl::OkStatus();
}

}  // namespace ckpt::interop

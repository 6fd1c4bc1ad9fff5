// The few file operations of the interop adapters: reading byte ranges of
// foreign files, and writing output files under a temporary name that is
// renamed into place when complete.
#ifndef CKPT_INTEROP_IO_FILE_IO_H_
#define CKPT_INTEROP_IO_FILE_IO_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::interop {

// An open read-only file. Move-only; closes on destruction.
class InputFile {
 public:
  // NotFound if `path` does not exist; FailedPrecondition if it is not a
  // regular file (a FIFO is refused without blocking).
  static absl::StatusOr<InputFile> Open(const std::string& path);
  InputFile(InputFile&& o) noexcept;
  InputFile& operator=(InputFile&& o) noexcept;
  ~InputFile();
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // Reads [offset, offset + n) into `dst`. DataLoss naming the file if the
  // range is not inside it. Thread-safe (pread).
  absl::Status ReadAt(uint64_t offset, uint64_t n, void* dst) const;
  absl::StatusOr<std::string> Read(uint64_t offset, uint64_t n) const;

 private:
  InputFile(std::string path, int fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// A file written at `tmp` and renamed to its final path by Commit().
// Without Commit the temporary file is removed on destruction.
class OutputFile {
 public:
  static absl::StatusOr<OutputFile> Create(const std::string& final_path);
  OutputFile(OutputFile&& o) noexcept;
  ~OutputFile();
  absl::Status Append(absl::string_view bytes);
  uint64_t size() const { return size_; }
  // fsync, rename to the final path, fsync of the directory.
  absl::Status Commit();

 private:
  OutputFile(std::string tmp, std::string final_path, int fd)
      : tmp_(std::move(tmp)), final_(std::move(final_path)), fd_(fd) {}
  std::string tmp_, final_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// fsync of directory `dir`.
absl::Status SyncDir(const std::string& dir);

}  // namespace ckpt::interop

#endif  // CKPT_INTEROP_IO_FILE_IO_H_

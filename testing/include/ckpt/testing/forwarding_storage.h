// A Storage and a File that forward every call to another one, for tests:
// a test's wrapper (counting open files or bytes read, holding an fsync
// until the test allows it, ...) derives from them and overrides only the
// calls it watches. Injecting failures is FaultInjectingStorage's job
// (ckpt/fault_injection.h), which also counts calls by kind.
#ifndef CKPT_TESTING_FORWARDING_STORAGE_H_
#define CKPT_TESTING_FORWARDING_STORAGE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/storage.h"

namespace ckpt::testing {

class ForwardingFile : public File {
 public:
  explicit ForwardingFile(std::unique_ptr<File> base)
      : base_(std::move(base)) {}
  absl::StatusOr<size_t> PRead(uint64_t offset, size_t n, char* dst) override {
    return base_->PRead(offset, n, dst);
  }
  absl::Status PWrite(uint64_t offset, absl::string_view data) override {
    return base_->PWrite(offset, data);
  }
  absl::Status Sync() override { return base_->Sync(); }
  absl::StatusOr<uint64_t> Size() override { return base_->Size(); }
  absl::Status Close() override { return base_->Close(); }
  const std::string& path() const override { return base_->path(); }

 private:
  std::unique_ptr<File> base_;
};

// `base` (not owned; DefaultStorage() when null) must outlive this object.
class ForwardingStorage : public Storage {
 public:
  explicit ForwardingStorage(Storage* base = nullptr)
      : base_(base != nullptr ? base : DefaultStorage()) {}

  absl::StatusOr<std::unique_ptr<FileLock>> Lock(const std::string& path,
                                                 LockMode mode,
                                                 bool wait) override {
    return base_->Lock(path, mode, wait);
  }
  absl::StatusOr<std::unique_ptr<File>> Open(
      const std::string& path, OpenMode mode,
      const OpenOptions& options) override {
    return base_->Open(path, mode, options);
  }
  absl::Status CreateDir(const std::string& p) override {
    return base_->CreateDir(p);
  }
  absl::Status SyncDir(const std::string& p) override {
    return base_->SyncDir(p);
  }
  absl::Status Rename(const std::string& a, const std::string& b) override {
    return base_->Rename(a, b);
  }
  absl::Status RenameNoReplace(const std::string& a,
                               const std::string& b) override {
    return base_->RenameNoReplace(a, b);
  }
  absl::StatusOr<std::vector<std::string>> List(const std::string& p) override {
    return base_->List(p);
  }
  absl::StatusOr<FileInfo> Stat(const std::string& p) override {
    return base_->Stat(p);
  }
  absl::Status RemoveFile(const std::string& p) override {
    return base_->RemoveFile(p);
  }
  absl::Status RemoveAll(const std::string& p) override {
    return base_->RemoveAll(p);
  }
  StorageTraits traits(const std::string& p) const override {
    return base_->traits(p);
  }
  // Over a base with atomic renames, Storage's defaults, made of the calls
  // above (so that a wrapper sees them); else the base's.
  absl::Status CreateExclusive(const std::string& p,
                               absl::string_view data) override {
    if (base_->traits(p).atomic_rename) {
      return Storage::CreateExclusive(p, data);
    }
    return base_->CreateExclusive(p, data);
  }
  absl::Status ReplaceFile(const std::string& p,
                           absl::string_view data) override {
    if (base_->traits(p).atomic_rename) return Storage::ReplaceFile(p, data);
    return base_->ReplaceFile(p, data);
  }

 private:
  Storage* base_;
};

// A ForwardingStorage that counts the bytes its files' PRead returned.
class ReadCountingStorage final : public ForwardingStorage {
 public:
  explicit ReadCountingStorage(Storage* base = nullptr)
      : ForwardingStorage(base) {}

  absl::StatusOr<std::unique_ptr<File>> Open(
      const std::string& path, OpenMode mode,
      const OpenOptions& options) override {
    absl::StatusOr<std::unique_ptr<File>> f =
        ForwardingStorage::Open(path, mode, options);
    if (!f.ok()) return f.status();
    return std::unique_ptr<File>(new CountingFile(*std::move(f), &bytes_));
  }

  uint64_t bytes_read() const { return bytes_.load(); }

 private:
  class CountingFile final : public ForwardingFile {
   public:
    CountingFile(std::unique_ptr<File> f, std::atomic<uint64_t>* n)
        : ForwardingFile(std::move(f)), n_(n) {}
    absl::StatusOr<size_t> PRead(uint64_t offset, size_t n,
                                 char* dst) override {
      absl::StatusOr<size_t> got = ForwardingFile::PRead(offset, n, dst);
      if (got.ok()) *n_ += *got;
      return got;
    }

   private:
    std::atomic<uint64_t>* n_;
  };

  std::atomic<uint64_t> bytes_{0};
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTING_FORWARDING_STORAGE_H_

#include "ckpt/open_storage.h"

#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "s3/s3_config.h"
#include "s3/s3_storage.h"

namespace ckpt {
namespace {

// A 0/1 variable; `fallback` when unset.
absl::StatusOr<bool> Flag(const EnvironmentLookup& env, const char* name,
                          bool fallback) {
  const char* v = env ? env(name) : std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  const std::string s(v);
  if (s == "1" || s == "true") return true;
  if (s == "0" || s == "false") return false;
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": '", s, "' is not 0, 1, true or false"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<Storage>> OpenStorage(
    const std::string& root, const EnvironmentLookup& env) {
  if (!s3::IsS3Url(root)) {
    return std::shared_ptr<Storage>(DefaultStorage(), [](Storage*) {});
  }
  CKPT_RETURN_IF_ERROR(s3::ParseS3Url(root).status());
  CKPT_ASSIGN_OR_RETURN(s3::ClientOptions client,
                        s3::ClientOptionsFromEnv(env));
  s3::S3StorageOptions options;
  CKPT_ASSIGN_OR_RETURN(options.conditional_writes,
                        Flag(env, "CKPT_S3_CONDITIONAL_WRITES", true));
  CKPT_ASSIGN_OR_RETURN(options.single_writer,
                        Flag(env, "CKPT_S3_SINGLE_WRITER", false));
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<s3::S3Storage> storage,
                        s3::S3Storage::Create(std::move(client), options));
  return std::shared_ptr<Storage>(std::move(storage));
}

namespace {

class UrlStorageImpl final : public Storage {
 public:
  StorageTraits traits(const std::string& path) const override {
    if (!s3::IsS3Url(path)) return DefaultStorage()->traits(path);
    auto s = S3();
    if (s.ok()) return (*s)->traits(path);
    StorageTraits t;  // what any object store offers
    t.atomic_rename = false;
    t.directories = false;
    t.sparse_files = false;
    return t;
  }
  absl::StatusOr<std::unique_ptr<FileLock>> Lock(const std::string& path,
                                                 LockMode mode,
                                                 bool wait) override {
    CKPT_ASSIGN_OR_RETURN(Storage * s, Route(path));
    return s->Lock(path, mode, wait);
  }
  absl::StatusOr<std::unique_ptr<File>> Open(
      const std::string& path, OpenMode mode,
      const OpenOptions& options) override {
    CKPT_ASSIGN_OR_RETURN(Storage * s, Route(path));
    return s->Open(path, mode, options);
  }
  absl::Status CreateDir(const std::string& path) override {
    CKPT_ASSIGN_OR_RETURN(Storage * s, Route(path));
    return s->CreateDir(path);
  }
  absl::Status SyncDir(const std::string& path) override {
    CKPT_ASSIGN_OR_RETURN(Storage * s, Route(path));
    return s->SyncDir(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    CKPT_ASSIGN_OR_RETURN(Storage * s, Route(from));
    return s->Rename(from, to);
  }
  absl::Status RenameNoReplace(const std::string& from,
                               const std::string& to) override {
    CKPT_ASSIGN_OR_RETURN(Storage * s, Route(from));
    return s->RenameNoReplace(from, to);
  }
  absl::StatusOr<std::vector<std::string>> List(
      const std::string& dir) override {
    CKPT_ASSIGN_OR_RETURN(Storage * s, Route(dir));
    return s->List(dir);
  }
  absl::StatusOr<FileInfo> Stat(const std::string& path) override {
    CKPT_ASSIGN_OR_RETURN(Storage * s, Route(path));
    return s->Stat(path);
  }
  absl::Status RemoveFile(const std::string& path) override {
    CKPT_ASSIGN_OR_RETURN(Storage * s, Route(path));
    return s->RemoveFile(path);
  }
  absl::Status RemoveAll(const std::string& path) override {
    CKPT_ASSIGN_OR_RETURN(Storage * s, Route(path));
    return s->RemoveAll(path);
  }
  absl::Status CreateExclusive(const std::string& path,
                               absl::string_view data) override {
    CKPT_ASSIGN_OR_RETURN(Storage * s, Route(path));
    return s->CreateExclusive(path, data);
  }
  absl::Status ReplaceFile(const std::string& path,
                           absl::string_view data) override {
    CKPT_ASSIGN_OR_RETURN(Storage * s, Route(path));
    return s->ReplaceFile(path, data);
  }

 private:
  // The S3 storage, made on first use (its error, if it cannot be, kept).
  absl::StatusOr<Storage*> S3() const {
    std::call_once(once_, [this] {
      auto s = OpenStorage("s3://bucket");
      if (s.ok()) {
        s3_ = *std::move(s);
      } else {
        error_ = s.status();
      }
    });
    if (s3_ == nullptr) return error_;
    return s3_.get();
  }
  absl::StatusOr<Storage*> Route(const std::string& path) const {
    if (!s3::IsS3Url(path)) return DefaultStorage();
    return S3();
  }

  mutable std::once_flag once_;
  mutable std::shared_ptr<Storage> s3_;
  mutable absl::Status error_;
};

}  // namespace

Storage* UrlStorage() {
  // Leaked on purpose, as DefaultStorage().
  static Storage* const storage = new UrlStorageImpl();
  return storage;
}

}  // namespace ckpt

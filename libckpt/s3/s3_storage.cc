#include "s3/s3_storage.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "ckpt/format/status_macros.h"
#include "s3/s3_config.h"
#include "util/mutex.h"

namespace ckpt::s3 {
namespace {

// "s3://b/a/b/" -> (b, "a/b"): a key without the trailing '/' a directory
// may be given with.
absl::StatusOr<S3Url> ParsePath(absl::string_view op, const std::string& path) {
  auto url = ParseS3Url(path);
  if (!url.ok()) return Annotate(url.status(), op);
  while (!url->key.empty() && url->key.back() == '/') url->key.pop_back();
  return url;
}

// The prefix of the keys in directory `key` ("" for the bucket's root).
std::string DirPrefix(const std::string& key) {
  return key.empty() ? std::string() : absl::StrCat(key, "/");
}

// A file open for reading: its size from HEAD at Open, then ranged GETs.
class S3ReadFile final : public File {
 public:
  S3ReadFile(S3Client* client, S3Url url, std::string path, uint64_t size)
      : client_(client),
        url_(std::move(url)),
        path_(std::move(path)),
        size_(size) {}

  absl::StatusOr<size_t> PRead(uint64_t offset, size_t n, char* dst) override {
    if (closed_) return Closed("pread");
    if (offset >= size_ || n == 0) return 0;
    const uint64_t len = std::min<uint64_t>(n, size_ - offset);
    CKPT_RETURN_IF_ERROR(
        Annotate(client_->GetRange(url_.bucket, url_.key, offset, len, dst),
                 absl::StrCat("pread ", path_, " at offset ", offset, " (", len,
                              " bytes)")));
    return static_cast<size_t>(len);
  }
  absl::Status PWrite(uint64_t offset, absl::string_view data) override {
    if (closed_) return Closed("pwrite");
    return absl::FailedPreconditionError(
        absl::StrCat("pwrite ", path_, " at offset ", offset, " (", data.size(),
                     " bytes): the object is open for reading"));
  }
  absl::Status Sync() override {
    if (closed_) return Closed("fsync");
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> Size() override {
    if (closed_) return Closed("fstat");
    return size_;
  }
  absl::Status Close() override {
    closed_ = true;
    return absl::OkStatus();
  }
  const std::string& path() const override { return path_; }

 private:
  absl::Status Closed(absl::string_view op) const {
    return absl::FailedPreconditionError(
        absl::StrCat(op, " ", path_, ": the file is closed"));
  }

  S3Client* const client_;
  const S3Url url_;
  const std::string path_;
  const uint64_t size_;
  bool closed_ = false;
};

// A file being written: an ObjectWriter, committed at Close.
class S3WriteFile final : public File {
 public:
  S3WriteFile(std::unique_ptr<ObjectWriter> writer, std::string path)
      : writer_(std::move(writer)), path_(std::move(path)) {}
  // The ObjectWriter's destructor aborts an upload not committed.
  ~S3WriteFile() override = default;

  absl::StatusOr<size_t> PRead(uint64_t, size_t, char*) override {
    if (closed()) return Closed("pread");
    return absl::FailedPreconditionError(
        absl::StrCat("pread ", path_,
                     ": an object being written cannot be read before Close"));
  }
  absl::Status PWrite(uint64_t offset, absl::string_view data) override {
    if (closed()) return Closed("pwrite");
    CKPT_RETURN_IF_ERROR(
        Annotate(writer_->PWrite(offset, data),
                 absl::StrCat("pwrite ", path_, " at offset ", offset, " (",
                              data.size(), " bytes)")));
    MutexLock l(&mu_);
    end_ = std::max<uint64_t>(end_, offset + data.size());
    return absl::OkStatus();
  }
  // Nothing to do: the object becomes durable when Close commits it.
  absl::Status Sync() override {
    if (closed()) return Closed("fsync");
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> Size() override {
    if (closed()) return Closed("fstat");
    MutexLock l(&mu_);
    return end_;
  }
  absl::Status Close() override {
    {
      MutexLock l(&mu_);
      if (closed_) return absl::OkStatus();
      closed_ = true;
    }
    return Annotate(writer_->Close(), absl::StrCat("close ", path_));
  }
  const std::string& path() const override { return path_; }

 private:
  bool closed() const {
    MutexLock l(&mu_);
    return closed_;
  }
  absl::Status Closed(absl::string_view op) const {
    return absl::FailedPreconditionError(
        absl::StrCat(op, " ", path_, ": the file is closed"));
  }

  const std::unique_ptr<ObjectWriter> writer_;
  const std::string path_;
  mutable Mutex mu_;
  uint64_t end_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<S3Storage>> S3Storage::Create(
    ClientOptions client_options, S3StorageOptions options,
    RequestObserver observer) {
  CKPT_ASSIGN_OR_RETURN(
      std::unique_ptr<S3Client> client,
      S3Client::Create(std::move(client_options), std::move(observer)));
  return std::make_unique<S3Storage>(
      std::shared_ptr<S3Client>(std::move(client)), std::move(options));
}

S3Storage::S3Storage(std::shared_ptr<S3Client> client, S3StorageOptions options)
    : client_(std::move(client)), options_(std::move(options)) {}

StorageTraits S3Storage::traits(const std::string&) const {
  StorageTraits t;
  t.atomic_rename = false;
  t.directories = false;
  t.conditional_create = options_.conditional_writes;
  t.sparse_files = false;
  t.stale_save_age = options_.stale_save_age;
  return t;
}

absl::StatusOr<std::unique_ptr<File>> S3Storage::Open(const std::string& path,
                                                      OpenMode mode,
                                                      const OpenOptions&) {
  const std::string op = absl::StrCat("open ", path);
  CKPT_ASSIGN_OR_RETURN(S3Url url, ParsePath(op, path));
  if (url.key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": names a bucket, not an object"));
  }
  switch (mode) {
    case OpenMode::kRead: {
      auto info = client_->HeadObject(url.bucket, url.key);
      if (!info.ok()) return Annotate(info.status(), op);
      return std::unique_ptr<File>(
          new S3ReadFile(client_.get(), std::move(url), path, info->size));
    }
    case OpenMode::kCreateNew: {
      // O_EXCL at Open, as on POSIX; the conditional commit at Close
      // settles a race with a writer that creates it meanwhile.
      auto head = client_->HeadObject(url.bucket, url.key);
      if (head.ok()) {
        return absl::AlreadyExistsError(
            absl::StrCat(op, ": the object exists"));
      }
      if (!absl::IsNotFound(head.status())) {
        return Annotate(head.status(), op);
      }
      ObjectWriterOptions wo = options_.writer;
      wo.if_none_match = options_.conditional_writes;
      CKPT_ASSIGN_OR_RETURN(
          std::unique_ptr<ObjectWriter> writer,
          ObjectWriter::Create(client_.get(), url.bucket, url.key, wo));
      return std::unique_ptr<File>(new S3WriteFile(std::move(writer), path));
    }
    case OpenMode::kReadWrite:
      break;
  }
  return absl::UnimplementedError(
      absl::StrCat(op, ": objects are not updated in place"));
}

absl::StatusOr<bool> S3Storage::HasChildren(const std::string& bucket,
                                            const std::string& key) {
  CKPT_ASSIGN_OR_RETURN(ListResult r,
                        client_->ListObjects(bucket, DirPrefix(key), "/",
                                             /*page_size=*/1, /*max_pages=*/1));
  return key.empty() || !r.objects.empty() || !r.common_prefixes.empty();
}

absl::StatusOr<FileInfo> S3Storage::Stat(const std::string& path) {
  const std::string op = absl::StrCat("stat ", path);
  CKPT_ASSIGN_OR_RETURN(S3Url url, ParsePath(op, path));
  FileInfo info;
  if (!url.key.empty()) {
    auto head = client_->HeadObject(url.bucket, url.key);
    if (head.ok()) {
      info.size = head->size;
      return info;
    }
    if (!absl::IsNotFound(head.status())) return Annotate(head.status(), op);
  }
  auto dir = HasChildren(url.bucket, url.key);
  if (!dir.ok()) return Annotate(dir.status(), op);
  if (!*dir) {
    return absl::NotFoundError(
        absl::StrCat(op, ": no such object, and no object under it"));
  }
  info.is_dir = true;
  return info;
}

absl::StatusOr<std::vector<std::string>> S3Storage::List(
    const std::string& dir) {
  const std::string op = absl::StrCat("opendir ", dir);
  CKPT_ASSIGN_OR_RETURN(S3Url url, ParsePath(op, dir));
  const std::string prefix = DirPrefix(url.key);
  auto r = client_->ListObjects(url.bucket, prefix, "/");
  if (!r.ok()) return Annotate(r.status(), op);
  std::vector<std::string> names;
  names.reserve(r->objects.size() + r->common_prefixes.size());
  for (const ObjectInfo& o : r->objects) {
    absl::string_view name = o.key;
    if (absl::ConsumePrefix(&name, prefix) && !name.empty()) {
      names.emplace_back(name);
    }
  }
  for (const std::string& p : r->common_prefixes) {
    absl::string_view name = p;
    if (absl::ConsumePrefix(&name, prefix) && absl::ConsumeSuffix(&name, "/") &&
        !name.empty()) {
      names.emplace_back(name);
    }
  }
  if (names.empty() && !url.key.empty()) {
    return absl::NotFoundError(absl::StrCat(op, ": no object under it"));
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

absl::Status S3Storage::CreateDir(const std::string& path) {
  const std::string op = absl::StrCat("mkdir ", path);
  auto st = Stat(path);
  if (st.ok()) return absl::AlreadyExistsError(absl::StrCat(op, ": exists"));
  if (!absl::IsNotFound(st.status())) return Annotate(st.status(), "mkdir");
  return absl::OkStatus();  // directories are prefixes: nothing to write
}

absl::Status S3Storage::SyncDir(const std::string&) {
  return absl::OkStatus();  // an acknowledged write is durable
}

absl::Status S3Storage::Rename(const std::string& from, const std::string& to) {
  return absl::UnimplementedError(
      absl::StrCat("rename ", from, " to ", to,
                   ": an object store has no rename (spec/FORMAT.md §4.3)"));
}

absl::Status S3Storage::RenameNoReplace(const std::string& from,
                                        const std::string& to) {
  return Rename(from, to);
}

absl::StatusOr<int> S3Storage::AbortUploadsOf(const std::string& bucket,
                                              const std::string& key) {
  CKPT_ASSIGN_OR_RETURN(std::vector<MultipartUpload> uploads,
                        client_->ListMultipartUploads(bucket, key));
  int aborted = 0;
  for (const MultipartUpload& u : uploads) {
    if (u.key != key) continue;
    CKPT_RETURN_IF_ERROR(
        client_->AbortMultipartUpload(bucket, u.key, u.upload_id));
    ++aborted;
  }
  return aborted;
}

absl::Status S3Storage::RemoveFile(const std::string& path) {
  const std::string op = absl::StrCat("unlink ", path);
  CKPT_ASSIGN_OR_RETURN(S3Url url, ParsePath(op, path));
  auto head = client_->HeadObject(url.bucket, url.key);
  if (head.ok()) {
    CKPT_RETURN_IF_ERROR(
        Annotate(client_->DeleteObject(url.bucket, url.key), op));
  } else if (!absl::IsNotFound(head.status())) {
    return Annotate(head.status(), op);
  }
  // A write in progress under the key (a dead save's) goes too.
  auto aborted = AbortUploadsOf(url.bucket, url.key);
  if (!aborted.ok()) return Annotate(aborted.status(), op);
  if (head.ok() || *aborted > 0) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(op, ": no such object"));
}

absl::Status S3Storage::RemoveAll(const std::string& path) {
  const std::string op = absl::StrCat("remove_all ", path);
  CKPT_ASSIGN_OR_RETURN(S3Url url, ParsePath(op, path));
  if (url.key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": refusing to empty a whole bucket"));
  }
  const std::string prefix = DirPrefix(url.key);
  auto listed = client_->ListObjects(url.bucket, prefix);
  if (!listed.ok()) return Annotate(listed.status(), op);
  std::vector<std::string> keys;
  keys.reserve(listed->objects.size());
  for (ObjectInfo& o : listed->objects) keys.push_back(std::move(o.key));
  if (!keys.empty()) {
    CKPT_RETURN_IF_ERROR(
        Annotate(client_->DeleteObjects(url.bucket, keys), op));
  }
  auto uploads = client_->ListMultipartUploads(url.bucket, prefix);
  if (!uploads.ok()) return Annotate(uploads.status(), op);
  for (const MultipartUpload& u : *uploads) {
    CKPT_RETURN_IF_ERROR(Annotate(
        client_->AbortMultipartUpload(url.bucket, u.key, u.upload_id), op));
  }
  return absl::OkStatus();
}

absl::Status S3Storage::CreateExclusive(const std::string& path,
                                        absl::string_view data) {
  const std::string op = absl::StrCat("create ", path);
  CKPT_ASSIGN_OR_RETURN(S3Url url, ParsePath(op, path));
  if (options_.conditional_writes) {
    PutOptions po;
    po.if_none_match = true;
    return Annotate(client_->PutObject(url.bucket, url.key, data, po), op);
  }
  if (!options_.single_writer) {
    return absl::FailedPreconditionError(absl::StrCat(
        op,
        ": this store is not known to honour conditional writes "
        "(If-None-Match); say so if it does (conditional_writes), or promise "
        "that at most one writer saves into this root (single_writer); "
        "spec/FORMAT.md §4.3"));
  }
  // Single-writer mode: absent, written, and read back as written.
  auto head = client_->HeadObject(url.bucket, url.key);
  if (head.ok()) return absl::AlreadyExistsError(absl::StrCat(op, ": exists"));
  if (!absl::IsNotFound(head.status())) return Annotate(head.status(), op);
  CKPT_RETURN_IF_ERROR(
      Annotate(client_->PutObject(url.bucket, url.key, data), op));
  auto back = client_->GetObject(url.bucket, url.key);
  if (!back.ok()) return Annotate(back.status(), op);
  if (*back != data) {
    return absl::AlreadyExistsError(absl::StrCat(
        op, ": another writer replaced it (read back ", back->size(),
        " other bytes; the store does not honour conditional writes)"));
  }
  return absl::OkStatus();
}

absl::Status S3Storage::ReplaceFile(const std::string& path,
                                    absl::string_view data) {
  const std::string op = absl::StrCat("replace ", path);
  CKPT_ASSIGN_OR_RETURN(S3Url url, ParsePath(op, path));
  return Annotate(client_->PutObject(url.bucket, url.key, data), op);
}

}  // namespace ckpt::s3

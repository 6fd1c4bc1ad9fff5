// S3Storage: ckpt::Storage over an S3 client, for s3://bucket/prefix
// roots. Paths are s3:// URLs ("s3://bucket/root/step-00000100/MANIFEST");
// a "directory" is the prefix of the keys under it. Writers commit on it by
// the object-store protocol of spec/FORMAT.md §4.3 (traits: no atomic
// rename, no directories), readers read it as any storage.
//
//   Open(kCreateNew)  a File over an ObjectWriter: PWrites fill parts that go
//                     up as a multipart upload; Sync does nothing; Close
//                     commits the object (If-None-Match: *), nothing is
//                     visible before. A File destroyed unclosed, or whose
//                     Close fails, aborts its upload.
//   Open(kRead)       HEAD for the size, then one ranged GET per PRead, of
//                     exactly the bytes asked (short only at the end of the
//                     object).
//   Open(kReadWrite)  Unimplemented: objects are not updated in place.
//   Stat              HEAD; else a one-key listing of "path/" (a directory).
//   List              ListObjectsV2 of "dir/" with delimiter "/".
//   CreateDir         AlreadyExists if something is at or under the path,
//                     else OK with nothing written: an empty directory does
//                     not exist on an object store.
//   SyncDir           OK: an acknowledged write is durable.
//   Rename*           Unimplemented: no rename (the writer needs none).
//   RemoveFile        HEAD, DeleteObject, and AbortMultipartUpload of the
//                     uploads in progress for the key; NotFound if there
//                     was neither an object nor an upload.
//   RemoveAll         DeleteObjects of every key under "path/", 1000 a
//                     request, and AbortMultipartUpload of every upload in
//                     progress under it.
//   CreateExclusive   PutObject with If-None-Match: * (or, in single-writer
//                     mode, HEAD, PutObject and a read back).
//   ReplaceFile       PutObject.
//   Lock              Unimplemented (Storage's default).
//
// Errors name the operation and the path, then the client's message (the
// object, the S3 operation, the HTTP status and S3's code); codes as the
// client gives them (s3_client.h). Credentials never appear in them.
//
// Thread-safe, as the client is; Files follow File's rules.
#ifndef CKPT_S3_S3_STORAGE_H_
#define CKPT_S3_S3_STORAGE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ckpt/storage.h"
#include "s3/s3_client.h"
#include "s3/s3_object_writer.h"

namespace ckpt::s3 {

struct S3StorageOptions {
  // How files are written (part size, parts uploading at once per file).
  // if_none_match is ignored: the storage sets it from conditional_writes.
  ObjectWriterOptions writer;
  // The store honours If-None-Match: * on PutObject and
  // CompleteMultipartUpload (AWS S3 does; some S3-compatible stores ignore
  // it). Set it false for a store that does not: CreateExclusive then fails
  // with FailedPrecondition unless single_writer is set.
  bool conditional_writes = true;
  // The user's promise that at most one writer saves into a root at a time
  // (spec/FORMAT.md §4.3, "Stores without conditional writes"): without
  // conditional writes, CreateExclusive is emulated by a HEAD, a PutObject
  // and a read back, which detects a concurrent writer but does not
  // exclude one.
  bool single_writer = false;
  // StorageTraits::stale_save_age: a save begun longer ago is dead.
  absl::Duration stale_save_age = absl::Hours(24);
};

class S3Storage final : public Storage {
 public:
  // A storage over its own client (S3Client::Create's errors).
  static absl::StatusOr<std::unique_ptr<S3Storage>> Create(
      ClientOptions client_options, S3StorageOptions options = {},
      RequestObserver observer = nullptr);
  // A storage over `client`, shared with the caller (tests, tools that
  // count requests). REQUIRES: client != null.
  S3Storage(std::shared_ptr<S3Client> client, S3StorageOptions options);

  S3Client* client() const { return client_.get(); }
  const S3StorageOptions& options() const { return options_; }

  // Storage.
  StorageTraits traits(const std::string& path) const override;
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
  absl::Status CreateExclusive(const std::string& path,
                               absl::string_view data) override;
  absl::Status ReplaceFile(const std::string& path,
                           absl::string_view data) override;

 private:
  // Whether anything is under "key/" (key empty: the bucket exists).
  absl::StatusOr<bool> HasChildren(const std::string& bucket,
                                   const std::string& key);
  // Aborts the uploads in progress for exactly `key`; how many.
  absl::StatusOr<int> AbortUploadsOf(const std::string& bucket,
                                     const std::string& key);

  const std::shared_ptr<S3Client> client_;
  const S3StorageOptions options_;
};

}  // namespace ckpt::s3

#endif  // CKPT_S3_S3_STORAGE_H_

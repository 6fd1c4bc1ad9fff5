// Writes one S3 object from positioned writes, as a shard file is written:
// bytes arrive in any order from several threads; each part (a fixed-size
// slice of the object) goes up as soon as every byte of it has arrived, in
// parallel with the next ones, and the object appears only at Close, whole
// (CompleteMultipartUpload, or one PutObject when it fits in one part).
// Nothing is ever visible under the key before Close succeeds; a failed or
// abandoned writer aborts its multipart upload.
//
// Memory: a part is buffered from its first byte until it is complete, then
// until its upload ends; at most `upload_threads` complete parts are
// uploading and as many wait: PWrite blocks beyond that. Parts left
// incomplete (bytes never written: holes) stay buffered until Close, which
// uploads them with the holes as zeros. Writers that fill parts one after
// another (a shard's payloads in offset order, padding included) keep
// about (2 * upload_threads + writing threads) parts in memory.
#ifndef CKPT_S3_S3_OBJECT_WRITER_H_
#define CKPT_S3_S3_OBJECT_WRITER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "s3/s3_client.h"
#include "util/mutex.h"

namespace ckpt::s3 {

struct ObjectWriterOptions {
  // Bytes per part, all but the last: >= 5 MiB (S3's minimum), and the
  // object may have at most 10000 parts.
  uint64_t part_size = uint64_t{16} << 20;
  int upload_threads = 4;  // parts uploading at once, >= 1
  // Commit only if no object has the key (If-None-Match: *): Close fails
  // with AlreadyExists otherwise, and nothing of this writer remains.
  bool if_none_match = false;
};

inline constexpr uint64_t kMinPartSize = uint64_t{5} << 20;
inline constexpr int kMaxParts = 10000;

class ObjectWriter {
 public:
  // `client` must outlive the writer. InvalidArgument on bad options.
  static absl::StatusOr<std::unique_ptr<ObjectWriter>> Create(
      S3Client* client, std::string bucket, std::string key,
      const ObjectWriterOptions& options = {});
  // Aborts unless Close succeeded (errors ignored).
  ~ObjectWriter();
  ObjectWriter(const ObjectWriter&) = delete;
  ObjectWriter& operator=(const ObjectWriter&) = delete;

  // Writes `data` at `offset`. Thread-safe; overlapping writes into a part
  // not yet uploaded leave the later bytes. FailedPrecondition for bytes of
  // a part already uploaded (or after Close/Abort); after an upload failed,
  // its error (the writer is then dead: Close aborts).
  [[nodiscard]] absl::Status PWrite(uint64_t offset, absl::string_view data);

  // Uploads what is left and commits the object, of size = the end of the
  // furthest write. On error nothing is committed and the upload is
  // aborted. REQUIRES: no PWrite in progress. Closing twice is
  // FailedPrecondition.
  [[nodiscard]] absl::Status Close();

  // Stops, and aborts the multipart upload if one was started. Safe to
  // call more than once; not concurrently with PWrite or Close.
  [[nodiscard]] absl::Status Abort();

  // After Close: how the object went up. 0 parts: one PutObject.
  int parts_uploaded() const;
  uint64_t size() const;

 private:
  struct Part {
    std::string data;  // part_size bytes, zeros where nothing was written
    std::map<uint64_t, uint64_t> covered;  // [begin, end) in the part, merged
    uint64_t covered_bytes = 0;
    int writers = 0;  // PWrites copying into `data` right now
  };
  struct Upload {
    int index;  // part number - 1
    std::string data;
  };

  ObjectWriter(S3Client* client, std::string bucket, std::string key,
               const ObjectWriterOptions& options);
  std::string Where() const;
  // Hands part `index` to the upload threads (starting them the first
  // time). REQUIRES: mu_ held.
  void Enqueue(int index, std::string data) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UploadLoop();
  // Waits for the upload threads to finish what they have and joins them.
  void StopUploads();
  // Close's phases: takes the whole object when it fits one PUT (true),
  // else hands every part not yet handed off to the uploads and waits for
  // them; then the one PUT, or the multipart upload's completion.
  bool TakeWholeObject(std::string* whole) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushParts() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PutWholeObject(const std::string& whole);
  absl::Status CompleteUpload();
  absl::Status Fail(absl::Status s);

  S3Client* const client_;
  const std::string bucket_, key_;
  const ObjectWriterOptions options_;

  mutable Mutex mu_;
  CondVar changed_;
  std::map<int, Part> buffering_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> handed_off_ ABSL_GUARDED_BY(mu_);  // by part index
  std::deque<Upload> queue_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // queued or uploading
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool creating_upload_ ABSL_GUARDED_BY(mu_) = false;
  std::string upload_id_ ABSL_GUARDED_BY(mu_);
  std::vector<CompletedPart> completed_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  uint64_t end_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool committed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::s3

#endif  // CKPT_S3_S3_OBJECT_WRITER_H_

// An S3 client: the object operations a checkpoint store needs, signed
// (s3_sigv4.h), retried (s3_retry.h) and counted, over HTTP through
// libcurl (s3_http.h). Internal to ckpt: the public surface is the s3://
// root that a Storage over this client will accept (README.md here says
// what comes next).
//
// Errors: every failure names the object (s3://bucket/key), the operation,
// the HTTP status and S3's error code and message when there was a
// response, and the number of attempts. 403 is PermissionDenied, 404
// NotFound, neither retried; 5xx, SlowDown, timeouts, resets and short
// bodies are retried by the policy and end as Unavailable (or
// DeadlineExceeded) when it gives up. No message contains the secret key or
// the session token.
//
// Thread-safe: any number of threads may call any method at once; at most
// ClientOptions::max_connections requests are in flight.
#ifndef CKPT_S3_S3_CLIENT_H_
#define CKPT_S3_S3_CLIENT_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "s3/s3_config.h"
#include "s3/s3_http.h"

namespace ckpt::s3 {

// The S3 operations, for the counters and the request log.
enum class S3Op {
  kGetObject,
  kHeadObject,
  kPutObject,
  kDeleteObject,
  kDeleteObjects,
  kListObjects,
  kCreateMultipartUpload,
  kUploadPart,
  kCompleteMultipartUpload,
  kAbortMultipartUpload,
  kListMultipartUploads,
  kCreateBucket,
  kDeleteBucket,
};
inline constexpr int kNumS3Ops = 13;
absl::string_view S3OpName(S3Op op);  // "GetObject", ...

// What a client sent and received since it was made. Every attempt is a
// request (retries included); bytes are HTTP bodies (object data, XML),
// headers apart. A snapshot: plain numbers, subtract two to measure a
// phase.
struct S3Counters {
  uint64_t requests = 0;         // attempts that reached the transport
  uint64_t retries = 0;          // attempts after the first of a request
  uint64_t failed_attempts = 0;  // transport failures and non-2xx answers
  uint64_t bytes_sent = 0;       // request bodies
  uint64_t bytes_received = 0;   // response bodies
  uint64_t header_bytes_received = 0;
  std::array<uint64_t, kNumS3Ops> requests_by_op = {};

  S3Counters operator-(const S3Counters& earlier) const;
};

// One attempt, as given to ClientOptions' observer (RequestObserver).
struct RequestRecord {
  S3Op op;
  absl::string_view bucket;
  absl::string_view key;
  int attempt = 1;       // 1 for the first
  long http_status = 0;  // 0: no response (transport failure)
  uint64_t range_offset = 0, range_length = 0;  // ranged GETs; else 0
  uint64_t bytes_sent = 0, bytes_received = 0;
  absl::Duration duration;
};
// Called after each attempt on the thread that made it; must be
// thread-safe and must not call the client.
using RequestObserver = std::function<void(const RequestRecord&)>;

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // as the server gives it, quotes included
};

struct ListResult {
  std::vector<ObjectInfo> objects;           // sorted by key (S3's order)
  std::vector<std::string> common_prefixes;  // with a delimiter
};

struct MultipartUpload {
  std::string key;
  std::string upload_id;
};

struct CompletedPart {
  int part_number = 0;  // 1..10000
  std::string etag;
};

struct PutOptions {
  // If-None-Match: *: the write succeeds only if no object has this key;
  // otherwise AlreadyExists (HTTP 412) and nothing is written.
  bool if_none_match = false;
};

class S3Client {
 public:
  // InvalidArgument on bad options (endpoint, region, unsigned payload over
  // http, ...).
  static absl::StatusOr<std::unique_ptr<S3Client>> Create(
      ClientOptions options, RequestObserver observer = nullptr);

  // Writes a whole object. With options.if_none_match, AlreadyExists if the
  // key exists.
  [[nodiscard]] absl::Status PutObject(const std::string& bucket,
                                       const std::string& key,
                                       absl::string_view data,
                                       const PutOptions& options = {});
  // The whole object. NotFound if it does not exist.
  [[nodiscard]] absl::StatusOr<std::string> GetObject(const std::string& bucket,
                                                      const std::string& key);
  // Exactly bytes [offset, offset + length) into dst (which has room for
  // them), or an error: OutOfRange if the object ends before offset +
  // length. REQUIRES: length > 0.
  [[nodiscard]] absl::Status GetRange(const std::string& bucket,
                                      const std::string& key, uint64_t offset,
                                      uint64_t length, char* dst);
  // Size and ETag. NotFound if it does not exist.
  [[nodiscard]] absl::StatusOr<ObjectInfo> HeadObject(const std::string& bucket,
                                                      const std::string& key);
  // OK whether or not the object existed.
  [[nodiscard]] absl::Status DeleteObject(const std::string& bucket,
                                          const std::string& key);
  // Deletes `keys` in batches of 1000 (one request each). An error names
  // the keys S3 could not delete (and its code for each).
  [[nodiscard]] absl::Status DeleteObjects(
      const std::string& bucket, const std::vector<std::string>& keys);
  // Every object under `prefix` (ListObjectsV2, following continuation
  // tokens; `page_size` keys per request, at most 1000). With a delimiter,
  // keys holding it after the prefix are rolled up into common_prefixes.
  // `max_pages` > 0 stops after that many requests (whether anything is
  // under a prefix: page_size 1, max_pages 1).
  [[nodiscard]] absl::StatusOr<ListResult> ListObjects(
      const std::string& bucket, const std::string& prefix,
      const std::string& delimiter = "", int page_size = 1000,
      int max_pages = 0);

  // Multipart uploads. Parts are numbered 1..10000; all but the last must
  // have at least 5 MiB (S3's rule). An upload that is neither completed
  // nor aborted keeps its parts (and their cost) on the server:
  // ListMultipartUploads finds such leftovers.
  [[nodiscard]] absl::StatusOr<std::string> CreateMultipartUpload(
      const std::string& bucket, const std::string& key);
  // Returns the part's ETag.
  [[nodiscard]] absl::StatusOr<std::string> UploadPart(
      const std::string& bucket, const std::string& key,
      const std::string& upload_id, int part_number, absl::string_view data);
  // `parts` in ascending part_number. With options.if_none_match,
  // AlreadyExists if the key exists (the upload is left to abort).
  [[nodiscard]] absl::Status CompleteMultipartUpload(
      const std::string& bucket, const std::string& key,
      const std::string& upload_id, const std::vector<CompletedPart>& parts,
      const PutOptions& options = {});
  // OK if the upload is already gone (NoSuchUpload).
  [[nodiscard]] absl::Status AbortMultipartUpload(const std::string& bucket,
                                                  const std::string& key,
                                                  const std::string& upload_id);
  // The uploads in progress for keys under `prefix`.
  [[nodiscard]] absl::StatusOr<std::vector<MultipartUpload>>
  ListMultipartUploads(const std::string& bucket, const std::string& prefix);

  // Buckets: for tests and tools. CreateBucket is OK if this account
  // already owns the bucket.
  [[nodiscard]] absl::Status CreateBucket(const std::string& bucket);
  [[nodiscard]] absl::Status DeleteBucket(const std::string& bucket);

  S3Counters counters() const;
  const ClientOptions& options() const { return options_; }

 private:
  struct Call;  // one request and its retries (s3_client.cc)

  S3Client(ClientOptions options, Endpoint endpoint,
           std::unique_ptr<HttpTransport> http, RequestObserver observer);
  // Sends `call` until it succeeds, fails for good, or the retry policy
  // gives up.
  absl::Status Execute(Call& call, HttpResponse* response);
  absl::Status AttemptOnce(Call& call, int attempt, HttpResponse* response,
                           bool* retryable);
  // The request of `call`: its URL (path style or virtual-hosted), headers
  // and, unless anonymous, its SigV4 signature.
  HttpRequest BuildRequest(const Call& call) const;
  void Sign(const Call& call, const std::string& path, HttpRequest* req) const;
  // An attempt's status from the transport's and the response's (an S3
  // error document in a 200 where the call allows it).
  static absl::Status StatusOf(const Call& call, const absl::Status& transport,
                               const HttpResponse& response, bool* retryable);
  void Count(const Call& call, int attempt, const HttpResponse& response,
             bool failed, absl::Duration took);

  const ClientOptions options_;
  const Endpoint endpoint_;
  const bool virtual_hosted_;
  const std::unique_ptr<HttpTransport> http_;
  const RequestObserver observer_;

  std::atomic<uint64_t> requests_{0}, retries_{0}, failed_attempts_{0},
      bytes_sent_{0}, bytes_received_{0}, header_bytes_received_{0};
  std::array<std::atomic<uint64_t>, kNumS3Ops> by_op_{};
};

}  // namespace ckpt::s3

#endif  // CKPT_S3_S3_CLIENT_H_

// One HTTP request at a time per caller, over libcurl: the transport under
// S3Client. It sends what it is given and reports what came back; it does
// not sign, retry or interpret S3 errors.
//
// Never a silent short body: a response whose body is shorter than its
// Content-Length, or longer than the caller's buffer, fails the attempt.
// libcurl is initialised once per process (curl_global_init, on first
// use); no signals are used (CURLOPT_NOSIGNAL), so requests may run on any
// thread.
#ifndef CKPT_S3_S3_HTTP_H_
#define CKPT_S3_S3_HTTP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "s3/s3_sigv4.h"
#include "util/mutex.h"

namespace ckpt::s3 {

struct HttpRequest {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string url;     // encoded, as sent
  KeyValues headers;   // sent as given (Host included)
  // The body; not owned, must outlive Perform. Sent in full on each call.
  absl::string_view body;
  // Where a successful (2xx) response body goes: into [sink, sink +
  // sink_capacity) when `sink` is set (a longer body fails the attempt),
  // else into HttpResponse::body. Error bodies always go to
  // HttpResponse::body, kept up to 64 KiB.
  char* sink = nullptr;
  size_t sink_capacity = 0;
};

struct HttpResponse {
  long status = 0;
  KeyValues headers;  // names lower-cased, in arrival order
  std::string body;
  uint64_t body_bytes = 0;  // received, into `sink` or `body`
  uint64_t bytes_sent = 0;  // request body bytes sent
  uint64_t header_bytes_received = 0;

  // The value of the last header named `name` (lower case); empty if none.
  std::string Header(absl::string_view name) const;
};

class HttpTransport {
 public:
  struct Options {
    int max_connections = 16;
    absl::Duration connect_timeout = absl::Seconds(10);
    absl::Duration request_timeout = absl::ZeroDuration();  // zero: none
    uint64_t low_speed_bytes = 1024;
    absl::Duration low_speed_time = absl::Seconds(30);
  };

  // InvalidArgument on bad options; Internal if libcurl cannot start.
  static absl::StatusOr<std::unique_ptr<HttpTransport>> Create(
      const Options& options);
  ~HttpTransport();

  // Performs `request`, waiting while max_connections requests of this
  // transport are in flight. OK when an HTTP response arrived whole,
  // whatever its status (in `response`). Otherwise the transfer failed: the
  // status says how (Unavailable for connection failures, resets and short
  // bodies, DeadlineExceeded for timeouts, InvalidArgument for a URL
  // libcurl refuses, Internal for the rest) and `retryable` whether
  // another attempt may succeed; `response` then holds what arrived.
  // Thread-safe.
  [[nodiscard]] absl::Status Perform(const HttpRequest& request,
                                     HttpResponse* response, bool* retryable);

 private:
  explicit HttpTransport(const Options& options) : options_(options) {}
  void* AcquireHandle();
  void ReleaseHandle(void* handle);

  const Options options_;
  Mutex mu_;
  CondVar released_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<void*> idle_ ABSL_GUARDED_BY(mu_);  // CURL* kept for reuse
};

}  // namespace ckpt::s3

#endif  // CKPT_S3_S3_HTTP_H_

#include "s3/s3_http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ckpt::s3 {
namespace {

constexpr size_t kMaxErrorBody = 64 << 10;

// What the callbacks of one transfer share.
struct Transfer {
  const HttpRequest* request;
  HttpResponse* response;
  size_t read_pos = 0;
  bool overflow = false;  // a 2xx body did not fit the sink
};

bool Success(long status) { return status >= 200 && status < 300; }

size_t ReadBody(char* buf, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const absl::string_view body = t->request->body;
  const size_t len = std::min(size * n, body.size() - t->read_pos);
  std::memcpy(buf, body.data() + t->read_pos, len);
  t->read_pos += len;
  t->response->bytes_sent += len;
  return len;
}

// libcurl rewinds the body when it must send it again on one call.
int SeekBody(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 ||
      static_cast<size_t>(offset) > t->request->body.size()) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  t->read_pos = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

size_t OnHeader(char* buf, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t len = size * n;
  t->response->header_bytes_received += len;
  absl::string_view line(buf, len);
  line = absl::StripTrailingAsciiWhitespace(line);
  if (absl::StartsWith(line, "HTTP/")) {
    // A new response (after "100 Continue", say): start over.
    std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::MaxSplits(' ', 2));
    long status = 0;
    if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &status)) {
      t->response->status = status;
    }
    t->response->headers.clear();
    return len;
  }
  const size_t colon = line.find(':');
  if (colon != absl::string_view::npos) {
    t->response->headers.emplace_back(
        absl::AsciiStrToLower(line.substr(0, colon)),
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1))));
  }
  return len;
}

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  HttpResponse* r = t->response;
  const size_t len = size * n;
  if (Success(r->status) && t->request->sink != nullptr) {
    if (r->body_bytes + len > t->request->sink_capacity) {
      t->overflow = true;
      return 0;  // fails the transfer with CURLE_WRITE_ERROR
    }
    std::memcpy(t->request->sink + r->body_bytes, data, len);
  } else if (Success(r->status)) {
    r->body.append(data, len);
  } else if (r->body.size() < kMaxErrorBody) {
    r->body.append(data, std::min(len, kMaxErrorBody - r->body.size()));
  }
  r->body_bytes += len;
  return len;
}

// The status for a failed transfer, and whether it is worth another try.
absl::Status TransferError(CURLcode rc, const char* detail, bool* retryable) {
  std::string what = curl_easy_strerror(rc);
  if (detail != nullptr && detail[0] != '\0') {
    what = absl::StrCat(what, ": ", absl::StripTrailingAsciiWhitespace(detail));
  }
  switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
      *retryable = true;
      return absl::DeadlineExceededError(what);
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
      *retryable = true;
      return absl::UnavailableError(what);
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
      *retryable = false;
      return absl::InvalidArgumentError(what);
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
      *retryable = false;
      return absl::UnavailableError(what);
    default:
      *retryable = false;
      return absl::InternalError(what);
  }
}

// The request's URL, the connection's limits and the error buffer.
void SetConnectionOptions(CURL* curl, const HttpTransport::Options& options,
                          char* errbuf, curl_slist* headers) {
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  // Keys are sent as they are: "a/./b" must not become "a/b".
  curl_easy_setopt(curl, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "ckpt-s3");
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(
      curl, CURLOPT_CONNECTTIMEOUT_MS,
      static_cast<long>(absl::ToInt64Milliseconds(options.connect_timeout)));
  if (options.request_timeout > absl::ZeroDuration()) {
    curl_easy_setopt(
        curl, CURLOPT_TIMEOUT_MS,
        static_cast<long>(absl::ToInt64Milliseconds(options.request_timeout)));
  }
  if (options.low_speed_time > absl::ZeroDuration()) {
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT,
                     static_cast<long>(options.low_speed_bytes));
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                     static_cast<long>(std::max<int64_t>(
                         1, absl::ToInt64Seconds(options.low_speed_time))));
  }
}

// The URL, the method and where the headers and the bodies go.
void SetTransferOptions(CURL* curl, const HttpRequest& request, Transfer* t) {
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, t);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, t);
  if (request.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (request.method == "PUT" || request.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE,
                     static_cast<curl_off_t>(request.body.size()));
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, ReadBody);
    curl_easy_setopt(curl, CURLOPT_READDATA, t);
    curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, SeekBody);
    curl_easy_setopt(curl, CURLOPT_SEEKDATA, t);
    if (request.method == "POST") {
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "POST");
    }
  } else if (request.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
}

// What a finished transfer comes to: its own error, a body longer than
// asked for, or one shorter than its Content-Length; OK otherwise (the
// HTTP status is the caller's to judge).
absl::Status OutcomeOf(CURLcode rc, const char* errbuf, const Transfer& t,
                       bool* retryable) {
  const HttpRequest& request = *t.request;
  const HttpResponse& response = *t.response;
  if (t.overflow) {
    return absl::DataLossError(
        absl::StrCat("the response body is longer than the ",
                     request.sink_capacity, " bytes asked for"));
  }
  if (rc != CURLE_OK) return TransferError(rc, errbuf, retryable);
  if (request.method == "HEAD" || response.status == 204 ||
      response.status == 304) {
    return absl::OkStatus();
  }
  // libcurl stops at Content-Length and reports a short body itself
  // (CURLE_PARTIAL_FILE); this check does not depend on it.
  const std::string cl = response.Header("content-length");
  uint64_t expected = 0;
  if (!cl.empty() && absl::SimpleAtoi(cl, &expected) &&
      expected != response.body_bytes) {
    *retryable = true;
    return absl::UnavailableError(
        absl::StrCat("the response body ended after ", response.body_bytes,
                     " of ", expected, " bytes (Content-Length)"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string HttpResponse::Header(absl::string_view name) const {
  std::string value;
  for (const auto& [k, v] : headers) {
    if (k == name) value = v;
  }
  return value;
}

absl::StatusOr<std::unique_ptr<HttpTransport>> HttpTransport::Create(
    const Options& options) {
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_connections must be >= 1, not ", options.max_connections));
  }
  // Once per process, before any handle exists; thread-safe through the
  // static's initialisation.
  static const CURLcode init = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (init != CURLE_OK) {
    return absl::InternalError(
        absl::StrCat("curl_global_init: ", curl_easy_strerror(init)));
  }
  return std::unique_ptr<HttpTransport>(new HttpTransport(options));
}

HttpTransport::~HttpTransport() {
  MutexLock l(&mu_);
  for (void* h : idle_) curl_easy_cleanup(static_cast<CURL*>(h));
}

void* HttpTransport::AcquireHandle() {
  {
    MutexLock l(&mu_);
    while (in_flight_ >= options_.max_connections) released_.Wait(&mu_);
    ++in_flight_;
    if (!idle_.empty()) {
      void* h = idle_.back();
      idle_.pop_back();
      return h;
    }
  }
  return curl_easy_init();
}

void HttpTransport::ReleaseHandle(void* handle) {
  MutexLock l(&mu_);
  --in_flight_;
  if (handle != nullptr) idle_.push_back(handle);
  released_.Signal();
}

absl::Status HttpTransport::Perform(const HttpRequest& request,
                                    HttpResponse* response, bool* retryable) {
  *response = HttpResponse{};
  *retryable = false;
  CURL* curl = static_cast<CURL*>(AcquireHandle());
  if (curl == nullptr) {
    ReleaseHandle(nullptr);
    return absl::InternalError("curl_easy_init failed");
  }
  // Reset keeps the handle's open connections for reuse.
  curl_easy_reset(curl);
  Transfer t{&request, response};
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_slist* headers = nullptr;
  for (const auto& [k, v] : request.headers) {
    headers = curl_slist_append(headers, absl::StrCat(k, ": ", v).c_str());
  }
  // No "Expect: 100-continue" round trip before bodies.
  headers = curl_slist_append(headers, "Expect:");
  SetConnectionOptions(curl, options_, errbuf, headers);
  SetTransferOptions(curl, request, &t);

  const CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  absl::Status status = OutcomeOf(rc, errbuf, t, retryable);
  // A handle whose transfer failed midway may hold a broken connection;
  // libcurl closes such connections itself, so the handle is reused.
  ReleaseHandle(curl);
  return status;
}

}  // namespace ckpt::s3

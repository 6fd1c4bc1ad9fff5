#include "s3/s3_client.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "ckpt/format/status_macros.h"
#include "s3/s3_xml.h"

namespace ckpt::s3 {

// One S3 request: what is sent, and what the messages call it.
struct S3Client::Call {
  S3Op op;
  std::string method;
  const std::string* bucket;
  const std::string* key = nullptr;  // null: a bucket-level request
  KeyValues query;
  KeyValues headers;  // beyond host, date, payload hash and token
  absl::string_view body;
  std::string payload_hash;
  char* sink = nullptr;
  size_t sink_capacity = 0;
  uint64_t range_offset = 0, range_length = 0;
  // CompleteMultipartUpload may answer 200 with an <Error> body.
  bool error_in_ok_body = false;
  int attempts = 0;  // made so far

  std::string Where() const {
    std::string w = absl::StrCat(S3OpName(op), " s3://", *bucket);
    if (key != nullptr) absl::StrAppend(&w, "/", *key);
    if (range_length > 0) {
      absl::StrAppend(&w, " (bytes ", range_offset, "-",
                      range_offset + range_length - 1, ")");
    }
    return w;
  }
};

namespace {

absl::StatusCode CodeForHttp(long status) {
  switch (status) {
    case 400:
      return absl::StatusCode::kInvalidArgument;
    case 401:
      return absl::StatusCode::kUnauthenticated;
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 409:
      return absl::StatusCode::kAborted;
    case 412:
      return absl::StatusCode::kFailedPrecondition;
    case 416:
      return absl::StatusCode::kOutOfRange;
    case 429:
      return absl::StatusCode::kUnavailable;
    default:
      if (status >= 500) return absl::StatusCode::kUnavailable;
      if (status >= 300 && status < 400) {
        return absl::StatusCode::kFailedPrecondition;  // a redirect: region
      }
      return absl::StatusCode::kUnknown;
  }
}

// S3's error code and message from an <Error> body (empty for HEAD).
struct S3Error {
  std::string code, message, request_id;
};
S3Error ParseError(const HttpResponse& r) {
  S3Error e;
  e.request_id = r.Header("x-amz-request-id");
  auto doc = ParseXml(r.body);
  if (doc.ok() && doc->name == "Error") {
    e.code = doc->ChildText("Code");
    e.message = doc->ChildText("Message");
    if (e.request_id.empty()) e.request_id = doc->ChildText("RequestId");
  }
  return e;
}

std::string Describe(long status, const S3Error& e) {
  std::string s = absl::StrCat("HTTP ", status);
  if (!e.code.empty()) absl::StrAppend(&s, " ", e.code);
  if (!e.message.empty()) absl::StrAppend(&s, ": ", e.message);
  if (!e.request_id.empty()) {
    absl::StrAppend(&s, " (request id ", e.request_id, ")");
  }
  return s;
}

double Uniform01() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
}

absl::Status WithMessage(const absl::Status& s, absl::string_view message) {
  return absl::Status(s.code(), message);
}

// Parses "bytes a-b/total" (total may be "*").
bool ParseContentRange(absl::string_view v, uint64_t* a, uint64_t* b,
                       uint64_t* total) {
  if (!absl::ConsumePrefix(&v, "bytes ")) return false;
  const size_t dash = v.find('-'), slash = v.find('/');
  if (dash == absl::string_view::npos || slash == absl::string_view::npos ||
      dash > slash) {
    return false;
  }
  *total = 0;
  return absl::SimpleAtoi(v.substr(0, dash), a) &&
         absl::SimpleAtoi(v.substr(dash + 1, slash - dash - 1), b) &&
         (v.substr(slash + 1) == "*" ||
          absl::SimpleAtoi(v.substr(slash + 1), total));
}

// The ETag S3 gives an object PUT whole (MD5 of the body), or completed
// from these parts (MD5 of the parts' MD5s, "-", the count), quoted. Used
// to tell whether a conditional write that failed on a retry was in fact
// ours, written by an earlier attempt whose answer was lost.
std::string HexToBytes(absl::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    int v = 0;
    if (!absl::SimpleHexAtoi(hex.substr(i, 2), &v)) return "";
    out += static_cast<char>(v);
  }
  return out;
}
// "HTTP 412 ..." from a message "PutObject s3://b/k: HTTP 412 ...".
absl::string_view FromHttp(absl::string_view message) {
  const size_t at = message.find("HTTP ");
  return at == absl::string_view::npos ? message : message.substr(at);
}
std::string Unquote(absl::string_view etag) {
  absl::ConsumePrefix(&etag, "\"");
  absl::ConsumeSuffix(&etag, "\"");
  return std::string(etag);
}

}  // namespace

absl::string_view S3OpName(S3Op op) {
  switch (op) {
    case S3Op::kGetObject:
      return "GetObject";
    case S3Op::kHeadObject:
      return "HeadObject";
    case S3Op::kPutObject:
      return "PutObject";
    case S3Op::kDeleteObject:
      return "DeleteObject";
    case S3Op::kDeleteObjects:
      return "DeleteObjects";
    case S3Op::kListObjects:
      return "ListObjectsV2";
    case S3Op::kCreateMultipartUpload:
      return "CreateMultipartUpload";
    case S3Op::kUploadPart:
      return "UploadPart";
    case S3Op::kCompleteMultipartUpload:
      return "CompleteMultipartUpload";
    case S3Op::kAbortMultipartUpload:
      return "AbortMultipartUpload";
    case S3Op::kListMultipartUploads:
      return "ListMultipartUploads";
    case S3Op::kCreateBucket:
      return "CreateBucket";
    case S3Op::kDeleteBucket:
      return "DeleteBucket";
  }
  return "?";
}

S3Counters S3Counters::operator-(const S3Counters& e) const {
  S3Counters d;
  d.requests = requests - e.requests;
  d.retries = retries - e.retries;
  d.failed_attempts = failed_attempts - e.failed_attempts;
  d.bytes_sent = bytes_sent - e.bytes_sent;
  d.bytes_received = bytes_received - e.bytes_received;
  d.header_bytes_received = header_bytes_received - e.header_bytes_received;
  for (int i = 0; i < kNumS3Ops; ++i) {
    d.requests_by_op[i] = requests_by_op[i] - e.requests_by_op[i];
  }
  return d;
}

absl::StatusOr<std::unique_ptr<S3Client>> S3Client::Create(
    ClientOptions options, RequestObserver observer) {
  if (options.endpoint.empty()) {
    options.endpoint =
        absl::StrCat("https://s3.", options.region, ".amazonaws.com");
  }
  CKPT_ASSIGN_OR_RETURN(Endpoint endpoint, ParseEndpoint(options.endpoint));
  if (options.region.empty()) {
    return absl::InvalidArgumentError("the S3 region is empty");
  }
  if (!options.sign_payload && !endpoint.https) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsigned payloads need https; the endpoint is ", options.endpoint));
  }
  if (options.retry.max_attempts < 1) {
    return absl::InvalidArgumentError("retry.max_attempts must be >= 1");
  }
  HttpTransport::Options ho;
  ho.max_connections = options.max_connections;
  ho.connect_timeout = options.connect_timeout;
  ho.request_timeout = options.request_timeout;
  ho.low_speed_bytes = options.low_speed_bytes;
  ho.low_speed_time = options.low_speed_time;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<HttpTransport> http,
                        HttpTransport::Create(ho));
  return std::unique_ptr<S3Client>(
      new S3Client(std::move(options), std::move(endpoint), std::move(http),
                   std::move(observer)));
}

S3Client::S3Client(ClientOptions options, Endpoint endpoint,
                   std::unique_ptr<HttpTransport> http,
                   RequestObserver observer)
    : options_(std::move(options)),
      endpoint_(std::move(endpoint)),
      virtual_hosted_(options_.addressing == Addressing::kVirtual ||
                      (options_.addressing == Addressing::kAuto &&
                       absl::EndsWith(endpoint_.host, ".amazonaws.com"))),
      http_(std::move(http)),
      observer_(std::move(observer)) {}

S3Counters S3Client::counters() const {
  S3Counters c;
  c.requests = requests_.load();
  c.retries = retries_.load();
  c.failed_attempts = failed_attempts_.load();
  c.bytes_sent = bytes_sent_.load();
  c.bytes_received = bytes_received_.load();
  c.header_bytes_received = header_bytes_received_.load();
  for (int i = 0; i < kNumS3Ops; ++i) c.requests_by_op[i] = by_op_[i].load();
  return c;
}

void S3Client::Count(const Call& call, int attempt,
                     const HttpResponse& response, bool failed,
                     absl::Duration took) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  if (attempt > 1) retries_.fetch_add(1, std::memory_order_relaxed);
  if (failed) failed_attempts_.fetch_add(1, std::memory_order_relaxed);
  bytes_sent_.fetch_add(response.bytes_sent, std::memory_order_relaxed);
  bytes_received_.fetch_add(response.body_bytes, std::memory_order_relaxed);
  header_bytes_received_.fetch_add(response.header_bytes_received,
                                   std::memory_order_relaxed);
  by_op_[static_cast<int>(call.op)].fetch_add(1, std::memory_order_relaxed);
  if (observer_) {
    RequestRecord r;
    r.op = call.op;
    r.bucket = *call.bucket;
    if (call.key != nullptr) r.key = *call.key;
    r.attempt = attempt;
    r.http_status = response.status;
    r.range_offset = call.range_offset;
    r.range_length = call.range_length;
    r.bytes_sent = response.bytes_sent;
    r.bytes_received = response.body_bytes;
    r.duration = took;
    observer_(r);
  }
}

HttpRequest S3Client::BuildRequest(const Call& call) const {
  // Where the request goes: path style /bucket/key on the endpoint's host,
  // or /key on bucket.host.
  std::string host = endpoint_.HostHeader();
  std::string path;
  if (virtual_hosted_) {
    host = absl::StrCat(*call.bucket, ".", host);
    path = absl::StrCat("/", call.key != nullptr ? *call.key : "");
  } else {
    path = absl::StrCat("/", *call.bucket);
    if (call.key != nullptr) absl::StrAppend(&path, "/", *call.key);
  }
  HttpRequest req;
  req.method = call.method;
  req.url = absl::StrCat(endpoint_.https ? "https://" : "http://", host,
                         UriEncode(path, /*encode_slash=*/false));
  if (!call.query.empty())
    absl::StrAppend(&req.url, "?", CanonicalQuery(call.query));
  req.body = call.body;
  req.sink = call.sink;
  req.sink_capacity = call.sink_capacity;
  req.headers = call.headers;
  req.headers.emplace_back("host", host);
  if (!options_.credentials.anonymous()) Sign(call, path, &req);
  return req;
}

void S3Client::Sign(const Call& call, const std::string& path,
                    HttpRequest* req) const {
  const std::string date = AmzDate(absl::Now());
  req->headers.emplace_back("x-amz-date", date);
  req->headers.emplace_back("x-amz-content-sha256", call.payload_hash);
  if (!options_.credentials.session_token.empty()) {
    req->headers.emplace_back("x-amz-security-token",
                              options_.credentials.session_token);
  }
  SigningInput in;
  in.method = call.method;
  in.path = path;
  in.query = &call.query;
  in.headers = &req->headers;
  in.payload_hash = call.payload_hash;
  in.amz_date = date;
  in.region = options_.region;
  const SigningResult signed_ = SignV4(in, options_.credentials);
  // Host goes as the Host header; the rest as given, Authorization last.
  req->headers.emplace_back("authorization", signed_.authorization);
}

absl::Status S3Client::StatusOf(const Call& call, const absl::Status& transport,
                                const HttpResponse& response, bool* retryable) {
  if (!transport.ok()) {
    return WithMessage(transport,
                       absl::StrCat(call.Where(), ": ", transport.message()));
  }
  if (response.status < 200 || response.status >= 300) {
    const S3Error e = ParseError(response);
    *retryable = IsRetryableHttp(response.status, e.code);
    // Credentials refused are what they are, whatever the status (400 for
    // a bad session token).
    const bool credentials =
        e.code == "InvalidToken" || e.code == "ExpiredToken" ||
        e.code == "InvalidAccessKeyId" || e.code == "SignatureDoesNotMatch";
    return absl::Status(
        credentials ? absl::StatusCode::kPermissionDenied
                    : CodeForHttp(response.status),
        absl::StrCat(call.Where(), ": ", Describe(response.status, e)));
  }
  if (call.error_in_ok_body && absl::StrContains(response.body, "<Error>")) {
    const S3Error e = ParseError(response);
    if (!e.code.empty()) {
      *retryable = e.code == "InternalError" || e.code == "SlowDown" ||
                   e.code == "ServiceUnavailable";
      return absl::Status(
          *retryable ? absl::StatusCode::kUnavailable
                     : absl::StatusCode::kUnknown,
          absl::StrCat(call.Where(), ": ", Describe(response.status, e)));
    }
  }
  return absl::OkStatus();
}

absl::Status S3Client::AttemptOnce(Call& call, int attempt,
                                   HttpResponse* response, bool* retryable) {
  const HttpRequest req = BuildRequest(call);
  const absl::Time start = absl::Now();
  const absl::Status transport = http_->Perform(req, response, retryable);
  const absl::Status result = StatusOf(call, transport, *response, retryable);
  Count(call, attempt, *response, !result.ok(), absl::Now() - start);
  return result;
}

absl::Status S3Client::Execute(Call& call, HttpResponse* response) {
  if (options_.credentials.anonymous()) {
    call.payload_hash = "";
  } else if (call.payload_hash.empty()) {
    call.payload_hash = options_.sign_payload ? Sha256Hex(call.body)
                                              : std::string(kUnsignedPayload);
  }
  const RetryPolicy& policy = options_.retry;
  const absl::Time start = absl::Now();
  for (int attempt = 1;; ++attempt) {
    bool retryable = false;
    call.attempts = attempt;
    absl::Status s = AttemptOnce(call, attempt, response, &retryable);
    if (s.ok()) return s;
    const absl::Duration elapsed = absl::Now() - start;
    const std::string tries = absl::StrFormat("%d attempt%s in %.2f s", attempt,
                                              attempt == 1 ? "" : "s",
                                              absl::ToDoubleSeconds(elapsed));
    if (!retryable) {
      return attempt == 1
                 ? s
                 : WithMessage(s, absl::StrCat(s.message(), " (", tries, ")"));
    }
    const absl::Duration wait = Backoff(policy, attempt, Uniform01());
    if (attempt >= policy.max_attempts || elapsed + wait > policy.max_total) {
      return WithMessage(
          s, absl::StrCat(s.message(), " (gave up after ", tries, ")"));
    }
    absl::SleepFor(wait);
  }
}

namespace {

// Content-MD5 lets the server check the body when the signature does not
// cover it (UNSIGNED-PAYLOAD); a signed payload hash is checked already.
void AddIntegrityHeader(const ClientOptions& o, absl::string_view body,
                        KeyValues* headers) {
  if (!o.sign_payload) headers->emplace_back("content-md5", Md5Base64(body));
}

}  // namespace

absl::Status S3Client::PutObject(const std::string& bucket,
                                 const std::string& key, absl::string_view data,
                                 const PutOptions& options) {
  Call call{S3Op::kPutObject, "PUT", &bucket, &key};
  call.body = data;
  AddIntegrityHeader(options_, data, &call.headers);
  if (options.if_none_match) call.headers.emplace_back("if-none-match", "*");
  HttpResponse r;
  absl::Status s = Execute(call, &r);
  if (s.ok() || !options.if_none_match || r.status != 412) return s;
  // An earlier send may have written the object and lost the answer: then
  // the object's ETag is the MD5 of our bytes. Not only an earlier attempt
  // of ours: libcurl itself sends a request again, within one attempt,
  // when the reused connection it went out on is closed before any answer
  // (a reset after the server acted), so a refusal on the first attempt
  // may be our own write too.
  auto head = HeadObject(bucket, key);
  if (head.ok() && Unquote(head->etag) == HexLower(Md5(data))) {
    return absl::OkStatus();
  }
  return absl::AlreadyExistsError(absl::StrCat(
      call.Where(), ": the object exists (If-None-Match: * refused, ",
      FromHttp(s.message()), ")"));
}

absl::StatusOr<std::string> S3Client::GetObject(const std::string& bucket,
                                                const std::string& key) {
  Call call{S3Op::kGetObject, "GET", &bucket, &key};
  HttpResponse r;
  CKPT_RETURN_IF_ERROR(Execute(call, &r));
  return std::move(r.body);
}

absl::Status S3Client::GetRange(const std::string& bucket,
                                const std::string& key, uint64_t offset,
                                uint64_t length, char* dst) {
  if (length == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GetObject s3://", bucket, "/", key, ": empty range"));
  }
  Call call{S3Op::kGetObject, "GET", &bucket, &key};
  call.range_offset = offset;
  call.range_length = length;
  call.headers.emplace_back(
      "range", absl::StrCat("bytes=", offset, "-", offset + length - 1));
  call.sink = dst;
  call.sink_capacity = length;
  HttpResponse r;
  absl::Status s = Execute(call, &r);
  if (r.status == 416) {
    uint64_t a, b, total = 0;
    ParseContentRange(r.Header("content-range"), &a, &b, &total);
    return absl::OutOfRangeError(absl::StrCat(
        call.Where(), ": the range starts at or after the end of the object",
        total > 0 ? absl::StrCat(" (", total, " bytes)") : ""));
  }
  CKPT_RETURN_IF_ERROR(s);
  if (r.status == 200) {
    // The server ignored Range and sent the whole object, which fitted.
    if (offset == 0 && r.body_bytes == length) return absl::OkStatus();
    return absl::DataLossError(
        absl::StrCat(call.Where(), ": the server answered 200 with ",
                     r.body_bytes, " bytes instead of the range"));
  }
  uint64_t a = 0, b = 0, total = 0;
  if (!ParseContentRange(r.Header("content-range"), &a, &b, &total) ||
      a != offset || b < a || r.body_bytes != b - a + 1) {
    return absl::DataLossError(absl::StrCat(
        call.Where(), ": answered with Content-Range '",
        r.Header("content-range"), "' and ", r.body_bytes, " bytes"));
  }
  if (b != offset + length - 1) {
    return absl::OutOfRangeError(
        absl::StrCat(call.Where(), ": the object ends at byte ", b + 1,
                     total > 0 ? absl::StrCat(" (", total, " bytes)") : "",
                     ", before the end of the range"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ObjectInfo> S3Client::HeadObject(const std::string& bucket,
                                                const std::string& key) {
  Call call{S3Op::kHeadObject, "HEAD", &bucket, &key};
  HttpResponse r;
  CKPT_RETURN_IF_ERROR(Execute(call, &r));
  ObjectInfo info;
  info.key = key;
  info.etag = r.Header("etag");
  if (!absl::SimpleAtoi(r.Header("content-length"), &info.size)) {
    return absl::DataLossError(
        absl::StrCat(call.Where(), ": no valid Content-Length in the answer"));
  }
  return info;
}

absl::Status S3Client::DeleteObject(const std::string& bucket,
                                    const std::string& key) {
  Call call{S3Op::kDeleteObject, "DELETE", &bucket, &key};
  HttpResponse r;
  absl::Status s = Execute(call, &r);
  if (absl::IsNotFound(s) && ParseError(r).code == "NoSuchKey") {
    return absl::OkStatus();
  }
  return s;
}

absl::Status S3Client::DeleteObjects(const std::string& bucket,
                                     const std::vector<std::string>& keys) {
  constexpr size_t kBatch = 1000;  // S3's limit per request
  std::vector<std::string> failed;
  absl::StatusCode code = absl::StatusCode::kOk;
  for (size_t begin = 0; begin < keys.size(); begin += kBatch) {
    const size_t end = std::min(keys.size(), begin + kBatch);
    std::string body =
        "<Delete xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
        "<Quiet>true</Quiet>";
    for (size_t i = begin; i < end; ++i) {
      absl::StrAppend(&body, "<Object><Key>", XmlEscape(keys[i]),
                      "</Key></Object>");
    }
    body += "</Delete>";
    Call call{S3Op::kDeleteObjects, "POST", &bucket};
    call.query = {{"delete", ""}};
    call.body = body;
    call.headers.emplace_back("content-md5", Md5Base64(body));
    call.headers.emplace_back("content-type", "application/xml");
    HttpResponse r;
    CKPT_RETURN_IF_ERROR(Execute(call, &r));
    CKPT_ASSIGN_OR_RETURN(XmlElement doc, ParseXml(r.body));
    for (const XmlElement* e : doc.Children("Error")) {
      const std::string c = e->ChildText("Code");
      failed.push_back(absl::StrCat(e->ChildText("Key"), " (", c, ": ",
                                    e->ChildText("Message"), ")"));
      code = c == "AccessDenied" ? absl::StatusCode::kPermissionDenied
                                 : absl::StatusCode::kUnavailable;
    }
  }
  if (failed.empty()) return absl::OkStatus();
  std::string msg =
      absl::StrCat("DeleteObjects s3://", bucket, ": ", failed.size(), " of ",
                   keys.size(), " keys not deleted: ");
  for (size_t i = 0; i < failed.size() && i < 5; ++i) {
    absl::StrAppend(&msg, i ? ", " : "", failed[i]);
  }
  if (failed.size() > 5) absl::StrAppend(&msg, ", ...");
  return absl::Status(code, msg);
}

absl::StatusOr<ListResult> S3Client::ListObjects(const std::string& bucket,
                                                 const std::string& prefix,
                                                 const std::string& delimiter,
                                                 int page_size, int max_pages) {
  if (page_size < 1 || page_size > 1000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ListObjectsV2 page size ", page_size, " is not in 1..1000"));
  }
  ListResult out;
  std::string token;
  int pages = 0;
  do {
    Call call{S3Op::kListObjects, "GET", &bucket};
    call.query = {{"list-type", "2"},
                  {"prefix", prefix},
                  {"max-keys", absl::StrCat(page_size)}};
    if (!delimiter.empty()) call.query.emplace_back("delimiter", delimiter);
    if (!token.empty()) call.query.emplace_back("continuation-token", token);
    HttpResponse r;
    CKPT_RETURN_IF_ERROR(Execute(call, &r));
    auto doc = ParseXml(r.body);
    if (!doc.ok() || doc->name != "ListBucketResult") {
      return absl::DataLossError(absl::StrCat(
          call.Where(), ": the answer is not a ListBucketResult",
          doc.ok() ? "" : absl::StrCat(" (", doc.status().message(), ")")));
    }
    for (const XmlElement* c : doc->Children("Contents")) {
      ObjectInfo o;
      o.key = c->ChildText("Key");
      o.etag = c->ChildText("ETag");
      if (!absl::SimpleAtoi(c->ChildText("Size"), &o.size)) {
        return absl::DataLossError(absl::StrCat(
            call.Where(), ": no valid Size for key '", o.key, "'"));
      }
      out.objects.push_back(std::move(o));
    }
    for (const XmlElement* p : doc->Children("CommonPrefixes")) {
      out.common_prefixes.push_back(p->ChildText("Prefix"));
    }
    token.clear();
    if (++pages == max_pages) break;
    if (doc->ChildText("IsTruncated") == "true") {
      token = doc->ChildText("NextContinuationToken");
      if (token.empty()) {
        return absl::DataLossError(
            absl::StrCat(call.Where(),
                         ": a truncated listing without a continuation token"));
      }
    }
  } while (!token.empty());
  return out;
}

absl::StatusOr<std::string> S3Client::CreateMultipartUpload(
    const std::string& bucket, const std::string& key) {
  Call call{S3Op::kCreateMultipartUpload, "POST", &bucket, &key};
  call.query = {{"uploads", ""}};
  HttpResponse r;
  CKPT_RETURN_IF_ERROR(Execute(call, &r));
  auto doc = ParseXml(r.body);
  std::string id;
  if (doc.ok() && doc->name == "InitiateMultipartUploadResult") {
    id = doc->ChildText("UploadId");
  }
  if (id.empty()) {
    return absl::DataLossError(
        absl::StrCat(call.Where(), ": no UploadId in the answer"));
  }
  return id;
}

absl::StatusOr<std::string> S3Client::UploadPart(const std::string& bucket,
                                                 const std::string& key,
                                                 const std::string& upload_id,
                                                 int part_number,
                                                 absl::string_view data) {
  if (part_number < 1 || part_number > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("UploadPart s3://", bucket, "/", key, ": part number ",
                     part_number, " is not in 1..10000"));
  }
  Call call{S3Op::kUploadPart, "PUT", &bucket, &key};
  call.query = {{"partNumber", absl::StrCat(part_number)},
                {"uploadId", upload_id}};
  call.body = data;
  AddIntegrityHeader(options_, data, &call.headers);
  HttpResponse r;
  CKPT_RETURN_IF_ERROR(Execute(call, &r));
  std::string etag = r.Header("etag");
  if (etag.empty()) {
    return absl::DataLossError(absl::StrCat(
        call.Where(), ": no ETag in the answer for part ", part_number));
  }
  return etag;
}

absl::Status S3Client::CompleteMultipartUpload(
    const std::string& bucket, const std::string& key,
    const std::string& upload_id, const std::vector<CompletedPart>& parts,
    const PutOptions& options) {
  std::string body =
      "<CompleteMultipartUpload "
      "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
  for (const CompletedPart& p : parts) {
    absl::StrAppend(&body, "<Part><PartNumber>", p.part_number,
                    "</PartNumber><ETag>", XmlEscape(p.etag), "</ETag></Part>");
  }
  body += "</CompleteMultipartUpload>";
  Call call{S3Op::kCompleteMultipartUpload, "POST", &bucket, &key};
  call.query = {{"uploadId", upload_id}};
  call.body = body;
  call.error_in_ok_body = true;
  call.headers.emplace_back("content-type", "application/xml");
  if (options.if_none_match) call.headers.emplace_back("if-none-match", "*");
  HttpResponse r;
  absl::Status s = Execute(call, &r);
  if (s.ok() || !options.if_none_match || r.status != 412) return s;
  // As in PutObject: the object may be ours, whatever the attempt. A
  // multipart ETag is the MD5 of the parts' MD5s, a dash and the number of
  // parts.
  std::string md5s;
  for (const CompletedPart& p : parts) md5s += HexToBytes(Unquote(p.etag));
  const std::string ours = absl::StrCat(HexLower(Md5(md5s)), "-", parts.size());
  auto head = HeadObject(bucket, key);
  if (head.ok() && Unquote(head->etag) == ours) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrCat(
      call.Where(), ": the object exists (If-None-Match: * refused, ",
      FromHttp(s.message()), ")"));
}

absl::Status S3Client::AbortMultipartUpload(const std::string& bucket,
                                            const std::string& key,
                                            const std::string& upload_id) {
  Call call{S3Op::kAbortMultipartUpload, "DELETE", &bucket, &key};
  call.query = {{"uploadId", upload_id}};
  HttpResponse r;
  absl::Status s = Execute(call, &r);
  if (absl::IsNotFound(s) && ParseError(r).code == "NoSuchUpload") {
    return absl::OkStatus();
  }
  return s;
}

absl::StatusOr<std::vector<MultipartUpload>> S3Client::ListMultipartUploads(
    const std::string& bucket, const std::string& prefix) {
  std::vector<MultipartUpload> out;
  std::string key_marker, id_marker;
  while (true) {
    Call call{S3Op::kListMultipartUploads, "GET", &bucket};
    call.query = {{"uploads", ""}, {"prefix", prefix}};
    if (!key_marker.empty()) call.query.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) {
      call.query.emplace_back("upload-id-marker", id_marker);
    }
    HttpResponse r;
    CKPT_RETURN_IF_ERROR(Execute(call, &r));
    auto doc = ParseXml(r.body);
    if (!doc.ok() || doc->name != "ListMultipartUploadsResult") {
      return absl::DataLossError(absl::StrCat(
          call.Where(), ": the answer is not a ListMultipartUploadsResult"));
    }
    for (const XmlElement* u : doc->Children("Upload")) {
      out.push_back({u->ChildText("Key"), u->ChildText("UploadId")});
    }
    if (doc->ChildText("IsTruncated") != "true") break;
    std::string next_key = doc->ChildText("NextKeyMarker");
    std::string next_id = doc->ChildText("NextUploadIdMarker");
    if (next_key == key_marker && next_id == id_marker) {
      return absl::DataLossError(absl::StrCat(
          call.Where(), ": a truncated listing that does not advance"));
    }
    key_marker = std::move(next_key);
    id_marker = std::move(next_id);
  }
  return out;
}

absl::Status S3Client::CreateBucket(const std::string& bucket) {
  CKPT_RETURN_IF_ERROR(ValidateBucketName(bucket));
  std::string body;
  if (options_.region != "us-east-1") {
    body = absl::StrCat(
        "<CreateBucketConfiguration "
        "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
        "<LocationConstraint>",
        XmlEscape(options_.region),
        "</LocationConstraint></CreateBucketConfiguration>");
  }
  Call call{S3Op::kCreateBucket, "PUT", &bucket};
  call.body = body;
  HttpResponse r;
  absl::Status s = Execute(call, &r);
  if (!s.ok() && ParseError(r).code == "BucketAlreadyOwnedByYou") {
    return absl::OkStatus();
  }
  return s;
}

absl::Status S3Client::DeleteBucket(const std::string& bucket) {
  Call call{S3Op::kDeleteBucket, "DELETE", &bucket};
  HttpResponse r;
  return Execute(call, &r);
}

}  // namespace ckpt::s3

// Where an S3 client sends its requests and how: s3:// URLs, the endpoint
// and addressing style, and the configuration taken from the environment
// by the AWS conventions users already have.
#ifndef CKPT_S3_S3_CONFIG_H_
#define CKPT_S3_S3_CONFIG_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "s3/s3_retry.h"
#include "s3/s3_sigv4.h"

namespace ckpt::s3 {

// s3://bucket/key: `key` is everything after "bucket/", verbatim (no
// percent-decoding; it may be empty, or a prefix ending in '/').
struct S3Url {
  std::string bucket;
  std::string key;

  std::string ToString() const;  // "s3://bucket/key"
};

// Whether `s` starts with "s3://" (what a path argument that names S3
// looks like; everything else is a local path).
bool IsS3Url(absl::string_view s);

// InvalidArgument, saying what is wrong, for anything but
// "s3://<bucket>[/<key>]" with a valid bucket name.
[[nodiscard]] absl::StatusOr<S3Url> ParseS3Url(absl::string_view url);

// S3's bucket naming rules: 3 to 63 characters of a-z 0-9 . -, starting
// and ending with a letter or digit, no "..", not an IPv4 address.
[[nodiscard]] absl::Status ValidateBucketName(absl::string_view bucket);

enum class Addressing {
  kAuto,     // path style for a custom endpoint, virtual-hosted for AWS
  kPath,     // http://host/bucket/key
  kVirtual,  // http://bucket.host/key
};

// What one S3 client does (S3Client::Create copies it).
struct ClientOptions {
  // scheme://host[:port] of the S3 API, http or https, no path. Empty: AWS,
  // https://s3.<region>.amazonaws.com.
  std::string endpoint;
  std::string region = "us-east-1";
  Credentials credentials;  // empty access key: anonymous requests
  Addressing addressing = Addressing::kAuto;
  RetryPolicy retry;
  // Requests in flight at once through this client, over all threads; as
  // many connections are kept open for reuse. More callers wait.
  int max_connections = 16;
  absl::Duration connect_timeout = absl::Seconds(10);
  // Each attempt's whole time; zero: no limit (large transfers are bounded
  // by the low-speed rule instead).
  absl::Duration request_timeout = absl::ZeroDuration();
  // An attempt that moves fewer than low_speed_bytes per second for
  // low_speed_time (whole seconds) fails and is retried: a stalled server.
  uint64_t low_speed_bytes = 1024;
  absl::Duration low_speed_time = absl::Seconds(30);
  // Payload hashes in the signature (x-amz-content-sha256 = SHA-256 of the
  // body). False sends UNSIGNED-PAYLOAD, allowed only over https (where TLS
  // protects the body); it saves hashing every byte sent.
  bool sign_payload = true;
};

// Looks a variable up: getenv(3) by default; tests pass a map.
using EnvLookup = std::function<const char*(const char*)>;

// ClientOptions from the environment:
//   AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL   endpoint (default: AWS)
//   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY      both or neither (anonymous)
//   AWS_SESSION_TOKEN                             temporary credentials
//   AWS_REGION, else AWS_DEFAULT_REGION           default us-east-1
//   CKPT_S3_ADDRESSING = path | virtual | auto    default auto
// InvalidArgument naming the variable (never its value, for the secrets)
// when one is malformed. Shared config and credential files
// (~/.aws/config, AWS_PROFILE) and instance metadata are not read.
[[nodiscard]] absl::StatusOr<ClientOptions> ClientOptionsFromEnv(
    const EnvLookup& env = nullptr);

// An endpoint split into its parts; InvalidArgument unless it is
// http(s)://host[:port][/].
struct Endpoint {
  bool https = true;
  std::string host;  // "s3.us-east-1.amazonaws.com", "127.0.0.1", "[::1]"
  int port = 0;      // 0: the scheme's default

  std::string HostHeader() const;  // host[:port]
};
[[nodiscard]] absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view url);

}  // namespace ckpt::s3

#endif  // CKPT_S3_S3_CONFIG_H_

// AWS Signature Version 4 for S3 requests (the Authorization header form),
// and the hashes S3 requests carry. Ours, not libcurl's CURLOPT_AWS_SIGV4:
// the libcurl of Debian 12 (7.88.1) signs the query string as it is sent,
// unsorted and without "=" for a bare name (`?uploads`), and orders headers
// by "name:value" rather than by name (libckpt/s3/README.md has the
// evidence). Checked against AWS's published vectors in
// tests/libckpt/s3/s3_sigv4_test.cc.
//
// S3's rules, which differ from other AWS services: the canonical URI is
// the path URI-encoded once ('/' kept), never normalised ("/a/./b" and
// "a//b" are distinct keys); the payload hash is sent as
// x-amz-content-sha256 and signed.
//
// Pure functions of their arguments; thread-safe.
#ifndef CKPT_S3_S3_SIGV4_H_
#define CKPT_S3_S3_SIGV4_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt::s3 {

// Access key, secret and (for temporary credentials) session token. An
// empty access key id means anonymous requests (no Authorization header).
// Never printed: no message or log of ckpt contains the secret or the token.
struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;

  bool anonymous() const { return access_key_id.empty(); }
};

// Name/value pairs in the order given; names are not unique.
using KeyValues = std::vector<std::pair<std::string, std::string>>;

// The SHA-256 of the empty string, in hex: the payload hash of a request
// without a body.
inline constexpr absl::string_view kEmptyPayloadSha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
// The payload hash that leaves the body out of the signature (for HTTPS,
// where TLS protects it).
inline constexpr absl::string_view kUnsignedPayload = "UNSIGNED-PAYLOAD";

// One request as it is signed. `path` and `query` are decoded (raw bytes of
// the key and of the parameter values): they are encoded here exactly as
// they must be sent (SigningPath, CanonicalQuery).
struct SigningInput {
  absl::string_view method;            // "GET", "PUT", ...
  absl::string_view path;              // "/bucket/key" (path style) or "/key"
  const KeyValues* query = nullptr;    // may be null: no query
  const KeyValues* headers = nullptr;  // every header to sign, host included
  absl::string_view payload_hash;      // hex SHA-256 or kUnsignedPayload
  absl::string_view amz_date;          // "20130524T000000Z", as x-amz-date
  absl::string_view region;            // "us-east-1"
  absl::string_view service = "s3";
};

struct SigningResult {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signed_headers;  // "host;range;x-amz-content-sha256;x-amz-date"
  std::string signature;       // 64 lowercase hex digits
  std::string authorization;   // the Authorization header's value
};

// Signs `in` with `credentials` (whose access key must not be empty).
SigningResult SignV4(const SigningInput& in, const Credentials& credentials);

// AWS's UriEncode: every byte but A-Z a-z 0-9 - . _ ~ as %XX (upper-case
// hex); '/' kept when `encode_slash` is false (paths).
std::string UriEncode(absl::string_view s, bool encode_slash);

// The canonical query string: names and values URI-encoded, sorted by
// encoded name then value, "name=value" joined by '&' ("uploads=" for a
// bare name). Also the query string ckpt sends, so what is signed is what
// is sent.
std::string CanonicalQuery(const KeyValues& query);

// "20130524T000000Z" for the given instant (UTC).
std::string AmzDate(absl::Time t);

std::string Sha256Hex(absl::string_view data);
// The raw 32-byte HMAC-SHA256 of `data` under `key`.
std::string HmacSha256(absl::string_view key, absl::string_view data);
// Base64 of the MD5 of `data`: the Content-MD5 header (DeleteObjects
// requires one).
std::string Md5Base64(absl::string_view data);
// The raw 16-byte MD5 of `data` (S3's ETag of an object written whole is
// its hex).
std::string Md5(absl::string_view data);
std::string HexLower(absl::string_view bytes);

}  // namespace ckpt::s3

#endif  // CKPT_S3_S3_SIGV4_H_

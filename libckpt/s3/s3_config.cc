#include "s3/s3_config.h"

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ckpt::s3 {
namespace {

constexpr absl::string_view kScheme = "s3://";

bool AllDigitsAndDots(absl::string_view s) {
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c)) && c != '.') {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string S3Url::ToString() const {
  return absl::StrCat(kScheme, bucket, key.empty() ? "" : "/", key);
}

bool IsS3Url(absl::string_view s) { return absl::StartsWith(s, kScheme); }

absl::Status ValidateBucketName(absl::string_view b) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket name '", b, "' ", why,
                     " (S3 bucket names are 3 to 63 characters of a-z, 0-9, "
                     "'.' and '-', starting and ending with a letter or "
                     "digit)"));
  };
  if (b.size() < 3 || b.size() > 63) return bad("has the wrong length");
  for (char c : b) {
    const bool ok = absl::ascii_islower(static_cast<unsigned char>(c)) ||
                    absl::ascii_isdigit(static_cast<unsigned char>(c)) ||
                    c == '.' || c == '-';
    if (!ok) return bad(absl::StrCat("contains '", std::string(1, c), "'"));
  }
  auto alnum = [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c));
  };
  if (!alnum(b.front()) || !alnum(b.back())) {
    return bad("does not start and end with a letter or digit");
  }
  if (absl::StrContains(b, "..")) return bad("contains '..'");
  if (AllDigitsAndDots(b)) return bad("looks like an IP address");
  return absl::OkStatus();
}

absl::StatusOr<S3Url> ParseS3Url(absl::string_view url) {
  if (!IsS3Url(url)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", url, "' is not an S3 URL (s3://bucket/prefix)"));
  }
  absl::string_view rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  S3Url out;
  out.bucket = std::string(rest.substr(0, slash));
  if (slash != absl::string_view::npos) {
    out.key = std::string(rest.substr(slash + 1));
  }
  if (out.bucket.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", url, "' names no bucket (s3://bucket/prefix)"));
  }
  absl::Status s = ValidateBucketName(out.bucket);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(url, ": ", s.message()));
  }
  return out;
}

std::string Endpoint::HostHeader() const {
  if (port == 0) return host;
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view url) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "endpoint '", url, "' ", why, " (expected http(s)://host[:port])"));
  };
  Endpoint e;
  absl::string_view rest = url;
  if (absl::ConsumePrefix(&rest, "https://")) {
    e.https = true;
  } else if (absl::ConsumePrefix(&rest, "http://")) {
    e.https = false;
  } else {
    return bad("has no http:// or https:// scheme");
  }
  absl::ConsumeSuffix(&rest, "/");
  if (rest.find_first_of("/?#@") != absl::string_view::npos) {
    return bad("has a path, query or user part");
  }
  absl::string_view host = rest, port;
  if (absl::StartsWith(rest, "[")) {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) return bad("has an unclosed '['");
    host = rest.substr(0, close + 1);
    absl::string_view after = rest.substr(close + 1);
    if (!after.empty() && !absl::ConsumePrefix(&after, ":")) {
      return bad("has text after the IPv6 address");
    }
    port = after;
  } else if (const size_t colon = rest.rfind(':');
             colon != absl::string_view::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (port.empty()) return bad("has an empty port");
  }
  if (host.empty()) return bad("has no host");
  e.host = absl::AsciiStrToLower(host);
  if (!port.empty()) {
    if (!absl::SimpleAtoi(port, &e.port) || e.port <= 0 || e.port > 65535) {
      return bad("has an invalid port");
    }
  }
  return e;
}

absl::StatusOr<ClientOptions> ClientOptionsFromEnv(const EnvLookup& env) {
  auto get = [&](const char* name) -> std::string {
    const char* v = env ? env(name) : std::getenv(name);
    return v == nullptr ? std::string() : std::string(v);
  };
  ClientOptions o;
  o.endpoint = get("AWS_ENDPOINT_URL_S3");
  if (o.endpoint.empty()) o.endpoint = get("AWS_ENDPOINT_URL");
  if (!o.endpoint.empty()) {
    absl::Status s = ParseEndpoint(o.endpoint).status();
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          get("AWS_ENDPOINT_URL_S3").empty() ? "AWS_ENDPOINT_URL"
                                             : "AWS_ENDPOINT_URL_S3",
          ": ", s.message()));
    }
  }
  o.credentials.access_key_id = get("AWS_ACCESS_KEY_ID");
  o.credentials.secret_access_key = get("AWS_SECRET_ACCESS_KEY");
  o.credentials.session_token = get("AWS_SESSION_TOKEN");
  if (o.credentials.access_key_id.empty() !=
      o.credentials.secret_access_key.empty()) {
    return absl::InvalidArgumentError(
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together "
        "(neither: anonymous requests)");
  }
  if (o.credentials.access_key_id.empty() &&
      !o.credentials.session_token.empty()) {
    return absl::InvalidArgumentError(
        "AWS_SESSION_TOKEN is set without AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY");
  }
  o.region = get("AWS_REGION");
  if (o.region.empty()) o.region = get("AWS_DEFAULT_REGION");
  if (o.region.empty()) o.region = "us-east-1";
  for (char c : o.region) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("AWS_REGION/AWS_DEFAULT_REGION: '", o.region,
                       "' is not a region name (letters, digits and '-')"));
    }
  }
  const std::string addressing = get("CKPT_S3_ADDRESSING");
  if (addressing.empty() || addressing == "auto") {
    o.addressing = Addressing::kAuto;
  } else if (addressing == "path") {
    o.addressing = Addressing::kPath;
  } else if (addressing == "virtual") {
    o.addressing = Addressing::kVirtual;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("CKPT_S3_ADDRESSING: '", addressing,
                     "' is not one of path, virtual, auto"));
  }
  return o;
}

}  // namespace ckpt::s3

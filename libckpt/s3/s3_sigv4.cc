#include "s3/s3_sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ckpt::s3 {
namespace {

bool Unreserved(unsigned char c) {
  return absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

// A header value as it is signed: leading and trailing blanks dropped, each
// run of blanks inside made one space.
std::string TrimValue(absl::string_view v) {
  std::string out;
  bool blank = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      blank = true;
      continue;
    }
    if (blank && !out.empty()) out += ' ';
    blank = false;
    out += c;
  }
  return out;
}

std::string Digest(const EVP_MD* md, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), out, &n, md, nullptr);
  return std::string(reinterpret_cast<const char*>(out), n);
}

}  // namespace

std::string HexLower(absl::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

std::string Sha256Hex(absl::string_view data) {
  return HexLower(Digest(EVP_sha256(), data));
}

std::string HmacSha256(absl::string_view key, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out,
       &n);
  return std::string(reinterpret_cast<const char*>(out), n);
}

std::string Md5(absl::string_view data) { return Digest(EVP_md5(), data); }

std::string Md5Base64(absl::string_view data) {
  const std::string md5 = Md5(data);
  unsigned char out[32];
  const int n =
      EVP_EncodeBlock(out, reinterpret_cast<const unsigned char*>(md5.data()),
                      static_cast<int>(md5.size()));
  return std::string(reinterpret_cast<const char*>(out), n);
}

std::string UriEncode(absl::string_view s, bool encode_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (Unreserved(c) || (c == '/' && !encode_slash)) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string CanonicalQuery(const KeyValues& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(query.size());
  for (const auto& [k, v] : query) {
    encoded.emplace_back(UriEncode(k, true), UriEncode(v, true));
  }
  std::sort(encoded.begin(), encoded.end());
  std::string out;
  for (const auto& [k, v] : encoded) {
    if (!out.empty()) out += '&';
    absl::StrAppend(&out, k, "=", v);
  }
  return out;
}

std::string AmzDate(absl::Time t) {
  return absl::FormatTime("%Y%m%dT%H%M%SZ", t, absl::UTCTimeZone());
}

SigningResult SignV4(const SigningInput& in, const Credentials& credentials) {
  SigningResult r;
  // Canonical headers: lower-case names, sorted by name; a name given twice
  // has its values joined by ','.
  std::map<std::string, std::string> headers;
  if (in.headers != nullptr) {
    for (const auto& [name, value] : *in.headers) {
      std::string& v = headers[absl::AsciiStrToLower(name)];
      if (!v.empty()) v += ',';
      v += TrimValue(value);
    }
  }
  std::string canonical_headers;
  for (const auto& [name, value] : headers) {
    absl::StrAppend(&canonical_headers, name, ":", value, "\n");
    if (!r.signed_headers.empty()) r.signed_headers += ';';
    r.signed_headers += name;
  }
  r.canonical_request = absl::StrCat(
      in.method, "\n", UriEncode(in.path, /*encode_slash=*/false), "\n",
      in.query != nullptr ? CanonicalQuery(*in.query) : "", "\n",
      canonical_headers, "\n", r.signed_headers, "\n", in.payload_hash);

  const absl::string_view date = in.amz_date.substr(0, 8);
  const std::string scope =
      absl::StrCat(date, "/", in.region, "/", in.service, "/aws4_request");
  r.string_to_sign = absl::StrCat("AWS4-HMAC-SHA256\n", in.amz_date, "\n",
                                  scope, "\n", Sha256Hex(r.canonical_request));

  std::string key =
      HmacSha256(absl::StrCat("AWS4", credentials.secret_access_key), date);
  key = HmacSha256(key, in.region);
  key = HmacSha256(key, in.service);
  key = HmacSha256(key, "aws4_request");
  r.signature = HexLower(HmacSha256(key, r.string_to_sign));
  r.authorization = absl::StrCat(
      "AWS4-HMAC-SHA256 Credential=", credentials.access_key_id, "/", scope,
      ", SignedHeaders=", r.signed_headers, ", Signature=", r.signature);
  return r;
}

}  // namespace ckpt::s3

// The signer against AWS's published Signature Version 4 vectors:
//  - the SigV4 test suite (aws-sig-v4-test-suite: service "service",
//    us-east-1, 20150830T123600Z, key AKIDEXAMPLE), the cases where S3's
//    rules and the generic ones agree (S3 encodes the path once and never
//    normalises it);
//  - the four examples of the S3 API reference, "Signature Calculations for
//    the Authorization Header: Transferring Payload in a Single Chunk"
//    (examplebucket, 20130524T000000Z, key AKIAIOSFODNN7EXAMPLE).
// Each expected value is the published one: canonical request, string to
// sign or signature.
#include "s3/s3_sigv4.h"

#include <string>

#include "absl/time/civil_time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::s3 {
namespace {

using ::testing::HasSubstr;

// --- The SigV4 test suite ---------------------------------------------

const Credentials& SuiteCredentials() {
  static const Credentials c{"AKIDEXAMPLE",
                             "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};
  return c;
}

struct SuiteCase {
  const char* name;
  const char* method;
  const char* path;
  KeyValues query;
  KeyValues extra_headers;  // beyond Host and X-Amz-Date
  std::string body;
  const char* signature;
};

SigningResult SignSuite(const SuiteCase& c, const KeyValues& headers) {
  SigningInput in;
  in.method = c.method;
  in.path = c.path;
  in.query = &c.query;
  in.headers = &headers;
  const std::string hash = Sha256Hex(c.body);
  in.payload_hash = hash;
  in.amz_date = "20150830T123600Z";
  in.region = "us-east-1";
  in.service = "service";
  return SignV4(in, SuiteCredentials());
}

KeyValues SuiteHeaders(const SuiteCase& c) {
  KeyValues h = {{"Host", "example.amazonaws.com"},
                 {"X-Amz-Date", "20150830T123600Z"}};
  h.insert(h.end(), c.extra_headers.begin(), c.extra_headers.end());
  return h;
}

TEST(SigV4TestSuite, PublishedSignatures) {
  const std::string unreserved =
      "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  const std::vector<SuiteCase> cases = {
      {"get-vanilla",
       "GET",
       "/",
       {},
       {},
       "",
       "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"},
      {"get-vanilla-query-order-key-case",
       "GET",
       "/",
       {{"Param2", "value2"}, {"Param1", "value1"}},
       {},
       "",
       "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"},
      {"get-vanilla-empty-query-key",
       "GET",
       "/",
       {{"Param1", "value1"}},
       {},
       "",
       "a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb"},
      {"get-vanilla-query-unreserved",
       "GET",
       "/",
       {{unreserved, unreserved}},
       {},
       "",
       "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197"},
      {"get-vanilla-utf8-query",
       "GET",
       "/",
       {{"\xE1\x88\xB4", "bar"}},
       {},
       "",
       "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04"},
      {"get-vanilla-query-order-encoded",
       "GET",
       "/",
       {{"Param-3", "Value3"}, {"Param", "Value2"}, {"\xE1\x88\xB4", "Value1"}},
       {},
       "",
       "371d3713e185cc334048618a97f809c9ffe339c62934c032af5a0e595648fcac"},
      {"get-utf8",
       "GET",
       "/\xE1\x88\xB4",
       {},
       {},
       "",
       "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85"},
      {"get-space",
       "GET",
       "/example space/",
       {},
       {},
       "",
       "652487583200325589f1fba4c7e578f72c47cb61beeca81406b39ddec1366741"},
      {"get-header-value-trim",
       "GET",
       "/",
       {},
       {{"My-Header1", " value1"}, {"My-Header2", " \"a   b   c\""}},
       "",
       "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736"},
      {"get-vanilla-with-session-token",
       "GET",
       "/",
       {},
       {{"X-Amz-Security-Token",
         "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267"}},
       "",
       "07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8"},
      {"post-vanilla",
       "POST",
       "/",
       {},
       {},
       "",
       "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"},
      {"post-x-www-form-urlencoded",
       "POST",
       "/",
       {},
       {{"Content-Type", "application/x-www-form-urlencoded"}},
       "Param1=value1",
       "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a"},
  };
  for (const SuiteCase& c : cases) {
    const SigningResult r = SignSuite(c, SuiteHeaders(c));
    EXPECT_EQ(r.signature, c.signature) << c.name << "\n"
                                        << r.canonical_request;
  }
}

TEST(SigV4TestSuite, PublishedCanonicalRequestsAndAuthorization) {
  SuiteCase c{"get-vanilla-query-order-key-case",
              "GET",
              "/",
              {{"Param2", "value2"}, {"Param1", "value1"}},
              {},
              "",
              ""};
  SigningResult r = SignSuite(c, SuiteHeaders(c));
  EXPECT_EQ(r.canonical_request,
            "GET\n/\nParam1=value1&Param2=value2\n"
            "host:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n"
            "host;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(r.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/"
            "service/aws4_request, SignedHeaders=host;x-amz-date, "
            "Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219e"
            "c94cdf2500");

  SuiteCase trim{"get-header-value-trim",
                 "GET",
                 "/",
                 {},
                 {{"My-Header1", " value1"}, {"My-Header2", " \"a   b   c\""}},
                 "",
                 ""};
  r = SignSuite(trim, SuiteHeaders(trim));
  EXPECT_EQ(r.canonical_request,
            "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value1\n"
            "my-header2:\"a b c\"\nx-amz-date:20150830T123600Z\n\n"
            "host;my-header1;my-header2;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

// The suite's normalize-path cases (get-slash-dot-slash: "/./" is signed
// as "/") do not apply to S3, which signs the path as sent: "a/./b" and
// "a/b" are different keys. moto verifies this end to end
// (S3Client.KeysWithUnusualCharactersRoundTrip).
TEST(SigV4, S3PathsAreNeverNormalised) {
  KeyValues headers = {{"host", "example.amazonaws.com"},
                       {"x-amz-date", "20150830T123600Z"}};
  for (const char* path : {"/./", "/a/../b", "/a//b", "/a/./b/"}) {
    SigningInput in;
    in.method = "GET";
    in.path = path;
    in.headers = &headers;
    in.payload_hash = kEmptyPayloadSha256;
    in.amz_date = "20150830T123600Z";
    in.region = "us-east-1";
    const SigningResult r = SignV4(in, SuiteCredentials());
    EXPECT_THAT(r.canonical_request,
                HasSubstr(std::string("GET\n") + path + "\n"));
  }
}

// --- The S3 API reference's examples ---------------------------------

const Credentials& S3ExampleCredentials() {
  static const Credentials c{"AKIAIOSFODNN7EXAMPLE",
                             "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
  return c;
}

SigningResult SignS3Example(const char* method, const char* path,
                            const KeyValues& query, KeyValues headers,
                            const std::string& payload_hash) {
  headers.emplace_back("host", "examplebucket.s3.amazonaws.com");
  headers.emplace_back("x-amz-date", "20130524T000000Z");
  headers.emplace_back("x-amz-content-sha256", payload_hash);
  SigningInput in;
  in.method = method;
  in.path = path;
  in.query = &query;
  in.headers = &headers;
  in.payload_hash = payload_hash;
  in.amz_date = "20130524T000000Z";
  in.region = "us-east-1";
  return SignV4(in, S3ExampleCredentials());
}

TEST(SigV4S3Examples, GetObjectWithRange) {
  const SigningResult r =
      SignS3Example("GET", "/test.txt", {}, {{"Range", "bytes=0-9"}},
                    std::string(kEmptyPayloadSha256));
  EXPECT_EQ(r.canonical_request,
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\n"
            "range:bytes=0-9\n"
            "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649"
            "b934ca495991b7852b855\nx-amz-date:20130524T000000Z\n\n"
            "host;range;x-amz-content-sha256;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(r.string_to_sign,
            "AWS4-HMAC-SHA256\n20130524T000000Z\n"
            "20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(r.signature,
            "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  EXPECT_EQ(r.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/"
            "us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039"
            "c6036bdb41");
}

TEST(SigV4S3Examples, PutObject) {
  const std::string hash = Sha256Hex("Welcome to Amazon S3.");
  EXPECT_EQ(hash,
            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  // The key is "test$file.text": '$' is encoded in the path.
  const SigningResult r =
      SignS3Example("PUT", "/test$file.text", {},
                    {{"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                     {"x-amz-storage-class", "REDUCED_REDUNDANCY"}},
                    hash);
  EXPECT_THAT(r.canonical_request, HasSubstr("PUT\n/test%24file.text\n\n"));
  EXPECT_EQ(r.signed_headers,
            "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class");
  EXPECT_THAT(r.string_to_sign,
              HasSubstr("9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b"
                        "4158342019d"));
  EXPECT_EQ(r.signature,
            "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(SigV4S3Examples, GetBucketLifecycle) {
  // A bare sub-resource, "?lifecycle", is signed as "lifecycle=".
  const SigningResult r = SignS3Example("GET", "/", {{"lifecycle", ""}}, {},
                                        std::string(kEmptyPayloadSha256));
  EXPECT_THAT(r.canonical_request, HasSubstr("GET\n/\nlifecycle=\n"));
  EXPECT_THAT(r.string_to_sign,
              HasSubstr("9766c798316ff2757b517bc739a67f6213b4ab36dd5da2f94eaeb"
                        "f79c77395ca"));
  EXPECT_EQ(r.signature,
            "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

TEST(SigV4S3Examples, GetBucketListObjects) {
  // Given out of order: the canonical query sorts it.
  const SigningResult r =
      SignS3Example("GET", "/", {{"prefix", "J"}, {"max-keys", "2"}}, {},
                    std::string(kEmptyPayloadSha256));
  EXPECT_THAT(r.canonical_request, HasSubstr("GET\n/\nmax-keys=2&prefix=J\n"));
  EXPECT_THAT(r.string_to_sign,
              HasSubstr("df57d21db20da04d7fa30298dd4488ba3a2b47ca3a489c74750e0"
                        "f1e7df1b9b7"));
  EXPECT_EQ(r.signature,
            "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

// --- The pieces -------------------------------------------------------

// The query strings of the S3 requests ckpt sends, as S3 canonicalises
// them (and as they are sent: what is signed is what is sent).
TEST(SigV4, CanonicalQueryOfS3Requests) {
  EXPECT_EQ(CanonicalQuery({{"uploads", ""}}), "uploads=");
  EXPECT_EQ(CanonicalQuery({{"delete", ""}}), "delete=");
  EXPECT_EQ(CanonicalQuery({{"uploadId", "a.b~c/d+e=="}, {"partNumber", "2"}}),
            "partNumber=2&uploadId=a.b~c%2Fd%2Be%3D%3D");
  EXPECT_EQ(CanonicalQuery({{"list-type", "2"},
                            {"prefix", "a/b c"},
                            {"continuation-token", "1/x+y="}}),
            "continuation-token=1%2Fx%2By%3D&list-type=2&prefix=a%2Fb%20c");
  // Sorted by name, then by value; upper case before lower case (bytes).
  EXPECT_EQ(CanonicalQuery({{"b", "2"}, {"a", "z"}, {"a", "y"}, {"B", "1"}}),
            "B=1&a=y&a=z&b=2");
}

TEST(SigV4, UriEncodeKeepsOnlyUnreservedBytes) {
  EXPECT_EQ(UriEncode("aZ09-._~", true), "aZ09-._~");
  EXPECT_EQ(UriEncode("a b+c*d%e/f", true), "a%20b%2Bc%2Ad%25e%2Ff");
  EXPECT_EQ(UriEncode("a b/c", false), "a%20b/c");
  EXPECT_EQ(UriEncode("\xC3\xBC", true), "%C3%BC");
  EXPECT_EQ(UriEncode(std::string("\0\xFF", 2), true), "%00%FF");
}

TEST(SigV4, HeadersSortedByNameAndDuplicatesJoined) {
  // Sorted by name, not by "name:value" ("x-amz-meta-a" before
  // "x-amz-meta-a-b" although ':' sorts after '-').
  KeyValues headers = {{"X-Amz-Meta-A-B", "2"},
                       {"x-amz-meta-a", "1"},
                       {"Host", "h"},
                       {"x-amz-meta-a", " 3  4 "}};
  SigningInput in;
  in.method = "GET";
  in.path = "/";
  in.headers = &headers;
  in.payload_hash = kEmptyPayloadSha256;
  in.amz_date = "20150830T123600Z";
  in.region = "us-east-1";
  const SigningResult r = SignV4(in, SuiteCredentials());
  EXPECT_EQ(r.signed_headers, "host;x-amz-meta-a;x-amz-meta-a-b");
  EXPECT_THAT(r.canonical_request,
              HasSubstr("host:h\nx-amz-meta-a:1,3 4\nx-amz-meta-a-b:2\n\n"));
}

TEST(SigV4, Hashes) {
  EXPECT_EQ(Sha256Hex(""), kEmptyPayloadSha256);
  EXPECT_EQ(Md5Base64(""), "1B2M2Y8AsgTpgAmY7PhCfg==");
  EXPECT_EQ(HexLower(Md5("")), "d41d8cd98f00b204e9800998ecf8427e");
  // RFC 4231, test case 2.
  EXPECT_EQ(HexLower(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(SigV4, AmzDateIsUtc) {
  const absl::Time t = absl::FromCivil(absl::CivilSecond(2013, 5, 24, 0, 0, 7),
                                       absl::UTCTimeZone());
  EXPECT_EQ(AmzDate(t), "20130524T000007Z");
}

}  // namespace
}  // namespace ckpt::s3

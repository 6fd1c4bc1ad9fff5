// S3Client against moto on loopback with signature checking on
// (s3_test_server.h): every request here is verified by a server.
#include "s3/s3_client.h"

#include <algorithm>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "s3_test_server.h"
#include "testing/status_matchers.h"
#include "util/mutex.h"

namespace ckpt::s3 {
namespace {

using ::ckpt::s3::testing::NewBucket;
using ::ckpt::s3::testing::TestOptions;
using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

std::unique_ptr<S3Client> MakeClient(const ClientOptions& o,
                                     RequestObserver observer = nullptr) {
  auto c = S3Client::Create(o, std::move(observer));
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

TEST(S3Client, PutGetHeadDeleteRoundTrip) {
  CKPT_S3_SERVER_OR_SKIP(server);
  auto client = MakeClient(TestOptions(*server));
  const std::string b = NewBucket(client.get());
  const std::string data = RandomBytes(100000, 1);
  CKPT_ASSERT_OK(client->PutObject(b, "dir/obj", data));
  CKPT_ASSERT_OK(client->PutObject(b, "empty", ""));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string got, client->GetObject(b, "dir/obj"));
  EXPECT_EQ(got, data);
  CKPT_ASSERT_OK_AND_ASSIGN(got, client->GetObject(b, "empty"));
  EXPECT_EQ(got, "");
  CKPT_ASSERT_OK_AND_ASSIGN(ObjectInfo info, client->HeadObject(b, "dir/obj"));
  EXPECT_EQ(info.size, data.size());
  EXPECT_FALSE(info.etag.empty());
  CKPT_ASSERT_OK(client->DeleteObject(b, "dir/obj"));
  CKPT_EXPECT_OK(client->DeleteObject(b, "dir/obj"));  // gone: still OK
  EXPECT_THAT(
      client->HeadObject(b, "dir/obj"),
      StatusIs(absl::StatusCode::kNotFound,
               absl::StrCat("HeadObject s3://", b, "/dir/obj: HTTP 404")));
}

TEST(S3Client, MissingObjectsAndBucketsAreNotFoundAndNotRetried) {
  CKPT_S3_SERVER_OR_SKIP(server);
  auto client = MakeClient(TestOptions(*server));
  const std::string b = NewBucket(client.get());
  const S3Counters before = client->counters();
  EXPECT_THAT(client->GetObject(b, "nope"),
              StatusIs(absl::StatusCode::kNotFound,
                       absl::StrCat("GetObject s3://", b,
                                    "/nope: HTTP 404 NoSuchKey")));
  EXPECT_THAT(client->GetObject("ckpt-no-such-bucket-x1", "k"),
              StatusIs(absl::StatusCode::kNotFound, "NoSuchBucket"));
  EXPECT_EQ((client->counters() - before).requests, 2u);
}

TEST(S3Client, RangedReadsAreExactOrErrors) {
  CKPT_S3_SERVER_OR_SKIP(server);
  auto client = MakeClient(TestOptions(*server));
  const std::string b = NewBucket(client.get());
  const std::string data = RandomBytes(1000, 2);
  CKPT_ASSERT_OK(client->PutObject(b, "o", data));
  std::string buf(100, '\0');
  CKPT_ASSERT_OK(client->GetRange(b, "o", 10, 100, buf.data()));
  EXPECT_EQ(buf, data.substr(10, 100));
  CKPT_ASSERT_OK(client->GetRange(b, "o", 999, 1, buf.data()));
  EXPECT_EQ(buf[0], data[999]);
  CKPT_ASSERT_OK(
      client->GetRange(b, "o", 0, 1000, std::string(1000, 0).data()));
  // Past the end: the server clamps the range; never a short read.
  EXPECT_THAT(client->GetRange(b, "o", 950, 100, buf.data()),
              StatusIs(absl::StatusCode::kOutOfRange,
                       absl::StrCat("GetObject s3://", b,
                                    "/o (bytes 950-1049): the object ends at "
                                    "byte 1000 (1000 bytes)")));
  EXPECT_THAT(client->GetRange(b, "o", 1000, 10, buf.data()),
              StatusIs(absl::StatusCode::kOutOfRange, "(bytes 1000-1009)"));
  EXPECT_THAT(client->GetRange(b, "o", 0, 0, buf.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, "empty range"));
}

// Keys that need encoding, and keys that a URL normaliser would change:
// signed and sent exactly (the server recomputes the signature from the
// path it received).
TEST(S3Client, KeysWithUnusualCharactersRoundTrip) {
  CKPT_S3_SERVER_OR_SKIP(server);
  auto client = MakeClient(TestOptions(*server));
  const std::string b = NewBucket(client.get());
  const std::vector<std::string> keys = {"a b",
                                         "a+b",
                                         "\xC3\xBC/\xC3\x9F",
                                         "x/./y",
                                         "x/../y",
                                         "x//y",
                                         "%41",
                                         "q?x=y#z",
                                         "~!$&'()*,;=:@",
                                         "trail/",
                                         "[br]{c}^|`\"<>\\"};
  for (size_t i = 0; i < keys.size(); ++i) {
    CKPT_ASSERT_OK(client->PutObject(b, keys[i], absl::StrCat("v", i)))
        << keys[i];
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    CKPT_ASSERT_OK_AND_ASSIGN(std::string got, client->GetObject(b, keys[i]));
    EXPECT_EQ(got, absl::StrCat("v", i)) << keys[i];
  }
  CKPT_ASSERT_OK_AND_ASSIGN(ListResult all, client->ListObjects(b, ""));
  std::vector<std::string> listed, want = keys;
  for (const auto& o : all.objects) listed.push_back(o.key);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(listed, want);
}

TEST(S3Client, ListPaginatesAndRollsUpPrefixes) {
  CKPT_S3_SERVER_OR_SKIP(server);
  auto client = MakeClient(TestOptions(*server));
  const std::string b = NewBucket(client.get());
  for (int i = 0; i < 23; ++i) {
    CKPT_ASSERT_OK(client->PutObject(b, absl::StrCat("run/k", 100 + i), "x"));
  }
  CKPT_ASSERT_OK(client->PutObject(b, "run/step-1/MANIFEST", "m"));
  CKPT_ASSERT_OK(client->PutObject(b, "run/step-2/shard", "s"));
  CKPT_ASSERT_OK(client->PutObject(b, "other", "o"));
  const S3Counters before = client->counters();
  CKPT_ASSERT_OK_AND_ASSIGN(ListResult r,
                            client->ListObjects(b, "run/", "", /*page=*/5));
  EXPECT_EQ(r.objects.size(), 25u);
  EXPECT_EQ(r.objects.front().key, "run/k100");
  EXPECT_EQ(r.objects.front().size, 1u);
  const S3Counters d = client->counters() - before;
  EXPECT_EQ(d.requests_by_op[static_cast<int>(S3Op::kListObjects)], 5u);
  CKPT_ASSERT_OK_AND_ASSIGN(r, client->ListObjects(b, "run/", "/"));
  EXPECT_EQ(r.objects.size(), 23u);
  EXPECT_THAT(r.common_prefixes, ElementsAre("run/step-1/", "run/step-2/"));
  EXPECT_THAT(client->ListObjects(b, "", "", 0),
              StatusIs(absl::StatusCode::kInvalidArgument, "page size"));
}

TEST(S3Client, DeleteObjectsInBatchesOfAThousand) {
  CKPT_S3_SERVER_OR_SKIP(server);
  auto client = MakeClient(TestOptions(*server));
  const std::string b = NewBucket(client.get());
  std::vector<std::string> keys;
  for (int i = 0; i < 1003; ++i) keys.push_back(absl::StrCat("d/", i));
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < keys.size(); i += 8) {
        EXPECT_TRUE(client->PutObject(b, keys[i], "").ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  keys.push_back("d/never-written & <escaped>");
  const S3Counters before = client->counters();
  CKPT_ASSERT_OK(client->DeleteObjects(b, keys));
  EXPECT_EQ((client->counters() - before)
                .requests_by_op[static_cast<int>(S3Op::kDeleteObjects)],
            2u);
  CKPT_ASSERT_OK_AND_ASSIGN(ListResult r, client->ListObjects(b, "d/"));
  EXPECT_TRUE(r.objects.empty());
}

// The commit point of a checkpoint on S3: If-None-Match: * lets one writer
// create a key and refuses the next. moto honours it.
TEST(S3Client, ConditionalPutCreatesOnce) {
  CKPT_S3_SERVER_OR_SKIP(server);
  auto client = MakeClient(TestOptions(*server));
  const std::string b = NewBucket(client.get());
  PutOptions once;
  once.if_none_match = true;
  CKPT_ASSERT_OK(client->PutObject(b, "MANIFEST", "first", once));
  EXPECT_THAT(client->PutObject(b, "MANIFEST", "second", once),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       absl::StrCat("PutObject s3://", b,
                                    "/MANIFEST: the object exists "
                                    "(If-None-Match: * refused, HTTP 412")));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string got, client->GetObject(b, "MANIFEST"));
  EXPECT_EQ(got, "first");
  CKPT_ASSERT_OK(client->PutObject(b, "MANIFEST", "third"));  // unconditional
}

TEST(S3Client, MultipartUploadCompleteListAndAbort) {
  CKPT_S3_SERVER_OR_SKIP(server);
  auto client = MakeClient(TestOptions(*server));
  const std::string b = NewBucket(client.get());
  const std::string p1 = RandomBytes(5 << 20, 3), p2 = RandomBytes(1000, 4);
  CKPT_ASSERT_OK_AND_ASSIGN(std::string id,
                            client->CreateMultipartUpload(b, "big"));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string e2,
                            client->UploadPart(b, "big", id, 2, p2));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string e1,
                            client->UploadPart(b, "big", id, 1, p1));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string other,
                            client->CreateMultipartUpload(b, "left/over"));
  CKPT_ASSERT_OK_AND_ASSIGN(std::vector<MultipartUpload> ups,
                            client->ListMultipartUploads(b, ""));
  ASSERT_EQ(ups.size(), 2u);
  CKPT_ASSERT_OK_AND_ASSIGN(ups, client->ListMultipartUploads(b, "left/"));
  ASSERT_EQ(ups.size(), 1u);
  EXPECT_EQ(ups[0].key, "left/over");
  EXPECT_EQ(ups[0].upload_id, other);
  // Not visible before completion.
  EXPECT_THAT(client->HeadObject(b, "big"),
              StatusIs(absl::StatusCode::kNotFound, "404"));
  PutOptions once;
  once.if_none_match = true;
  CKPT_ASSERT_OK(
      client->CompleteMultipartUpload(b, "big", id, {{1, e1}, {2, e2}}, once));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string got, client->GetObject(b, "big"));
  EXPECT_TRUE(got == p1 + p2);
  CKPT_ASSERT_OK(client->AbortMultipartUpload(b, "left/over", other));
  CKPT_ASSERT_OK(client->AbortMultipartUpload(b, "left/over", other));  // gone
  CKPT_ASSERT_OK_AND_ASSIGN(ups, client->ListMultipartUploads(b, ""));
  EXPECT_TRUE(ups.empty());
  EXPECT_THAT(client->UploadPart(b, "big", id, 0, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "part number 0"));
}

// A conditional completion loses to an object that exists.
TEST(S3Client, ConditionalCompleteRefusedWhenTheKeyExists) {
  CKPT_S3_SERVER_OR_SKIP(server);
  auto client = MakeClient(TestOptions(*server));
  const std::string b = NewBucket(client.get());
  CKPT_ASSERT_OK_AND_ASSIGN(std::string id,
                            client->CreateMultipartUpload(b, "k"));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string e1,
                            client->UploadPart(b, "k", id, 1, "part"));
  CKPT_ASSERT_OK(client->PutObject(b, "k", "winner"));
  PutOptions once;
  once.if_none_match = true;
  EXPECT_THAT(client->CompleteMultipartUpload(b, "k", id, {{1, e1}}, once),
              StatusIs(absl::StatusCode::kAlreadyExists, "HTTP 412"));
  CKPT_ASSERT_OK(client->AbortMultipartUpload(b, "k", id));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string got, client->GetObject(b, "k"));
  EXPECT_EQ(got, "winner");
}

// The server checks signatures: a wrong secret is refused with 403
// SignatureDoesNotMatch, reported as PermissionDenied, not retried, and no
// message carries the secret.
TEST(S3Client, WrongSecretFailsWithSignatureDoesNotMatch) {
  CKPT_S3_SERVER_OR_SKIP(server);
  auto good = MakeClient(TestOptions(*server));
  const std::string b = NewBucket(good.get());
  CKPT_ASSERT_OK(good->PutObject(b, "k", "v"));
  ClientOptions o = TestOptions(*server);
  o.credentials.secret_access_key =
      "wrong-secret-" + o.credentials.secret_access_key;
  auto bad = MakeClient(o);
  absl::StatusOr<std::string> got = bad->GetObject(b, "k");
  EXPECT_THAT(got,
              StatusIs(absl::StatusCode::kPermissionDenied,
                       absl::StrCat("GetObject s3://", b,
                                    "/k: HTTP 403 SignatureDoesNotMatch")));
  EXPECT_EQ(bad->counters().requests, 1u);
  const std::string msg(got.status().message());
  EXPECT_THAT(msg, Not(HasSubstr(o.credentials.secret_access_key)));
  EXPECT_THAT(msg, Not(HasSubstr(server->user.secret_access_key)));
  EXPECT_THAT(
      bad->PutObject(b, "k2", "v"),
      StatusIs(absl::StatusCode::kPermissionDenied, "SignatureDoesNotMatch"));
}

TEST(S3Client, UnknownAccessKeyIsRefused) {
  CKPT_S3_SERVER_OR_SKIP(server);
  auto good = MakeClient(TestOptions(*server));
  const std::string b = NewBucket(good.get());
  ClientOptions o = TestOptions(*server);
  o.credentials.access_key_id = "AKIAUNKNOWNKEY000000";
  EXPECT_THAT(MakeClient(o)->GetObject(b, "k"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       "HTTP 403 InvalidAccessKeyId"));
}

// Temporary credentials: the session token is sent and signed
// (x-amz-security-token); a wrong token is refused and not shown.
TEST(S3Client, SessionTokenIsSignedAndNeverShown) {
  CKPT_S3_SERVER_OR_SKIP(server);
  ClientOptions o = TestOptions(*server);
  o.credentials = server->session;
  ASSERT_FALSE(o.credentials.session_token.empty());
  auto client = MakeClient(o);
  const std::string b = NewBucket(client.get());
  CKPT_ASSERT_OK(client->PutObject(b, "k", "v"));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string got, client->GetObject(b, "k"));
  EXPECT_EQ(got, "v");

  o.credentials.session_token = "wrong-token-" + server->session.session_token;
  absl::StatusOr<std::string> refused = MakeClient(o)->GetObject(b, "k");
  EXPECT_THAT(refused,
              StatusIs(absl::StatusCode::kPermissionDenied, "InvalidToken"));
  const std::string msg(refused.status().message());
  EXPECT_THAT(msg, Not(HasSubstr(server->session.session_token)));
  EXPECT_THAT(msg, Not(HasSubstr(server->session.secret_access_key)));

  o.credentials.session_token.clear();  // temporary key without its token
  EXPECT_THAT(MakeClient(o)->GetObject(b, "k"),
              StatusIs(absl::StatusCode::kPermissionDenied, "HTTP 403"));
}

TEST(S3Client, VirtualHostedAddressing) {
  CKPT_S3_SERVER_OR_SKIP(server);
  ClientOptions o = TestOptions(*server);
  // bucket.localhost resolves to loopback (libcurl resolves *.localhost
  // itself).
  std::string endpoint = server->endpoint;
  endpoint.replace(endpoint.find("127.0.0.1"), 9, "localhost");
  o.endpoint = endpoint;
  o.addressing = Addressing::kVirtual;
  auto client = MakeClient(o);
  const std::string b = NewBucket(client.get());
  CKPT_ASSERT_OK(client->PutObject(b, "a/b c", "virtual"));
  auto path_style = MakeClient(TestOptions(*server));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string got, path_style->GetObject(b, "a/b c"));
  EXPECT_EQ(got, "virtual");
  CKPT_ASSERT_OK_AND_ASSIGN(ListResult r, client->ListObjects(b, "a/"));
  ASSERT_EQ(r.objects.size(), 1u);
}

TEST(S3Client, OtherRegion) {
  CKPT_S3_SERVER_OR_SKIP(server);
  ClientOptions o = TestOptions(*server);
  o.region = "eu-west-1";
  auto client = MakeClient(o);
  const std::string b = NewBucket(client.get());
  CKPT_ASSERT_OK(client->PutObject(b, "k", "v"));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string got, client->GetObject(b, "k"));
  EXPECT_EQ(got, "v");
}

// Requests, retries and bytes: what ckpt-bench-io --storage s3:// will
// report. Bodies are counted exactly.
TEST(S3Client, CountersAndObserverCountRequestsAndBodyBytes) {
  CKPT_S3_SERVER_OR_SKIP(server);
  Mutex mu;
  std::vector<RequestRecord> log;
  std::vector<std::string> keys;
  auto client = MakeClient(TestOptions(*server), [&](const RequestRecord& r) {
    MutexLock l(&mu);
    log.push_back(r);
    keys.emplace_back(r.key);
  });
  const std::string b = NewBucket(client.get());
  const S3Counters before = client->counters();
  CKPT_ASSERT_OK(client->PutObject(b, "k", std::string(3000, 'x')));
  std::string buf(1000, '\0');
  CKPT_ASSERT_OK(client->GetRange(b, "k", 1000, 1000, buf.data()));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string all, client->GetObject(b, "k"));
  const S3Counters d = client->counters() - before;
  EXPECT_EQ(d.requests, 3u);
  EXPECT_EQ(d.retries, 0u);
  EXPECT_EQ(d.failed_attempts, 0u);
  EXPECT_EQ(d.bytes_sent, 3000u);
  EXPECT_EQ(d.bytes_received, 4000u);
  EXPECT_GT(d.header_bytes_received, 0u);
  EXPECT_EQ(d.requests_by_op[static_cast<int>(S3Op::kPutObject)], 1u);
  EXPECT_EQ(d.requests_by_op[static_cast<int>(S3Op::kGetObject)], 2u);
  MutexLock l(&mu);
  ASSERT_EQ(log.size(), 4u);  // CreateBucket first
  EXPECT_EQ(log[2].op, S3Op::kGetObject);
  EXPECT_EQ(keys[2], "k");
  EXPECT_EQ(log[2].range_offset, 1000u);
  EXPECT_EQ(log[2].range_length, 1000u);
  EXPECT_EQ(log[2].http_status, 206);
  EXPECT_EQ(log[2].bytes_received, 1000u);
}

TEST(S3Client, ConcurrentRequestsShareBoundedConnections) {
  CKPT_S3_SERVER_OR_SKIP(server);
  ClientOptions o = TestOptions(*server);
  o.max_connections = 3;
  auto client = MakeClient(o);
  const std::string b = NewBucket(client.get());
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        const std::string key = absl::StrCat("t", t, "/", i);
        const std::string data = RandomBytes(1000 + i, t * 100 + i);
        EXPECT_TRUE(client->PutObject(b, key, data).ok());
        auto got = client->GetObject(b, key);
        EXPECT_TRUE(got.ok() && *got == data) << key;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(client->counters().requests, 161u);
}

TEST(S3Client, BadOptionsAreRefused) {
  ClientOptions o;
  o.endpoint = "http://127.0.0.1:1";
  o.sign_payload = false;
  o.credentials = {"AKID", "SECRET", ""};
  EXPECT_THAT(S3Client::Create(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                            "unsigned payloads need https"));
  o.sign_payload = true;
  o.max_connections = 0;
  EXPECT_THAT(S3Client::Create(o),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_connections"));
  o.max_connections = 1;
  o.endpoint = "127.0.0.1:1";
  EXPECT_THAT(S3Client::Create(o),
              StatusIs(absl::StatusCode::kInvalidArgument, "endpoint"));
}

// Nothing listens: connection refused is transient (retried), and the
// error names the object after the policy gives up.
TEST(S3Client, ConnectionRefusedIsRetriedThenReported) {
  ClientOptions o;
  o.endpoint = "http://127.0.0.1:1";
  o.credentials = {"AKID", "SECRET-VALUE", ""};
  o.retry.max_attempts = 3;
  o.retry.initial_backoff = absl::Milliseconds(1);
  auto client = MakeClient(o);
  absl::Status s = client->PutObject("bucket", "key", "v");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable,
                          "PutObject s3://bucket/key: "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("gave up after 3 attempts"));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("SECRET-VALUE")));
  EXPECT_EQ(client->counters().requests, 3u);
  EXPECT_EQ(client->counters().retries, 2u);
}

}  // namespace
}  // namespace ckpt::s3

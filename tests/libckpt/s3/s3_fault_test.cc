// Faults between the client and moto, injected by fault_proxy.py: 500s,
// 503 SlowDown, answers held past the client's timeout, connections
// dropped mid-body or reset. Each is retried (the data then exact) or
// reported, naming the object, the HTTP status and S3's code; never a
// truncated result.
#include <memory>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ckpt/format/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "s3/s3_client.h"
#include "s3/s3_object_writer.h"
#include "s3_test_server.h"
#include "testing/status_matchers.h"

namespace ckpt::s3 {
namespace {

using ::ckpt::s3::testing::FaultProxy;
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

// A client through a fault proxy, a bucket, and one object in it.
class Faults : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    server_ = testing::GetTestServer(&why);
    if (server_ == nullptr) {
      if (testing::InCi()) FAIL() << why;
      GTEST_SKIP() << why;
    }
    auto proxy = FaultProxy::Start(server_->endpoint);
    ASSERT_TRUE(proxy.ok()) << proxy.status();
    proxy_ = std::move(*proxy);
    direct_ = S3Client::Create(TestOptions(*server_)).value();
    bucket_ = NewBucket(direct_.get());
    data_ = RandomBytes(200000, 5);
    CKPT_ASSERT_OK(direct_->PutObject(bucket_, "obj", data_));
  }

  std::unique_ptr<S3Client> Client(ClientOptions o) {
    return S3Client::Create(o).value();
  }
  ClientOptions Options() { return TestOptions(*server_, proxy_->endpoint()); }
  void Rules(const std::string& json) {
    CKPT_ASSERT_OK(proxy_->SetRules(json));
  }
  std::vector<int> Hits() { return proxy_->Hits().value(); }

  const testing::TestServer* server_ = nullptr;
  std::unique_ptr<FaultProxy> proxy_;
  std::unique_ptr<S3Client> direct_;
  std::string bucket_, data_;
};

TEST_F(Faults, InternalErrorsAreRetried) {
  Rules(R"([{"action": "status", "status": 500, "code": "InternalError",
             "method": "GET", "times": 2}])");
  auto c = Client(Options());
  CKPT_ASSERT_OK_AND_ASSIGN(std::string got, c->GetObject(bucket_, "obj"));
  EXPECT_TRUE(got == data_);
  EXPECT_THAT(Hits(), ElementsAre(2));
  EXPECT_EQ(c->counters().requests, 3u);
  EXPECT_EQ(c->counters().retries, 2u);
  EXPECT_EQ(c->counters().failed_attempts, 2u);
}

TEST_F(Faults, SlowDownIsRetried) {
  Rules(R"([{"action": "status", "status": 503, "code": "SlowDown",
             "message": "Please reduce your request rate.", "method": "PUT",
             "times": 3}])");
  auto c = Client(Options());
  CKPT_ASSERT_OK(c->PutObject(bucket_, "new", "value"));
  EXPECT_THAT(Hits(), ElementsAre(3));
  EXPECT_EQ(direct_->GetObject(bucket_, "new").value(), "value");
}

// When the policy gives up, the error names the object, the status, S3's
// code and message, and the attempts; never a credential.
TEST_F(Faults, PersistentSlowDownIsReportedWithObjectStatusAndCode) {
  Rules(R"([{"action": "status", "status": 503, "code": "SlowDown",
             "message": "Please reduce your request rate.", "times": null}])");
  ClientOptions o = Options();
  o.retry.max_attempts = 4;
  auto c = Client(o);
  absl::StatusOr<std::string> got = c->GetObject(bucket_, "obj");
  EXPECT_THAT(got, StatusIs(absl::StatusCode::kUnavailable,
                            absl::StrCat("GetObject s3://", bucket_,
                                         "/obj: HTTP 503 SlowDown: Please "
                                         "reduce your request rate. (request "
                                         "id fault-proxy) (gave up after 4 "
                                         "attempts in ")));
  EXPECT_THAT(Hits(), ElementsAre(4));
  const std::string msg(got.status().message());
  EXPECT_THAT(msg, Not(HasSubstr(server_->user.secret_access_key)));
  EXPECT_THAT(msg, Not(HasSubstr(server_->user.access_key_id)));
}

TEST_F(Faults, RetriesAreBoundedInTime) {
  Rules(R"([{"action": "status", "status": 500, "times": null}])");
  ClientOptions o = Options();
  o.retry.max_attempts = 1000;
  o.retry.initial_backoff = absl::Milliseconds(100);
  o.retry.max_backoff = absl::Milliseconds(200);
  o.retry.max_total = absl::Milliseconds(800);
  auto c = Client(o);
  const absl::Time start = absl::Now();
  EXPECT_THAT(c->GetObject(bucket_, "obj"),
              StatusIs(absl::StatusCode::kUnavailable, "gave up after"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_LT(c->counters().requests, 100u);
}

// 403 and 404 say what is: never retried.
TEST_F(Faults, ForbiddenAndNotFoundAreNotRetried) {
  Rules(R"([{"action": "status", "status": 403, "code": "AccessDenied",
             "path": "/obj", "times": null},
            {"action": "status", "status": 404, "code": "NoSuchKey",
             "path": "/gone", "times": null}])");
  auto c = Client(Options());
  EXPECT_THAT(c->GetObject(bucket_, "obj"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       absl::StrCat("GetObject s3://", bucket_,
                                    "/obj: HTTP 403 AccessDenied")));
  EXPECT_THAT(c->HeadObject(bucket_, "gone"),
              StatusIs(absl::StatusCode::kNotFound, "HTTP 404"));
  EXPECT_THAT(Hits(), ElementsAre(1, 1));
  EXPECT_EQ(c->counters().requests, 2u);
}

// Regression: a HEAD answered 400 has no body, so no S3 code: the error is
// still InvalidArgument naming the object and the status, after one
// attempt (a 400 without a code is not RequestTimeout).
TEST_F(Faults, HeadAnsweredWithBodiless400NamesObjectAndStatus) {
  Rules(R"([{"action": "status", "status": 400, "code": "BadRequest",
             "method": "HEAD", "times": null}])");
  auto c = Client(Options());
  EXPECT_THAT(
      c->HeadObject(bucket_, "obj"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               absl::StrCat("HeadObject s3://", bucket_, "/obj: HTTP 400")));
  EXPECT_THAT(Hits(), ElementsAre(1));
  EXPECT_EQ(c->counters().requests, 1u);
}

// An answer held past the client's timeout: the attempt fails and the
// next one gets the data.
TEST_F(Faults, SlowAnswerTimesOutAndIsRetried) {
  Rules(R"([{"action": "delay", "seconds": 3, "method": "GET", "times": 1}])");
  ClientOptions o = Options();
  o.request_timeout = absl::Seconds(1);
  auto c = Client(o);
  std::string buf(5000, '\0');
  CKPT_ASSERT_OK(c->GetRange(bucket_, "obj", 1000, 5000, buf.data()));
  EXPECT_EQ(buf, data_.substr(1000, 5000));
  EXPECT_EQ(c->counters().retries, 1u);
}

TEST_F(Faults, StalledAnswerTripsTheLowSpeedLimit) {
  Rules(R"([{"action": "delay", "seconds": 3, "method": "GET", "times": 1}])");
  ClientOptions o = Options();
  o.low_speed_time = absl::Seconds(1);
  auto c = Client(o);
  CKPT_ASSERT_OK_AND_ASSIGN(std::string got, c->GetObject(bucket_, "obj"));
  EXPECT_TRUE(got == data_);
  EXPECT_EQ(c->counters().retries, 1u);
}

// A connection dropped mid-body: retried, and what comes back is whole.
TEST_F(Faults, DroppedMidBodyIsRetriedNeverTruncated) {
  Rules(R"([{"action": "truncate", "keep_bytes": 1000, "method": "GET",
             "times": 2}])");
  auto c = Client(Options());
  CKPT_ASSERT_OK_AND_ASSIGN(std::string got, c->GetObject(bucket_, "obj"));
  ASSERT_EQ(got.size(), data_.size());
  EXPECT_TRUE(got == data_);
  std::string buf(50000, '\0');
  Rules(R"([{"action": "truncate", "keep_bytes": 100, "method": "GET",
             "times": 1}])");
  CKPT_ASSERT_OK(c->GetRange(bucket_, "obj", 7, 50000, buf.data()));
  EXPECT_TRUE(buf == data_.substr(7, 50000));
  EXPECT_EQ(c->counters().retries, 3u);
}

// Dropped on every attempt: an error, never the 1000 bytes that came.
TEST_F(Faults, AlwaysDroppedMidBodyIsAnError) {
  Rules(R"([{"action": "truncate", "keep_bytes": 1000, "method": "GET",
             "times": null}])");
  ClientOptions o = Options();
  o.retry.max_attempts = 3;
  auto c = Client(o);
  absl::StatusOr<std::string> got = c->GetObject(bucket_, "obj");
  EXPECT_THAT(got,
              StatusIs(absl::StatusCode::kUnavailable,
                       absl::StrCat("GetObject s3://", bucket_, "/obj: ")));
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("gave up after 3 attempts"));
  std::string buf(50000, 'z');
  EXPECT_THAT(c->GetRange(bucket_, "obj", 0, 50000, buf.data()),
              StatusIs(absl::StatusCode::kUnavailable, "(bytes 0-49999)"));
}

TEST_F(Faults, ResetWithoutAnswerIsRetried) {
  Rules(R"([{"action": "reset", "method": "PUT", "times": 1},
            {"action": "reset", "method": "HEAD", "times": 1}])");
  auto c = Client(Options());
  CKPT_ASSERT_OK(c->PutObject(bucket_, "after-reset", data_));
  CKPT_ASSERT_OK_AND_ASSIGN(ObjectInfo info,
                            c->HeadObject(bucket_, "after-reset"));
  EXPECT_EQ(info.size, data_.size());
  EXPECT_THAT(Hits(), ElementsAre(1, 1));
  EXPECT_TRUE(direct_->GetObject(bucket_, "after-reset").value() == data_);
}

// The commit point's hard case: the conditional PUT succeeded on the
// server but its answer was lost (held past the timeout); the retry is
// refused with 412 because the object now exists. The client tells its
// own write (same bytes) from another writer's and reports success; a
// later writer is still refused.
TEST_F(Faults, ConditionalPutWhoseAnswerWasLostIsStillOurs) {
  Rules(R"([{"action": "delay", "seconds": 3, "method": "PUT",
             "path": "MANIFEST", "times": 1}])");
  ClientOptions o = Options();
  o.request_timeout = absl::Seconds(1);
  std::vector<long> statuses;  // one thread: no lock needed
  auto c = S3Client::Create(o, [&](const RequestRecord& r) {
             statuses.push_back(r.http_status);
           }).value();
  PutOptions once;
  once.if_none_match = true;
  CKPT_ASSERT_OK(c->PutObject(bucket_, "step/MANIFEST", "ours", once));
  // Timed out (no status), refused (412), then the HEAD that shows the
  // object is ours.
  EXPECT_THAT(statuses, ElementsAre(0, 412, 200));
  EXPECT_THAT(c->PutObject(bucket_, "step/MANIFEST", "theirs", once),
              StatusIs(absl::StatusCode::kAlreadyExists, "If-None-Match"));
  EXPECT_EQ(direct_->GetObject(bucket_, "step/MANIFEST").value(), "ours");
}

// Regression: the same when the connection is reset after the server
// stored the object. libcurl sends the PUT again on a new connection within
// the same attempt, so the refusal (412) comes on the first attempt; the
// save of a whole checkpoint through the proxy failed its commit with
// AlreadyExists on it.
TEST_F(Faults, ConditionalPutWhoseConnectionWasResetIsStillOurs) {
  Rules(R"([{"action": "reset", "method": "PUT", "path": "MANIFEST",
             "times": 1}])");
  std::vector<long> statuses;  // one thread: no lock needed
  auto c = S3Client::Create(Options(), [&](const RequestRecord& r) {
             statuses.push_back(r.http_status);
           }).value();
  PutOptions once;
  once.if_none_match = true;
  CKPT_ASSERT_OK(c->PutObject(bucket_, "step/MANIFEST", "ours", once));
  // Refused, then the HEAD that shows the object is ours.
  ASSERT_GE(statuses.size(), 2u);
  EXPECT_EQ(statuses[statuses.size() - 2], 412);
  EXPECT_EQ(statuses.back(), 200);
  EXPECT_THAT(c->PutObject(bucket_, "step/MANIFEST", "theirs", once),
              StatusIs(absl::StatusCode::kAlreadyExists, "If-None-Match"));
  EXPECT_EQ(direct_->GetObject(bucket_, "step/MANIFEST").value(), "ours");
}

// The same for a multipart upload's completion.
TEST_F(Faults, ConditionalCompleteWhoseAnswerWasLostIsStillOurs) {
  Rules(R"([{"action": "delay", "seconds": 3, "method": "POST",
             "path": "uploadId=", "times": 1}])");
  ClientOptions o = Options();
  o.request_timeout = absl::Seconds(1);
  auto c = Client(o);
  ObjectWriterOptions wo;
  wo.part_size = kMinPartSize;
  wo.if_none_match = true;
  auto w = ObjectWriter::Create(c.get(), bucket_, "big", wo).value();
  const std::string big = RandomBytes(kMinPartSize + 10, 9);
  CKPT_ASSERT_OK(w->PWrite(0, big));
  CKPT_ASSERT_OK(w->Close());
  EXPECT_THAT(Hits(), ElementsAre(1));
  EXPECT_TRUE(direct_->GetObject(bucket_, "big").value() == big);
}

// Parts of a multipart upload: a part dropped mid-request and a part
// refused with 503 are sent again; the object is exact.
TEST_F(Faults, MultipartPartsAreRetried) {
  Rules(R"([{"action": "reset", "method": "PUT", "path": "partNumber=2&",
             "times": 1},
            {"action": "status", "status": 503, "code": "SlowDown",
             "method": "PUT", "path": "partNumber=1&", "times": 2}])");
  auto c = Client(Options());
  ObjectWriterOptions wo;
  wo.part_size = kMinPartSize;
  auto w = ObjectWriter::Create(c.get(), bucket_, "parts", wo).value();
  const std::string big = RandomBytes(2 * kMinPartSize + 3, 11);
  CKPT_ASSERT_OK(w->PWrite(0, big));
  CKPT_ASSERT_OK(w->Close());
  EXPECT_THAT(Hits(), ElementsAre(1, 2));
  EXPECT_EQ(w->parts_uploaded(), 3);
  EXPECT_TRUE(direct_->GetObject(bucket_, "parts").value() == big);
}

// A part refused for good fails Close, which aborts the upload: nothing
// is left that a reader or the bill would see.
TEST_F(Faults, FailedPartAbortsTheUpload) {
  Rules(R"([{"action": "status", "status": 403, "code": "AccessDenied",
             "method": "PUT", "path": "partNumber=2&", "times": null}])");
  auto c = Client(Options());
  ObjectWriterOptions wo;
  wo.part_size = kMinPartSize;
  auto w = ObjectWriter::Create(c.get(), bucket_, "refused", wo).value();
  (void)w->PWrite(0, RandomBytes(3 * kMinPartSize, 12));
  EXPECT_THAT(w->Close(), StatusIs(absl::StatusCode::kPermissionDenied,
                                   absl::StrCat("UploadPart s3://", bucket_,
                                                "/refused: HTTP 403 "
                                                "AccessDenied")));
  EXPECT_TRUE(direct_->ListMultipartUploads(bucket_, "").value().empty());
  EXPECT_THAT(direct_->HeadObject(bucket_, "refused"),
              StatusIs(absl::StatusCode::kNotFound, "404"));
}

// A flipped byte passes S3 (it is the transport's, not the store's): the
// client returns what came. ckpt's block checksums catch it above this
// layer; this pins that the proxy's corruption reaches the caller.
TEST_F(Faults, FlippedByteReachesTheCaller) {
  Rules(R"([{"action": "flip", "offset": 10, "method": "GET", "times": 1}])");
  auto c = Client(Options());
  CKPT_ASSERT_OK_AND_ASSIGN(std::string got, c->GetObject(bucket_, "obj"));
  ASSERT_EQ(got.size(), data_.size());
  EXPECT_EQ(static_cast<unsigned char>(got[10]),
            static_cast<unsigned char>(data_[10]) ^ 0xFF);
}

}  // namespace
}  // namespace ckpt::s3

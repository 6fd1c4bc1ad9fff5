#include "s3/s3_retry.h"

#include "gtest/gtest.h"

namespace ckpt::s3 {
namespace {

TEST(Backoff, ExponentialCappedAndJittered) {
  RetryPolicy p;
  p.initial_backoff = absl::Milliseconds(100);
  p.max_backoff = absl::Seconds(1);
  EXPECT_EQ(Backoff(p, 1, 0.5), absl::Milliseconds(50));
  EXPECT_EQ(Backoff(p, 2, 0.5), absl::Milliseconds(100));
  EXPECT_EQ(Backoff(p, 3, 0.5), absl::Milliseconds(200));
  EXPECT_EQ(Backoff(p, 5, 0.999), absl::Milliseconds(999));   // capped at 1 s
  EXPECT_EQ(Backoff(p, 1000, 0.5), absl::Milliseconds(500));  // no overflow
  EXPECT_EQ(Backoff(p, 3, 0.0), absl::ZeroDuration());        // full jitter
}

TEST(IsRetryableHttp, TransientFailuresOnly) {
  for (long s : {500L, 502L, 503L, 504L, 429L}) {
    EXPECT_TRUE(IsRetryableHttp(s, "")) << s;
  }
  EXPECT_TRUE(IsRetryableHttp(503, "SlowDown"));
  EXPECT_TRUE(IsRetryableHttp(400, "RequestTimeout"));
  EXPECT_TRUE(IsRetryableHttp(409, "ConditionalRequestConflict"));
  // Never an answer that says what is: no permission, no object.
  for (long s : {400L, 401L, 403L, 404L, 405L, 409L, 412L, 416L}) {
    EXPECT_FALSE(IsRetryableHttp(s, "")) << s;
  }
  EXPECT_FALSE(IsRetryableHttp(403, "SignatureDoesNotMatch"));
  EXPECT_FALSE(IsRetryableHttp(404, "NoSuchKey"));
}

}  // namespace
}  // namespace ckpt::s3

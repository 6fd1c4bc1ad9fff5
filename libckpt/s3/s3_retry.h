// When an S3 request is tried again: the policy (bounded in attempts and in
// total time), the backoff (exponential with full jitter), and which
// failures are transient.
#ifndef CKPT_S3_S3_RETRY_H_
#define CKPT_S3_S3_RETRY_H_

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt::s3 {

struct RetryPolicy {
  // Attempts per request, the first one included (1: never retry).
  int max_attempts = 8;
  // The n-th retry waits a uniformly random time in
  // [0, min(max_backoff, initial_backoff * 2^(n-1))).
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(10);
  // No retry starts once this much time has passed since the first attempt
  // began (an attempt in progress is bounded by the client's timeouts).
  absl::Duration max_total = absl::Seconds(120);
};

// The wait before retry number `retry` (1 for the first retry), drawn with
// `uniform01`, a number in [0, 1).
absl::Duration Backoff(const RetryPolicy& policy, int retry, double uniform01);

// Whether a response with this HTTP status and S3 error code is worth
// another attempt: 500, 502, 503 (SlowDown among them), 504 and 429; 400
// RequestTimeout (the server gave up waiting for the body); 409
// ConditionalRequestConflict (a conditional write raced another: the retry
// gets the definite answer). Never 403 or 404.
bool IsRetryableHttp(long status, absl::string_view s3_code);

}  // namespace ckpt::s3

#endif  // CKPT_S3_S3_RETRY_H_

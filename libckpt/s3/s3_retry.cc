#include "s3/s3_retry.h"

#include <algorithm>

namespace ckpt::s3 {

absl::Duration Backoff(const RetryPolicy& policy, int retry, double uniform01) {
  absl::Duration cap = policy.initial_backoff;
  for (int i = 1; i < retry && cap < policy.max_backoff; ++i) cap *= 2;
  cap = std::min(cap, policy.max_backoff);
  return cap * std::clamp(uniform01, 0.0, 1.0);
}

bool IsRetryableHttp(long status, absl::string_view s3_code) {
  switch (status) {
    case 500:
    case 502:
    case 503:
    case 504:
    case 429:
      return true;
    case 400:
      return s3_code == "RequestTimeout";
    case 409:
      return s3_code == "ConditionalRequestConflict";
    default:
      return false;
  }
}

}  // namespace ckpt::s3

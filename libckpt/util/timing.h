// Durations as the reports of saves and loads give them: seconds, as a
// double, on the steady clock.
#ifndef CKPT_LIBCKPT_UTIL_TIMING_H_
#define CKPT_LIBCKPT_UTIL_TIMING_H_

#include <chrono>

namespace ckpt::internal {

// Seconds from `since` to now.
inline double SecondsSince(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_UTIL_TIMING_H_

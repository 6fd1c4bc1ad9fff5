// Helpers shared by the libFuzzer targets in fuzz/.
#ifndef CKPT_FUZZ_FUZZ_UTIL_H_
#define CKPT_FUZZ_FUZZ_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/string_view.h"

// An invariant of the codec that every input must keep (round trips,
// documented guarantees). On failure: a message, then __builtin_trap(),
// which libFuzzer reports as a crash and saves the input for.
#define FUZZ_CHECK(cond)                                               \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, \
                   __LINE__, #cond);                                   \
      __builtin_trap();                                                \
    }                                                                  \
  } while (0)

namespace ckpt::fuzz {

inline absl::string_view AsView(const uint8_t* data, size_t size) {
  return absl::string_view(reinterpret_cast<const char*>(data), size);
}

}  // namespace ckpt::fuzz

#endif  // CKPT_FUZZ_FUZZ_UTIL_H_

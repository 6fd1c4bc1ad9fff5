// util/copy.h: CopyForLater gives memcpy's bytes for every size and
// alignment, streamed or not.
#include "util/copy.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt::internal {
namespace {

std::vector<uint8_t> Pattern(size_t n) {
  std::vector<uint8_t> v(n);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (auto& b : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

// Every destination and source misalignment of a 32-byte line, sizes on
// both sides of the streaming threshold and of the 128-byte step, each
// copy checked whole and the bytes around it untouched.
TEST(CopyForLaterTest, GivesMemcpysBytesForEverySizeAndAlignment) {
  const std::vector<size_t> sizes = {0,
                                     1,
                                     127,
                                     kStreamingCopyMin - 1,
                                     kStreamingCopyMin,
                                     kStreamingCopyMin + 1,
                                     kStreamingCopyMin + 127,
                                     kStreamingCopyMin + 128,
                                     (size_t{4} << 20) + 37};
  const size_t pad = 64;
  const std::vector<uint8_t> src = Pattern((size_t{4} << 20) + 37 + 2 * pad);
  std::vector<uint8_t> dst(src.size() + 2 * pad);
  for (size_t n : sizes) {
    for (size_t da : {0, 1, 7, 16, 31}) {
      for (size_t sa : {0, 3, 32}) {
        std::memset(dst.data(), 0xAB, dst.size());
        CopyForLater(dst.data() + pad + da, src.data() + sa, n);
        ASSERT_EQ(std::memcmp(dst.data() + pad + da, src.data() + sa, n), 0)
            << "n " << n << " dst+" << da << " src+" << sa;
        for (size_t i = 0; i < pad + da; ++i) ASSERT_EQ(dst[i], 0xAB) << i;
        for (size_t i = pad + da + n; i < pad + da + n + pad; ++i) {
          ASSERT_EQ(dst[i], 0xAB) << "n " << n << " byte " << i;
        }
      }
    }
  }
}

#if defined(__x86_64__)
TEST(CopyForLaterTest, StreamsWhereTheCpuHasAvx2) {
  EXPECT_EQ(StreamingCopySupported(), __builtin_cpu_supports("avx2") != 0);
}
#endif

}  // namespace
}  // namespace ckpt::internal

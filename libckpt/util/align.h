// Rounding up to a multiple (offsets of blocks, buffers and items).
#ifndef CKPT_LIBCKPT_UTIL_ALIGN_H_
#define CKPT_LIBCKPT_UTIL_ALIGN_H_

#include <cstdint>

namespace ckpt::internal {

// The least multiple of `a` that is at least `x`. REQUIRES: a > 0, and the
// result fits in 64 bits.
constexpr uint64_t AlignUp(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_UTIL_ALIGN_H_

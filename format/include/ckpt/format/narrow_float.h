// The narrow floating-point element types of spec/FORMAT.md §9 (float16,
// bfloat16, float8_e4m3fn, float8_e5m2) decoded to double, from their bits
// (little-endian on disk; the caller loads them). Pure computation.
//
// Every value of each type is exactly representable as a double. A NaN
// stays a NaN with its sign (not its payload); float8_e4m3fn has no
// infinities and only the NaNs S.1111.111.
#ifndef CKPT_FORMAT_NARROW_FLOAT_H_
#define CKPT_FORMAT_NARROW_FLOAT_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace ckpt::format {

// IEEE 754 binary16: 1 sign, 5 exponent (bias 15), 10 fraction bits.
inline double Float16ToDouble(uint16_t bits) {
  const int exp = (bits >> 10) & 0x1f, frac = bits & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(frac, -24);  // subnormal: frac / 2^10 * 2^-14
  } else if (exp == 31) {
    v = frac != 0 ? std::numeric_limits<double>::quiet_NaN()
                  : std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(1024 + frac, exp - 25);  // (1 + frac / 2^10) * 2^(exp - 15)
  }
  return (bits >> 15) != 0 ? -v : v;
}

// bfloat16: the top 16 bits of an IEEE 754 binary32.
inline double BFloat16ToDouble(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// OCP float8 E4M3FN: 1 sign, 4 exponent (bias 7), 3 fraction bits.
inline double Float8E4M3FNToDouble(uint8_t bits) {
  const int exp = (bits >> 3) & 0xf, frac = bits & 0x7;
  double v;
  if (exp == 15 && frac == 7) {
    v = std::numeric_limits<double>::quiet_NaN();  // no infinities
  } else if (exp == 0) {
    v = std::ldexp(frac, -9);  // frac / 2^3 * 2^-6
  } else {
    v = std::ldexp(8 + frac, exp - 10);  // (1 + frac / 2^3) * 2^(exp - 7)
  }
  return (bits >> 7) != 0 ? -v : v;
}

// OCP float8 E5M2: 1 sign, 5 exponent (bias 15), 2 fraction bits (IEEE-like).
inline double Float8E5M2ToDouble(uint8_t bits) {
  const int exp = (bits >> 2) & 0x1f, frac = bits & 0x3;
  double v;
  if (exp == 31) {
    v = frac != 0 ? std::numeric_limits<double>::quiet_NaN()
                  : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(frac, -16);  // frac / 2^2 * 2^-14
  } else {
    v = std::ldexp(4 + frac, exp - 17);  // (1 + frac / 2^2) * 2^(exp - 15)
  }
  return (bits >> 7) != 0 ? -v : v;
}

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_NARROW_FLOAT_H_

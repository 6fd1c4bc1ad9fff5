#include "ckpt/ops/compare.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"

namespace ckpt::ops {
namespace {

std::string U16(uint16_t v) {
  return std::string{char(v & 0xff), char(v >> 8)};
}
std::string U8(uint8_t v) { return std::string(1, char(v)); }
template <typename T>
std::string Bytes(std::initializer_list<T> vals) {
  std::string out;
  for (T v : vals) out.append(reinterpret_cast<const char*>(&v), sizeof(T));
  return out;
}

double F16(uint16_t v) {
  return ElementToDouble(DType::kFloat16, U16(v).data());
}
double BF16(uint16_t v) {
  return ElementToDouble(DType::kBFloat16, U16(v).data());
}
double E4M3(uint8_t v) {
  return ElementToDouble(DType::kFloat8E4M3FN, U8(v).data());
}
double E5M2(uint8_t v) {
  return ElementToDouble(DType::kFloat8E5M2, U8(v).data());
}

TEST(ElementToDouble, Float16) {
  EXPECT_EQ(F16(0x3c00), 1.0);
  EXPECT_EQ(F16(0xc000), -2.0);
  EXPECT_EQ(F16(0x7bff), 65504.0);
  EXPECT_EQ(F16(0x0001), std::ldexp(1.0, -24));  // smallest subnormal
  EXPECT_EQ(F16(0x0400), std::ldexp(1.0, -14));  // smallest normal
  EXPECT_EQ(F16(0x7c00), std::numeric_limits<double>::infinity());
  EXPECT_EQ(F16(0xfc00), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(F16(0x7e00)));
  EXPECT_TRUE(std::signbit(F16(0x8000)));
}

TEST(ElementToDouble, BFloat16) {
  EXPECT_EQ(BF16(0x3f80), 1.0);
  EXPECT_EQ(BF16(0xc040), -3.0);
  EXPECT_EQ(BF16(0x7f80), std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(BF16(0x7fc0)));
}

TEST(ElementToDouble, Float8E4M3FN) {
  EXPECT_EQ(E4M3(0x38), 1.0);    // exponent 7 = bias
  EXPECT_EQ(E4M3(0x7e), 448.0);  // largest finite
  EXPECT_EQ(E4M3(0xfe), -448.0);
  EXPECT_EQ(E4M3(0x01), std::ldexp(1.0, -9));  // smallest subnormal
  EXPECT_EQ(E4M3(0x08), std::ldexp(1.0, -6));  // smallest normal
  EXPECT_EQ(E4M3(0x78), 256.0);                // S.1111.000 is finite
  EXPECT_TRUE(std::isnan(E4M3(0x7f)));
  EXPECT_TRUE(std::isnan(E4M3(0xff)));
}

TEST(ElementToDouble, Float8E5M2) {
  EXPECT_EQ(E5M2(0x3c), 1.0);
  EXPECT_EQ(E5M2(0x7b), 57344.0);
  EXPECT_EQ(E5M2(0x01), std::ldexp(1.0, -16));
  EXPECT_EQ(E5M2(0x7c), std::numeric_limits<double>::infinity());
  EXPECT_EQ(E5M2(0xfc), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(E5M2(0x7d)));
  EXPECT_TRUE(std::isnan(E5M2(0x7f)));
}

TEST(ElementToDouble, Integers) {
  EXPECT_EQ(ElementToDouble(DType::kInt8, U8(0xff).data()), -1.0);
  EXPECT_EQ(ElementToDouble(DType::kUInt8, U8(0xff).data()), 255.0);
  EXPECT_EQ(ElementToDouble(DType::kInt16, U16(0x8000).data()), -32768.0);
  EXPECT_EQ(ElementToDouble(DType::kBool, U8(2).data()), 1.0);
}

TEST(ElementToString, ExactIntegersAndRoundTripFloats) {
  std::string i64 = Bytes<int64_t>({std::numeric_limits<int64_t>::min()});
  EXPECT_EQ(ElementToString(DType::kInt64, i64.data()), "-9223372036854775808");
  std::string u64 = Bytes<uint64_t>({~0ull});
  EXPECT_EQ(ElementToString(DType::kUInt64, u64.data()),
            "18446744073709551615");
  std::string f = Bytes<float>({0.1f});
  EXPECT_EQ(ElementToString(DType::kFloat32, f.data()), "0.100000001");
  std::string d = Bytes<double>({0.1});
  EXPECT_EQ(ElementToString(DType::kFloat64, d.data()), "0.10000000000000001");
  EXPECT_EQ(ElementToString(DType::kFloat16, U16(0xfc00).data()), "-inf");
  EXPECT_EQ(ElementToString(DType::kFloat8E4M3FN, U8(0x7f).data()), "nan");
  EXPECT_EQ(ElementToString(DType::kBool, U8(1).data()), "true");
}

CompareStats Compare(DType d, const std::string& a, const std::string& b,
                     Tolerance tol = {}) {
  CompareStats s;
  CompareElements(d, a.data(), b.data(), a.size() / DTypeSize(d), 100, tol, &s);
  return s;
}

TEST(CompareElements, ExactEqualBuffers) {
  std::string a = Bytes<float>({1, 2, 3});
  CompareStats s = Compare(DType::kFloat32, a, a);
  EXPECT_EQ(s.differing, 0u);
  EXPECT_FALSE(s.has_first);
}

TEST(CompareElements, ExactCountsMaxAndFirst) {
  CompareStats s = Compare(DType::kFloat32, Bytes<float>({1, 2, 3, 4}),
                           Bytes<float>({1, 2.5, 3, 1}));
  EXPECT_EQ(s.differing, 2u);
  EXPECT_EQ(s.max_abs_diff, 3.0);
  ASSERT_TRUE(s.has_first);
  EXPECT_EQ(s.first_index, 101u);
  EXPECT_EQ(s.first_a, "2");
  EXPECT_EQ(s.first_b, "2.5");
}

TEST(CompareElements, ExactModeIsBitwise) {
  // +0 and -0 differ bitwise (difference 0); NaN with the same bits is equal.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CompareStats s = Compare(DType::kFloat32, Bytes<float>({0.0f, nan}),
                           Bytes<float>({-0.0f, nan}));
  EXPECT_EQ(s.differing, 1u);
  EXPECT_EQ(s.max_abs_diff, 0.0);
  EXPECT_EQ(s.first_index, 100u);
}

TEST(CompareElements, ExactModeNaNPayloadsDiffer) {
  uint32_t n1 = 0x7fc00000, n2 = 0x7fc00001;
  CompareStats s =
      Compare(DType::kFloat32, Bytes<uint32_t>({n1}), Bytes<uint32_t>({n2}));
  EXPECT_EQ(s.differing, 1u);
  EXPECT_EQ(s.max_abs_diff, 0.0);
}

TEST(CompareElements, NaNAgainstNumberIsInfiniteDifference) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CompareStats s = Compare(DType::kFloat32, Bytes<float>({nan}),
                           Bytes<float>({1}), {1e9, 0});
  EXPECT_EQ(s.differing, 1u);
  EXPECT_TRUE(std::isinf(s.max_abs_diff));
}

TEST(CompareElements, ToleranceIsLikeIsClose) {
  Tolerance tol{0.1, 0.01};
  // |a - b| <= 0.1 + 0.01 * |b|: 100 vs 101 is within 0.1 + 1.01.
  EXPECT_EQ(Compare(DType::kFloat32, Bytes<float>({1.0f, 100}),
                    Bytes<float>({1.05f, 101}), tol)
                .differing,
            0u);
  CompareStats s = Compare(DType::kFloat32, Bytes<float>({1.0f}),
                           Bytes<float>({1.25f}), tol);
  EXPECT_EQ(s.differing, 1u);
  EXPECT_EQ(s.max_abs_diff, 0.25);
}

TEST(CompareElements, ToleranceNaNsAndInfinities) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  uint32_t other_nan = 0xffc00001;
  std::string a = Bytes<float>({nan, inf, -0.0f});
  std::string b = Bytes<uint32_t>({other_nan}) + Bytes<float>({inf, 0.0f});
  EXPECT_EQ(Compare(DType::kFloat32, a, b, {1e-3, 0}).differing, 0u);
  // An infinity equals only the same infinity, even with a large rtol.
  CompareStats s = Compare(DType::kFloat32, Bytes<float>({inf, -inf}),
                           Bytes<float>({1e30f, inf}), {0, 10});
  EXPECT_EQ(s.differing, 2u);
  EXPECT_TRUE(std::isinf(s.max_abs_diff));
}

TEST(CompareElements, IntegersUseExactDifference) {
  const int64_t lo = std::numeric_limits<int64_t>::min(),
                hi = std::numeric_limits<int64_t>::max();
  CompareStats s =
      Compare(DType::kInt64, Bytes<int64_t>({lo, 5}), Bytes<int64_t>({hi, 5}));
  EXPECT_EQ(s.differing, 1u);
  EXPECT_EQ(s.max_abs_diff, 18446744073709551615.0);
  EXPECT_EQ(
      Compare(DType::kInt16, Bytes<int16_t>({-3}), Bytes<int16_t>({-1}), {2, 0})
          .differing,
      0u);
  EXPECT_EQ(Compare(DType::kUInt8, U8(0), U8(255), {254, 0}).differing, 1u);
}

TEST(CompareElements, BoolExactBytesToleranceTruth) {
  EXPECT_EQ(Compare(DType::kBool, U8(2), U8(1)).differing, 1u);
  EXPECT_EQ(Compare(DType::kBool, U8(2), U8(1), {0.5, 0}).differing, 0u);
  CompareStats s = Compare(DType::kBool, U8(0), U8(1), {0.5, 0});
  EXPECT_EQ(s.differing, 1u);
  EXPECT_EQ(s.first_a, "false");
}

TEST(CompareElements, LowPrecisionFloatsWithTolerance) {
  // bfloat16 1.0 (0x3f80) vs 1.0078125 (0x3f81): 2^-7 apart.
  std::string a = U16(0x3f80), b = U16(0x3f81);
  EXPECT_EQ(Compare(DType::kBFloat16, a, b).differing, 1u);
  EXPECT_EQ(Compare(DType::kBFloat16, a, b, {0.01, 0}).differing, 0u);
  CompareStats s = Compare(DType::kFloat8E4M3FN, U8(0x38), U8(0x40));  // 1 vs 2
  EXPECT_EQ(s.max_abs_diff, 1.0);
}

}  // namespace
}  // namespace ckpt::ops

#include "ckpt/ops/values.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt::ops {
namespace {

template <typename T>
std::string Bytes(std::vector<T> v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(T));
}

TEST(Float16ToDouble, NormalSubnormalSpecial) {
  EXPECT_EQ(Float16ToDouble(0x3c00), 1.0);
  EXPECT_EQ(Float16ToDouble(0xc000), -2.0);
  EXPECT_EQ(Float16ToDouble(0x7bff), 65504.0);  // largest finite
  EXPECT_EQ(Float16ToDouble(0x0001),
            std::ldexp(1.0, -24));  // smallest subnormal
  EXPECT_EQ(Float16ToDouble(0x8000), 0.0);
  EXPECT_TRUE(std::signbit(Float16ToDouble(0x8000)));
  EXPECT_EQ(Float16ToDouble(0x7c00), HUGE_VAL);
  EXPECT_EQ(Float16ToDouble(0xfc00), -HUGE_VAL);
  EXPECT_TRUE(std::isnan(Float16ToDouble(0x7e00)));
}

TEST(BFloat16ToDouble, IsTheTopHalfOfFloat32) {
  EXPECT_EQ(BFloat16ToDouble(0x3f80), 1.0);
  EXPECT_EQ(BFloat16ToDouble(0xc040), -3.0);
  EXPECT_EQ(BFloat16ToDouble(0x7f80), HUGE_VAL);
  EXPECT_TRUE(std::isnan(BFloat16ToDouble(0x7fc1)));
}

TEST(Float8E4M3FNToDouble, NoInfinityAndOneNaNPattern) {
  EXPECT_EQ(Float8E4M3FNToDouble(0x38), 1.0);
  EXPECT_EQ(Float8E4M3FNToDouble(0xb8), -1.0);
  EXPECT_EQ(Float8E4M3FNToDouble(0x7e), 448.0);  // largest finite
  EXPECT_EQ(Float8E4M3FNToDouble(0x78),
            256.0);  // exponent 15 is a normal exponent
  EXPECT_EQ(Float8E4M3FNToDouble(0x01), std::ldexp(1.0, -9));
  EXPECT_TRUE(std::isnan(Float8E4M3FNToDouble(0x7f)));
  EXPECT_TRUE(std::isnan(Float8E4M3FNToDouble(0xff)));
}

TEST(Float8E5M2ToDouble, FollowsIeee) {
  EXPECT_EQ(Float8E5M2ToDouble(0x3c), 1.0);
  EXPECT_EQ(Float8E5M2ToDouble(0xc0), -2.0);
  EXPECT_EQ(Float8E5M2ToDouble(0x7b), 57344.0);
  EXPECT_EQ(Float8E5M2ToDouble(0x01), std::ldexp(1.0, -16));
  EXPECT_EQ(Float8E5M2ToDouble(0x7c), HUGE_VAL);
  EXPECT_EQ(Float8E5M2ToDouble(0xfc), -HUGE_VAL);
  EXPECT_TRUE(std::isnan(Float8E5M2ToDouble(0x7d)));
  EXPECT_TRUE(std::isnan(Float8E5M2ToDouble(0xfe)));
}

TEST(AccumulateValues, Float32CountsNanAndInfApart) {
  std::string b = Bytes<float>({1.0f, -2.0f, NAN, INFINITY, 3.0f});
  ValueStats s;
  AccumulateValues(DType::kFloat32, b.data(), 5, &s);
  EXPECT_EQ(s.count, 5u);
  EXPECT_EQ(s.finite, 3u);
  EXPECT_EQ(s.nan, 1u);
  EXPECT_EQ(s.inf, 1u);
  EXPECT_EQ(s.min, -2.0);
  EXPECT_EQ(s.max, 3.0);
  EXPECT_DOUBLE_EQ(s.mean(), 2.0 / 3);
  EXPECT_DOUBLE_EQ(s.l2(), std::sqrt(14.0));
}

TEST(AccumulateValues, IntegersAndBool) {
  ValueStats s;
  std::string b = Bytes<int16_t>({-5, 7, 0});
  AccumulateValues(DType::kInt16, b.data(), 3, &s);
  EXPECT_EQ(s.min, -5);
  EXPECT_EQ(s.max, 7);
  ValueStats u;
  b = Bytes<uint64_t>({1, 1ull << 40});
  AccumulateValues(DType::kUInt64, b.data(), 2, &u);
  EXPECT_EQ(u.max, std::ldexp(1.0, 40));
  ValueStats t;
  b = Bytes<uint8_t>({0, 1, 2});  // any nonzero byte is true (§9)
  AccumulateValues(DType::kBool, b.data(), 3, &t);
  EXPECT_EQ(t.max, 1);
  EXPECT_DOUBLE_EQ(t.mean(), 2.0 / 3);
}

TEST(AccumulateValues, EveryDTypeCountsItsElements) {
  for (DType d : kAllDTypes) {
    std::string b(8 * DTypeSize(d), '\0');
    ValueStats s;
    AccumulateValues(d, b.data(), 8, &s);
    EXPECT_EQ(s.count, 8u) << DTypeName(d);
    EXPECT_EQ(s.finite, 8u) << DTypeName(d);
    EXPECT_EQ(s.max, 0) << DTypeName(d);
  }
}

TEST(ValueStats, MergeOfPartsEqualsTheWhole) {
  std::string b = Bytes<double>({4, -1, 2.5, 8});
  ValueStats whole, a, c;
  AccumulateValues(DType::kFloat64, b.data(), 4, &whole);
  AccumulateValues(DType::kFloat64, b.data(), 1, &a);
  AccumulateValues(DType::kFloat64, b.data() + 8, 3, &c);
  a.Merge(c);
  EXPECT_EQ(a.count, whole.count);
  EXPECT_EQ(a.min, whole.min);
  EXPECT_EQ(a.max, whole.max);
  EXPECT_EQ(a.sum, whole.sum);
  EXPECT_DOUBLE_EQ(a.l2(), whole.l2());
  EXPECT_DOUBLE_EQ(whole.l2(), std::sqrt(16 + 1 + 6.25 + 64));
}

TEST(ValueStats, NormDoesNotOverflowBeforeTheResult) {
  std::string b = Bytes<double>({1e300, 1e300});
  ValueStats s;
  AccumulateValues(DType::kFloat64, b.data(), 2, &s);
  EXPECT_DOUBLE_EQ(s.l2(), std::sqrt(2.0) * 1e300);
}

TEST(ValueStats, NoFiniteElements) {
  ValueStats s;
  EXPECT_TRUE(std::isnan(s.mean()));
  EXPECT_EQ(s.l2(), 0);
}

TEST(CountNonFinite, EachFloatingType) {
  std::string f32 = Bytes<float>({1, NAN, INFINITY, -INFINITY});
  NonFiniteCount c = CountNonFinite(DType::kFloat32, f32.data(), 4);
  EXPECT_EQ(c.nan, 1u);
  EXPECT_EQ(c.inf, 2u);
  EXPECT_EQ(c.first, 1);
  std::string f64 = Bytes<double>({0, 0, NAN});
  c = CountNonFinite(DType::kFloat64, f64.data(), 3);
  EXPECT_EQ(c.nan, 1u);
  EXPECT_EQ(c.first, 2);
  std::string f16 = Bytes<uint16_t>({0x3c00, 0x7c00, 0x7e00});
  c = CountNonFinite(DType::kFloat16, f16.data(), 3);
  EXPECT_EQ(c.inf, 1u);
  EXPECT_EQ(c.nan, 1u);
  std::string bf16 = Bytes<uint16_t>({0xff80, 0x7fc0, 0x3f80});
  c = CountNonFinite(DType::kBFloat16, bf16.data(), 3);
  EXPECT_EQ(c.inf, 1u);
  EXPECT_EQ(c.nan, 1u);
  EXPECT_EQ(c.first, 0);
  std::string e4m3 =
      Bytes<uint8_t>({0x7e, 0x78, 0x7f, 0xff});  // 448, 256, NaN, NaN
  c = CountNonFinite(DType::kFloat8E4M3FN, e4m3.data(), 4);
  EXPECT_EQ(c.nan, 2u);
  EXPECT_EQ(c.inf, 0u);
  EXPECT_EQ(c.first, 2);
  std::string e5m2 = Bytes<uint8_t>({0x7b, 0x7c, 0xfd});  // max, Inf, NaN
  c = CountNonFinite(DType::kFloat8E5M2, e5m2.data(), 3);
  EXPECT_EQ(c.inf, 1u);
  EXPECT_EQ(c.nan, 1u);
}

TEST(CountNonFinite, IntegersNeverAre) {
  std::string b(16, '\xff');
  NonFiniteCount c = CountNonFinite(DType::kInt32, b.data(), 4);
  EXPECT_EQ(c.nan + c.inf, 0u);
  EXPECT_EQ(c.first, -1);
}

TEST(CompactNumber, Formats) {
  EXPECT_EQ(CompactNumber(0.25), "0.25");
  EXPECT_EQ(CompactNumber(-3), "-3");
  EXPECT_EQ(CompactNumber(1.5e20), "1.5e+20");
  EXPECT_EQ(CompactNumber(1.0 / 3), "0.333333");
  EXPECT_EQ(CompactNumber(NAN), "nan");
  EXPECT_EQ(CompactNumber(-INFINITY), "-inf");
}

}  // namespace
}  // namespace ckpt::ops

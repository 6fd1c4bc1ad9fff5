#include "synth/synth_values.h"

#include <cmath>
#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::synth {
namespace {

SynthTensor Tensor(const std::string& name, DType dtype, Shape shape,
                   ValueKind kind = ValueKind::kWeight) {
  SynthTensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.kind = kind;
  t.numel = 1;
  for (uint64_t d : t.shape) t.numel *= d;
  return t;
}

// Pinned once: any change here changes every synthetic checkpoint and must
// come with a new kValueVersion.
TEST(SynthValues, PinnedBitsAndValues) {
  const uint64_t key = TensorKey(7, "embed.weight");
  EXPECT_EQ(key, 0xdd2f1497c81b522eull);
  EXPECT_EQ(ElementBits(key, 0), 0x57d7515384bdf6f6ull);
  uint16_t v;
  ElementValue(7, "embed.weight", DType::kBFloat16, ValueKind::kWeight, 0, &v);
  EXPECT_EQ(v, 0xbbce);  // -0.00628662
}

TEST(SynthValues, DependOnSeedNameAndIndex) {
  float a, b, c, d;
  ElementValue(1, "w", DType::kFloat32, ValueKind::kWeight, 5, &a);
  ElementValue(2, "w", DType::kFloat32, ValueKind::kWeight, 5, &b);
  ElementValue(1, "v", DType::kFloat32, ValueKind::kWeight, 5, &c);
  ElementValue(1, "w", DType::kFloat32, ValueKind::kWeight, 6, &d);
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  float again;
  ElementValue(1, "w", DType::kFloat32, ValueKind::kWeight, 5, &again);
  EXPECT_EQ(a, again);
}

TEST(SynthValues, DistributionsByKind) {
  for (uint64_t i = 0; i < 4096; ++i) {
    float w, n, m, v;
    ElementValue(3, "t", DType::kFloat32, ValueKind::kWeight, i, &w);
    ElementValue(3, "t", DType::kFloat32, ValueKind::kNorm, i, &n);
    ElementValue(3, "t", DType::kFloat32, ValueKind::kExpAvg, i, &m);
    ElementValue(3, "t", DType::kFloat32, ValueKind::kExpAvgSq, i, &v);
    ASSERT_LE(std::fabs(w), 0.02f);
    ASSERT_TRUE(n >= 0.9f && n <= 1.1f) << n;
    ASSERT_LE(std::fabs(m), 1e-3f);
    ASSERT_TRUE(v >= 0.0f && v <= 1e-6f) << v;
  }
}

TEST(SynthValues, EveryDTypeIsFiniteOrInRange) {
  for (DType d : kAllDTypes) {
    for (uint64_t i = 0; i < 2048; ++i) {
      unsigned char b[8] = {};
      ElementValue(11, "x", d, ValueKind::kWeight, i, b);
      switch (d) {
        case DType::kBool:
          ASSERT_LE(b[0], 1) << i;
          break;
        case DType::kFloat8E4M3FN:
          ASSERT_NE(b[0] & 0x7F, 0x7F) << i;  // NaN
          break;
        case DType::kFloat8E5M2:
          ASSERT_NE(b[0] & 0x7C, 0x7C) << i;  // Inf/NaN
          break;
        case DType::kFloat16: {
          uint16_t h;
          std::memcpy(&h, b, 2);
          ASSERT_TRUE(std::isfinite(HalfToFloat(h)));
          ASSERT_LE(std::fabs(HalfToFloat(h)), 0.0201f);
          break;
        }
        case DType::kBFloat16: {
          uint16_t h;
          std::memcpy(&h, b, 2);
          ASSERT_LE(std::fabs(BFloat16ToFloat(h)), 0.0201f);
          break;
        }
        case DType::kFloat64: {
          double f;
          std::memcpy(&f, b, 8);
          ASSERT_LE(std::fabs(f), 0.02);
          break;
        }
        default:
          break;
      }
    }
  }
}

TEST(SynthValues, HalfConversionRoundsToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(0.1f), 0x2E66);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);  // rounds up to infinity
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)),
            0x0002);  // 1.5 units: tie to even 2
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)),
            0x3C00);  // tie: stays even
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(3.0f, -11)),
            0x3C02);  // tie: rounds to even
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  // Every finite half survives a round trip through float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00) continue;
    ASSERT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(SynthValues, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie: even
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(3.0f, -8)), 0x3F82);  // tie: even
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -9)), 0x3F80);
  EXPECT_EQ(BFloat16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0xC000), -2.0f);
}

TEST(SynthValues, FillRegionMatchesElementValueForBoxesAndFlatRanges) {
  const SynthTensor t =
      Tensor("layers.0.attn.qkv.weight", DType::kBFloat16, {5, 7, 3});
  const std::vector<Region> regions = {Box{{1, 2, 0}, {3, 4, 2}},
                                       FlatRange{17, 50}, FullBox(t.shape),
                                       FlatRange{0, 0}};
  for (const Region& r : regions) {
    SCOPED_TRACE(RegionToString(r));
    std::vector<uint16_t> got(RegionElements(r));
    FillRegion(9, t, r, got.data());
    uint64_t local = 0;
    ForEachRun(t.shape, r, FullBox(t.shape),
               [&](uint64_t l, uint64_t g, uint64_t n) {
                 for (uint64_t i = 0; i < n; ++i) {
                   uint16_t want;
                   ElementValue(9, t.name, t.dtype, t.kind, g + i, &want);
                   EXPECT_EQ(got[l + i], want) << g + i;
                 }
                 local += n;
               });
    EXPECT_EQ(local, got.size());
  }
}

TEST(SynthValues, FirstDifferenceFindsTheLowestGlobalIndex) {
  const SynthTensor t = Tensor("w", DType::kFloat32, {40, 300});
  const Box box{{3, 10}, {20, 250}};
  std::vector<float> data(RegionElements(box));
  FillRegion(5, t, box, data.data());
  EXPECT_FALSE(FirstDifference(5, t, box, data.data()).found);
  EXPECT_TRUE(FirstDifference(6, t, box, data.data()).found);
  // Local (7, 200) and (2, 100) of the box: (2, 100) is first globally.
  data[7 * 250 + 200] += 1.0f;
  data[2 * 250 + 100] += 1.0f;
  Difference d = FirstDifference(5, t, box, data.data());
  ASSERT_TRUE(d.found);
  EXPECT_EQ(d.local_index, 2u * 250 + 100);
  EXPECT_EQ(d.global_index, (3u + 2) * 300 + 10 + 100);
}

TEST(SynthValues, FirstDifferenceInALongFlatRange) {
  const SynthTensor t = Tensor("v", DType::kInt8, {100000});
  const FlatRange f{123, 90000};
  std::string data(f.length, '\0');
  FillRegion(1, t, f, data.data());
  data[20000] ^= 1;  // past the first comparison batch
  Difference d = FirstDifference(1, t, f, data.data());
  ASSERT_TRUE(d.found);
  EXPECT_EQ(d.local_index, 20000u);
  EXPECT_EQ(d.global_index, 20123u);
}

TEST(SynthValues, ObjectBytes) {
  std::string a = ObjectBytes(1, "rng.rank0", 32);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a, ObjectBytes(1, "rng.rank0", 32));
  EXPECT_NE(a, ObjectBytes(1, "rng.rank1", 32));
  EXPECT_NE(a, ObjectBytes(2, "rng.rank0", 32));
  EXPECT_EQ(ObjectBytes(1, "rng.rank0", 8), a.substr(0, 8));
}

TEST(SynthValues, ElementText) {
  uint16_t one = 0x3F80;
  EXPECT_EQ(ElementText(DType::kBFloat16, &one), "0x3f80 (1)");
  uint16_t h = 0x3C00;
  EXPECT_EQ(ElementText(DType::kFloat16, &h), "0x3c00 (1)");
  float f = -0.5f;
  EXPECT_EQ(ElementText(DType::kFloat32, &f), "0xbf000000 (-0.5)");
  int8_t i = -3;
  EXPECT_EQ(ElementText(DType::kInt8, &i), "0xfd (-3)");
  uint8_t e = 0x38;
  EXPECT_EQ(ElementText(DType::kFloat8E4M3FN, &e), "0x38");
}

}  // namespace
}  // namespace ckpt::synth

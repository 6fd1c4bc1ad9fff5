#include "ckpt/ops/local_range.h"

#include <variant>

#include "gtest/gtest.h"
#include "libckpt/test_util.h"

namespace ckpt::ops {
namespace {

using ::ckpt::testing::Extract;
using ::ckpt::testing::LocalIndexOf;
using ::ckpt::testing::ReferenceBytes;

// Every [begin, end) of `region`: the pieces, loaded one after the other,
// are exactly elements [begin, end) of the region's layout.
void CheckAllRanges(const Shape& shape, const Region& region) {
  const std::string global = ReferenceBytes(DType::kUInt16, shape, 7);
  const std::string whole = Extract(global, DType::kUInt16, shape, region);
  const uint64_t n = RegionElements(region);
  const size_t max_pieces = std::holds_alternative<FlatRange>(region)
                                ? 1
                                : std::max<size_t>(1, 2 * shape.size() - 1);
  for (uint64_t b = 0; b <= n; ++b) {
    for (uint64_t e = b; e <= n; ++e) {
      std::vector<Region> parts = LocalRangeToRegions(region, b, e);
      std::string got;
      for (const Region& p : parts) {
        ASSERT_TRUE(ValidateRegion(p, shape).ok()) << RegionToString(p);
        ASSERT_GT(RegionElements(p), 0u) << RegionToString(p);
        got += Extract(global, DType::kUInt16, shape, p);
      }
      ASSERT_EQ(got, whole.substr(b * 2, (e - b) * 2))
          << RegionToString(region) << " [" << b << ", " << e << ")";
      ASSERT_LE(parts.size(), max_pieces)
          << RegionToString(region) << " [" << b << ", " << e;
    }
  }
}

TEST(LocalRangeToRegions, FullBoxes) {
  for (const Shape& s :
       std::vector<Shape>{{7}, {5, 6}, {3, 4, 5}, {2, 3, 2, 3}}) {
    CheckAllRanges(s, FullBox(s));
  }
}

TEST(LocalRangeToRegions, InnerBoxes) {
  CheckAllRanges({5, 6}, Box{{1, 2}, {3, 3}});
  CheckAllRanges({4, 5, 6}, Box{{1, 0, 2}, {2, 5, 3}});
  CheckAllRanges({3, 4, 2, 5}, Box{{0, 1, 1, 1}, {3, 2, 1, 3}});
}

TEST(LocalRangeToRegions, Scalar) {
  std::vector<Region> parts = LocalRangeToRegions(FullBox({}), 0, 1);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(std::get<Box>(parts[0]), FullBox({}));
}

TEST(LocalRangeToRegions, FlatRangeGivesOneRange) {
  std::vector<Region> parts = LocalRangeToRegions(FlatRange{10, 20}, 3, 9);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(std::get<FlatRange>(parts[0]), (FlatRange{13, 6}));
  CheckAllRanges({4, 5}, FlatRange{3, 11});
}

TEST(LocalRangeToRegions, EmptyRangeGivesNothing) {
  EXPECT_TRUE(LocalRangeToRegions(FullBox({4, 4}), 5, 5).empty());
}

TEST(GlobalCoordinates, MatchesBruteForce) {
  const Shape shape{4, 5, 6};
  for (const Region& r : std::vector<Region>{
           FullBox(shape), Box{{1, 2, 3}, {2, 3, 2}}, FlatRange{7, 50}}) {
    for (uint64_t local = 0; local < RegionElements(r); ++local) {
      Dims c = GlobalCoordinates(shape, r, local);
      uint64_t g = (c[0] * 5 + c[1]) * 6 + c[2];
      EXPECT_EQ(LocalIndexOf(shape, r, g), static_cast<int64_t>(local))
          << RegionToString(r);
    }
  }
}

}  // namespace
}  // namespace ckpt::ops

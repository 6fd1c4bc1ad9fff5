#include "ckpt/format/geometry.h"

#include <algorithm>
#include <array>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "testing/geometry_reference.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

using ::ckpt::testing::LocalIndexOf;

Region RandomRegion(std::mt19937_64& rng, const Shape& shape) {
  uint64_t numel = 1;
  for (uint64_t s : shape) numel *= s;
  if (rng() % 2 == 0) {
    uint64_t a = numel ? rng() % (numel + 1) : 0;
    uint64_t b = numel ? rng() % (numel + 1) : 0;
    if (a > b) std::swap(a, b);
    return FlatRange{a, b - a};
  }
  Box b;
  for (uint64_t s : shape) {
    uint64_t x = rng() % (s + 1), y = rng() % (s + 1);
    if (x > y) std::swap(x, y);
    b.offset.push_back(x);
    b.size.push_back(y - x);
  }
  return b;
}

TEST(GeometryTest, ForEachRunMatchesBruteForceOnRandomRegions) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 3000; ++trial) {
    Shape shape;
    int ndim = rng() % 4;
    for (int d = 0; d < ndim; ++d) shape.push_back(rng() % 5);
    Region src = RandomRegion(rng, shape), dst = RandomRegion(rng, shape);
    ASSERT_TRUE(ValidateRegion(src, shape).ok());
    ASSERT_TRUE(ValidateRegion(dst, shape).ok());
    std::vector<std::pair<int64_t, int64_t>> expected, actual;
    uint64_t numel = 1;
    for (uint64_t s : shape) numel *= s;
    for (uint64_t g = 0; g < numel; ++g) {
      int64_t s = LocalIndexOf(shape, src, g), d = LocalIndexOf(shape, dst, g);
      if (s >= 0 && d >= 0) expected.emplace_back(s, d);
    }
    uint64_t last_end = 0;
    bool first = true;
    uint64_t total =
        ForEachRun(shape, src, dst, [&](uint64_t s, uint64_t d, uint64_t n) {
          ASSERT_GT(n, 0u);
          if (!first) {
            EXPECT_GE(s, last_end);  // increasing, coalesced
          }
          first = false;
          last_end = s + n;
          for (uint64_t i = 0; i < n; ++i) actual.emplace_back(s + i, d + i);
        });
    EXPECT_EQ(total, expected.size());
    ASSERT_EQ(actual, expected)
        << "shape " << ShapeToString(shape) << " src " << RegionToString(src)
        << " dst " << RegionToString(dst);
    EXPECT_EQ(IntersectionElements(shape, src, dst), expected.size());
  }
}

TEST(GeometryTest, WholeTensorCopyIsOneRun) {
  Shape shape{64, 32};
  int runs = 0;
  ForEachRun(shape, FullBox(shape), FlatRange{0, 64 * 32},
             [&](uint64_t s, uint64_t d, uint64_t n) {
               ++runs;
               EXPECT_EQ(n, 64u * 32);
             });
  EXPECT_EQ(runs, 1);
}

// A box of whole rows is one run whatever its row count: the walk goes
// over the dims before the whole ones (2^40 rows here, one step), where it
// once stepped row by row.
TEST(GeometryTest, BoxesOfWholeTrailingDimsAreOneRunWithoutARowWalk) {
  const uint64_t rows = uint64_t{1} << 40;
  Shape shape{rows, 4, 2};
  Box src{{0, 0, 0}, {rows, 4, 2}}, dst{{8, 0, 0}, {rows - 8, 4, 2}};
  std::vector<std::array<uint64_t, 3>> runs;
  uint64_t total =
      ForEachRun(shape, src, dst, [&](uint64_t s, uint64_t d, uint64_t n) {
        runs.push_back({s, d, n});
      });
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0], (std::array<uint64_t, 3>{8 * 8, 0, (rows - 8) * 8}));
  EXPECT_EQ(total, (rows - 8) * 8);
  // Against a flat range in the middle of a row block: clipped, one run.
  runs.clear();
  ForEachRun(shape, FlatRange{100, 1000}, dst,
             [&](uint64_t s, uint64_t d, uint64_t n) {
               runs.push_back({s, d, n});
             });
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0], (std::array<uint64_t, 3>{0, 100 - 64, 1000}));
  // A box cut in its last dim still walks its rows, each a run.
  runs.clear();
  ForEachRun(Shape{3, 4}, Box{{0, 1}, {3, 2}}, FullBox(Shape{3, 4}),
             [&](uint64_t s, uint64_t d, uint64_t n) {
               runs.push_back({s, d, n});
             });
  EXPECT_EQ(runs, (std::vector<std::array<uint64_t, 3>>{
                      {0, 1, 2}, {2, 5, 2}, {4, 9, 2}}));
}

TEST(GeometryTest, ScalarTensor) {
  Shape scalar;
  EXPECT_EQ(RegionElements(FullBox(scalar)), 1u);
  EXPECT_EQ(IntersectionElements(scalar, FullBox(scalar), FlatRange{0, 1}), 1u);
  CKPT_EXPECT_OK(CheckCover(scalar, {FullBox(scalar)}, false));
}

TEST(GeometryTest, EmptyTensor) {
  Shape shape{0, 8};
  CKPT_EXPECT_OK(CheckCover(shape, {}, false));
  CKPT_EXPECT_OK(CheckCover(shape, {Box{{0, 0}, {0, 8}}}, false));
}

TEST(GeometryTest, BoxOutsideTensor) {
  EXPECT_THAT(ValidateRegion(Box{{2, 0}, {3, 4}}, Shape{4, 4}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "box [2:5, 0:4] exceeds shape [4, 4] in dim 0"));
}

TEST(GeometryTest, BoxWithWrongRank) {
  EXPECT_THAT(ValidateRegion(Box{{0}, {4}}, Shape{4, 4}),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor has 2"));
}

TEST(GeometryTest, BoxOffsetOverflowIsRejected) {
  Box b{{~0ull - 1}, {4}};
  EXPECT_THAT(ValidateRegion(b, Shape{8}),
              StatusIs(absl::StatusCode::kInvalidArgument, "exceeds shape"));
}

TEST(GeometryTest, FlatRangeOverflowIsRejected) {
  EXPECT_THAT(
      ValidateRegion(FlatRange{~0ull - 2, 10}, Shape{16}),
      StatusIs(absl::StatusCode::kInvalidArgument, "exceeds the 16 elements"));
}

TEST(GeometryTest, ShapeElementCountOverflow) {
  EXPECT_THAT(ValidateShape(Shape{1ull << 32, 1ull << 32}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "overflows int64"));
  EXPECT_THAT(
      ValidateShape(Shape{1ull << 61}, 8),
      StatusIs(absl::StatusCode::kInvalidArgument, "byte count overflows"));
}

TEST(GeometryTest, TooManyDims) {
  Shape shape(33, 1);
  EXPECT_THAT(
      ValidateShape(shape, 4),
      StatusIs(absl::StatusCode::kInvalidArgument, "33 dims; the limit is 32"));
}

TEST(GeometryTest, CoverRowSplit) {
  Shape shape{8, 4};
  CKPT_EXPECT_OK(
      CheckCover(shape, {Box{{0, 0}, {4, 4}}, Box{{4, 0}, {4, 4}}}, false));
}

TEST(GeometryTest, CoverTwoDimGrid) {
  Shape shape{6, 6};
  std::vector<Region> r;
  for (uint64_t i = 0; i < 3; ++i)
    for (uint64_t j = 0; j < 2; ++j) r.push_back(Box{{i * 2, j * 3}, {2, 3}});
  CKPT_EXPECT_OK(CheckCover(shape, r, false));
}

TEST(GeometryTest, CoverUnevenFlat) {
  Shape shape{10, 3};
  CKPT_EXPECT_OK(CheckCover(
      shape, {FlatRange{0, 7}, FlatRange{7, 13}, FlatRange{20, 10}}, false));
}

TEST(GeometryTest, CoverMixedFlatAndBox) {
  Shape shape{4, 4};
  CKPT_EXPECT_OK(
      CheckCover(shape,
                 {Box{{0, 0}, {4, 2}}, FlatRange{2, 2}, FlatRange{6, 2},
                  FlatRange{10, 2}, FlatRange{14, 2}},
                 false));
}

TEST(GeometryTest, OverlappingBoxes) {
  Shape shape{8, 4};
  EXPECT_THAT(
      CheckCover(shape, {Box{{0, 0}, {5, 4}}, Box{{4, 0}, {4, 4}}}, false),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "chunks 0 and 1 overlap in [4:5, 0:4]"));
}

TEST(GeometryTest, OverlappingFlatRanges) {
  EXPECT_THAT(CheckCover(Shape{10}, {FlatRange{0, 6}, FlatRange{5, 5}}, false),
              StatusIs(absl::StatusCode::kInvalidArgument, "overlap"));
}

TEST(GeometryTest, OverlappingFlatAndBox) {
  Shape shape{4, 4};
  EXPECT_THAT(CheckCover(shape, {Box{{0, 0}, {4, 2}}, FlatRange{1, 2}}, true),
              StatusIs(absl::StatusCode::kInvalidArgument, "overlap"));
}

TEST(GeometryTest, GapIsNamed) {
  Shape shape{8, 4};
  EXPECT_THAT(
      CheckCover(shape, {Box{{0, 0}, {4, 4}}, Box{{6, 0}, {2, 4}}}, false),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "e.g. [4:6, 0:4] (8 of 32 elements missing)"));
  CKPT_EXPECT_OK(CheckCover(shape, {Box{{0, 0}, {4, 4}}}, /*allow_gaps=*/true));
}

TEST(GeometryTest, IrregularBoxesUseSweep) {
  // Boxes with staggered boundaries in both dims: the grid would be large
  // relative to the number of boxes only for big inputs; check correctness.
  Shape shape{100, 100};
  std::vector<Region> r;
  for (uint64_t i = 0; i < 100; ++i) r.push_back(Box{{i, 0}, {1, 100}});
  CKPT_EXPECT_OK(CheckCover(shape, r, false));
  r.push_back(Box{{50, 50}, {1, 1}});
  EXPECT_THAT(CheckCover(shape, r, false),
              StatusIs(absl::StatusCode::kInvalidArgument, "overlap"));
}

// Column i of an [n, n] tensor is split at row 1 + (i * 7919) % (n - 1): the
// row boundaries differ from column to column, so the grid would have n^2
// cells and the check falls back to the sweep.
std::vector<Region> StaggeredColumns(uint64_t n) {
  std::vector<Region> r;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t split = 1 + (i * 7919) % (n - 1);
    r.push_back(Box{{0, i}, {split, 1}});
    r.push_back(Box{{split, i}, {n - split, 1}});
  }
  return r;
}

TEST(GeometryTest, CraftedIrregularLayoutIsCheckedQuickly) {
  // Regression: the sweep compared every pair of boxes that overlap along
  // dim 0, here all n boxes that start at row 0: n^2 / 2 comparisons, over
  // 500 million for this size, and quadratic growth beyond it (2^24 chunks
  // would take hours). Now O(n log n).
  const uint64_t n = 1 << 15;
  CKPT_EXPECT_OK(CheckCover(Shape{n, n}, StaggeredColumns(n), false));
}

TEST(GeometryTest, IrregularTwoDimOverlapIsNamed) {
  const uint64_t n = 1000;
  std::vector<Region> r = StaggeredColumns(n);
  std::get<Box>(r[2 * 500 + 1]).offset[0] -= 1;  // lower half of column 500
  std::get<Box>(r[2 * 500 + 1]).size[0] += 1;
  uint64_t split = 1 + (500 * 7919) % (n - 1);
  EXPECT_THAT(CheckCover(Shape{n, n}, r, false),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       absl::StrCat("chunks 1000 and 1001 overlap in [",
                                    split - 1, ":", split, ", 500:501]")));
}

TEST(GeometryTest, IrregularTwoDimGapIsCounted) {
  const uint64_t n = 1000;
  std::vector<Region> r = StaggeredColumns(n);
  Box& b = std::get<Box>(r[2 * 300]);
  b.size[0] -= 1;  // one element of column 300 is left out
  EXPECT_THAT(CheckCover(Shape{n, n}, r, false),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "(1 of 1000000 elements missing)"));
  CKPT_EXPECT_OK(CheckCover(Shape{n, n}, r, /*allow_gaps=*/true));
}

TEST(GeometryTest, IrregularLayoutInTwoOfFourDims) {
  // Dims 0 and 3 are whole in every chunk, so only dims 1 and 2 can
  // separate chunks: still the exact sweep.
  const uint64_t n = 500;
  std::vector<Region> r;
  for (const Region& c : StaggeredColumns(n)) {
    const Box& b = std::get<Box>(c);
    r.push_back(
        Box{{0, b.offset[0], b.offset[1], 0}, {3, b.size[0], b.size[1], 2}});
  }
  CKPT_EXPECT_OK(CheckCover(Shape{3, n, n, 2}, r, false));
  std::get<Box>(r[7]).size[2] = 2;  // column 3 also covers column 4
  EXPECT_THAT(
      CheckCover(Shape{3, n, n, 2}, r, false),
      StatusIs(absl::StatusCode::kInvalidArgument, "overlap in [0:3, "));
}

TEST(GeometryTest, IrregularThreeDimLayoutIsVerified) {
  // Staggered columns in each of 4 planes: all three dims vary, and the
  // sweep runs along dim 2, where few boxes overlap.
  const uint64_t n = 600;
  std::vector<Region> r;
  for (uint64_t p = 0; p < 4; ++p) {
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t split = 1 + (i * 7919 + p * 31) % (n - 1);
      r.push_back(Box{{p, 0, i}, {1, split, 1}});
      r.push_back(Box{{p, split, i}, {1, n - split, 1}});
    }
  }
  CKPT_EXPECT_OK(CheckCover(Shape{4, n, n}, r, false));
  r.push_back(Box{{2, 10, 10}, {1, 1, 1}});
  EXPECT_THAT(CheckCover(Shape{4, n, n}, r, false),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "overlap in [2:3, 10:11, 10:11]"));
}

TEST(GeometryTest, IrregularLayoutTooComplexToVerify) {
  // 4000 large boxes at staggered offsets: every pair overlaps along every
  // dim, so any sweep compares ~8M pairs, more than the budget of
  // 64 * 4000 + 2^22. Refused at once instead of running quadratically.
  std::vector<Region> r;
  for (uint64_t i = 0; i < 4000; ++i) {
    r.push_back(Box{{i % 50, (i / 50) % 50, i % 47}, {900, 900, 900}});
  }
  EXPECT_THAT(
      CheckCover(Shape{1000, 1000, 1000}, r, true),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "irregular chunk layout too complex to verify (4000 chunks)"));
}

// Issue 28: a partial entry of 2^32 elements in 32 dims of 2, a box that
// is not one run, then copies of a flat range that is 63 boxes of 32 dims.
// Cutting every copy into boxes took 70 KB per copy (> 4 GB for 100,000)
// before any check; the copies overlap one another, which is found first,
// among the runs, without making any box.
TEST(GeometryTest, OverlappingFlatRangesAreFoundBeforeAnyBoxIsMade) {
  const Shape shape(32, 2);
  Box irregular = FullBox(shape);
  irregular.size[1] = 1;
  std::vector<Region> r = {irregular};
  r.insert(r.end(), 100000, FlatRange{1, (1ull << 32) - 2});
  EXPECT_THAT(CheckCover(shape, r, /*allow_gaps=*/true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "chunks 1 and 2 overlap in flat[1:4294967295)"));
}

// The same entry with flat ranges that do not overlap, each 39 boxes of 32
// dims: the boxes they would be cut into are counted before any is made,
// and past 2^18 coordinates (+ 8 a flat range) the layout is refused.
TEST(GeometryTest, FlatRangesCutIntoTooManyBoxesAreRefused) {
  const Shape shape(32, 2);
  Box irregular = FullBox(shape);
  irregular.offset[0] = 1;  // the upper half, away from the flat ranges
  irregular.size[0] = 1;
  irregular.size[2] = 1;
  std::vector<Region> r = {irregular};
  for (uint64_t k = 0; k < 1000; ++k) {
    r.push_back(FlatRange{(k << 20) + 1, (1 << 20) - 2});
  }
  EXPECT_THAT(CheckCover(shape, r, /*allow_gaps=*/true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "irregular chunk layout too complex to verify (1001 "
                       "chunks): its flat ranges cut into boxes of 32 dims "
                       "would take more than 270144 coordinates, the limit"));
  r.resize(100);  // 99 ranges: 3861 boxes, 123552 coordinates
  CKPT_EXPECT_OK(CheckCover(shape, r, /*allow_gaps=*/true));
  r.push_back(FlatRange{(1ull << 31) + 3, 1});  // inside the box
  EXPECT_THAT(CheckCover(shape, r, /*allow_gaps=*/true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "chunks 0 and 100 overlap in [1:2, 0:1, 0:1, "));
}

// A flat range that is one box still becomes a box of 32 dims (512 bytes)
// from a record of 13 bytes: those count towards the limit too.
TEST(GeometryTest, FlatRangesOfOneBoxEachCountTowardsTheLimit) {
  const Shape shape(32, 2);
  Box irregular = FullBox(shape);
  irregular.offset[0] = 1;
  irregular.size[0] = 1;
  irregular.size[2] = 1;
  std::vector<Region> r = {irregular};
  for (uint64_t k = 0; k < 20000; ++k) r.push_back(FlatRange{2 * k, 2});
  EXPECT_THAT(CheckCover(shape, r, /*allow_gaps=*/true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "would take more than 422144 coordinates, the limit"));
  r.resize(2001);  // 2000 boxes, 64000 coordinates
  CKPT_EXPECT_OK(CheckCover(shape, r, /*allow_gaps=*/true));
}

// Splits `shape` into `pieces` boxes by cutting a random box along a random
// dim from `dims` at a random position, again and again: an exact cover.
std::vector<Box> GuillotineCover(std::mt19937_64& rng, const Shape& shape,
                                 const std::vector<size_t>& dims, int pieces) {
  std::vector<Box> boxes = {FullBox(shape)};
  for (int tries = 0;
       static_cast<int>(boxes.size()) < pieces && tries < 100 * pieces;
       ++tries) {
    size_t k = rng() % boxes.size();
    size_t d = dims[rng() % dims.size()];
    Box b = boxes[k];
    if (b.size[d] < 2) continue;
    uint64_t cut = 1 + rng() % (b.size[d] - 1);
    Box hi = b;
    b.size[d] = cut;
    hi.offset[d] += cut;
    hi.size[d] -= cut;
    boxes[k] = b;
    boxes.push_back(hi);
  }
  return boxes;
}

TEST(GeometryTest, RandomIrregularCoverAgreesWithPairwiseCheck) {
  // Large shapes and many cuts at random positions make the grid too big,
  // so these go through the sweeps; the reference is a pairwise check.
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 80; ++trial) {
    int ndim = 2 + rng() % 3;
    Shape shape;
    for (int d = 0; d < ndim; ++d) shape.push_back(2000 + rng() % 3000);
    std::vector<size_t> dims;
    for (int d = 0; d < ndim; ++d) {
      if (rng() % 3 != 0) dims.push_back(d);
    }
    if (dims.empty()) dims.push_back(0);
    // Enough pieces that the grid of their boundaries is too large: many
    // when they are cut along one or two dims, fewer along three or more.
    int pieces = dims.size() <= 2 ? 600 + rng() % 300 : 60 + rng() % 200;
    std::vector<Box> boxes = GuillotineCover(rng, shape, dims, pieces);
    switch (rng() % 3) {
      case 0:
        break;  // exact cover
      case 1:
        boxes.erase(boxes.begin() + rng() % boxes.size());  // a gap
        break;
      case 2: {  // grow a box by one along some dim: usually an overlap
        Box& b = boxes[rng() % boxes.size()];
        size_t d = rng() % ndim;
        if (b.offset[d] > 0) {
          --b.offset[d];
          ++b.size[d];
        } else if (b.offset[d] + b.size[d] < shape[d]) {
          ++b.size[d];
        }
        break;
      }
    }
    std::shuffle(boxes.begin(), boxes.end(), rng);
    std::vector<Region> r(boxes.begin(), boxes.end());
    uint64_t numel = 1, volume = 0;
    for (uint64_t s : shape) numel *= s;
    // Plain arrays keep the quadratic reference fast in Debug builds.
    std::vector<std::array<uint64_t, 8>> lohi(boxes.size());
    for (size_t i = 0; i < boxes.size(); ++i) {
      volume += RegionElements(r[i]);
      for (int d = 0; d < ndim; ++d) {
        lohi[i][2 * d] = boxes[i].offset[d];
        lohi[i][2 * d + 1] = boxes[i].offset[d] + boxes[i].size[d];
      }
    }
    bool overlap = false;
    for (size_t i = 0; i < lohi.size() && !overlap; ++i) {
      const uint64_t* a = lohi[i].data();
      for (size_t j = i + 1; j < lohi.size() && !overlap; ++j) {
        const uint64_t* b = lohi[j].data();
        bool meet = true;
        for (int d = 0; d < ndim && meet; ++d) {
          meet = a[2 * d] < b[2 * d + 1] && b[2 * d] < a[2 * d + 1];
        }
        overlap = meet;
      }
    }
    bool gap = !overlap && volume != numel;
    absl::Status s = CheckCover(shape, r, false);
    EXPECT_EQ(s.ok(), !overlap && !gap) << trial << ": " << s;
    if (overlap) {
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, "overlap"));
    }
    absl::Status p = CheckCover(shape, r, true);
    EXPECT_EQ(p.ok(), !overlap) << trial << ": " << p;
  }
}

TEST(GeometryTest, RandomCoverAgreesWithBruteForce) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    Shape shape;
    int ndim = 1 + rng() % 3;
    for (int d = 0; d < ndim; ++d) shape.push_back(1 + rng() % 4);
    uint64_t numel = 1;
    for (uint64_t s : shape) numel *= s;
    std::vector<Region> r;
    int n = rng() % 4;
    for (int i = 0; i < n; ++i) r.push_back(RandomRegion(rng, shape));
    std::vector<int> count(numel, 0);
    for (const Region& reg : r)
      for (uint64_t g = 0; g < numel; ++g)
        if (LocalIndexOf(shape, reg, g) >= 0) ++count[g];
    bool overlap = false, gap = false;
    for (int c : count) {
      overlap |= c > 1;
      gap |= c == 0;
    }
    absl::Status s = CheckCover(shape, r, false);
    EXPECT_EQ(s.ok(), !overlap && !gap) << s;
    absl::Status p = CheckCover(shape, r, true);
    EXPECT_EQ(p.ok(), !overlap) << p;
  }
}

}  // namespace
}  // namespace ckpt

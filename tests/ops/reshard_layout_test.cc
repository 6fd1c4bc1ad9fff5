#include "ckpt/ops/reshard_layout.h"

#include "ckpt/format/status_macros.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::ops {
namespace {

using ::ckpt::testing::StatusIs;
using format::EntryRecord;
using Kind = Split::Kind;

EntryRecord Entry(Shape shape, std::vector<Region> regions, uint8_t flags = 0) {
  EntryRecord e;
  e.name = "t";
  e.dtype = DType::kFloat32;
  e.shape = std::move(shape);
  e.flags = flags;
  for (auto& r : regions) {
    format::ChunkRecord c;
    c.region = r;
    e.chunks.push_back(c);
  }
  return e;
}

Split Infer(const EntryRecord& e, std::string* desc) {
  auto s = InferSplit(e, desc);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : Split{};
}

TEST(InferSplit, WholeChunkIsReplicated) {
  std::string d;
  EXPECT_EQ(Infer(Entry({4, 4}, {FullBox({4, 4})}), &d).kind,
            Kind::kReplicated);
  EXPECT_EQ(d, "whole");
  EXPECT_EQ(Infer(Entry({4, 4}, {FlatRange{0, 16}}), &d).kind,
            Kind::kReplicated);
  EXPECT_EQ(Infer(Entry({}, {FullBox({})}), &d).kind, Kind::kReplicated);
}

TEST(InferSplit, EmptyTensorIsReplicated) {
  std::string d;
  EXPECT_EQ(Infer(Entry({0, 3}, {FullBox({0, 3})}), &d).kind,
            Kind::kReplicated);
  EXPECT_EQ(d, "empty");
}

TEST(InferSplit, UnevenRowsSplitAlongDim0) {
  std::string d;
  Split s = Infer(Entry({10, 4}, {Box{{0, 0}, {1, 4}}, Box{{1, 0}, {6, 4}},
                                  Box{{7, 0}, {3, 4}}}),
                  &d);
  EXPECT_EQ(s, (Split{Kind::kDim, 0}));
  EXPECT_EQ(d, "3 parts along dim0");
}

TEST(InferSplit, ColumnsSplitAlongDim1) {
  std::string d;
  Split s = Infer(
      Entry({3, 4, 6}, {Box{{0, 0, 0}, {3, 4, 2}}, Box{{0, 0, 2}, {3, 4, 4}}}),
      &d);
  EXPECT_EQ(s, (Split{Kind::kDim, 2}));
  EXPECT_EQ(d, "2 parts along dim2");
}

TEST(InferSplit, GridSplitsAlongTheDimWithMostParts) {
  std::string d;
  std::vector<Region> grid;
  for (uint64_t i = 0; i < 2; ++i)
    for (uint64_t j = 0; j < 4; ++j) grid.push_back(Box{{i * 2, j}, {2, 1}});
  EXPECT_EQ(Infer(Entry({4, 4}, grid), &d), (Split{Kind::kDim, 1}));
  EXPECT_EQ(d, "2 x 4 grid");
  // Ties go to the lowest dim.
  std::vector<Region> square = {Box{{0, 0}, {2, 2}}, Box{{0, 2}, {2, 2}},
                                Box{{2, 0}, {2, 2}}, Box{{2, 2}, {2, 2}}};
  EXPECT_EQ(Infer(Entry({4, 4}, square), &d), (Split{Kind::kDim, 0}));
  EXPECT_EQ(d, "2 x 2 grid");
}

TEST(InferSplit, FlatRanges) {
  std::string d;
  EXPECT_EQ(Infer(Entry({5, 5},
                        {FlatRange{0, 3}, FlatRange{3, 20}, FlatRange{23, 2}}),
                  &d)
                .kind,
            Kind::kFlat);
  EXPECT_EQ(d, "3 flat ranges");
}

TEST(InferSplit, IrregularBoxesNeedAnOverride) {
  // Row 0-1 split in two columns, rows 2-3 whole.
  std::string d;
  auto s = InferSplit(Entry({4, 4}, {Box{{0, 0}, {2, 2}}, Box{{0, 2}, {2, 2}},
                                     Box{{2, 0}, {2, 4}}}),
                      &d);
  EXPECT_THAT(
      s,
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          "entry 't': cannot infer its layout: its 3 chunks are not a regular "
          "grid (along dim1, a chunk starts at 0 where another part is); give "
          "it "
          "in an override file (--layout FILE)"));
}

TEST(InferSplit, GridWithMissingCombinationsNeedsAnOverride) {
  // Intervals partition each dim but the chunks are not their product.
  std::string d;
  auto s = InferSplit(Entry({4, 4}, {Box{{0, 0}, {2, 4}}, Box{{2, 0}, {2, 4}},
                                     Box{{0, 0}, {4, 4}}}),
                      &d);
  EXPECT_FALSE(s.ok());
  s = InferSplit(Entry({2, 4}, {Box{{0, 0}, {1, 2}}, Box{{1, 2}, {1, 2}}}), &d);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          "its 2 chunks are not a regular grid;"));
}

TEST(InferSplit, BoxesMixedWithFlatRangesNeedAnOverride) {
  std::string d;
  EXPECT_THAT(
      InferSplit(Entry({4, 4}, {Box{{0, 0}, {2, 4}}, FlatRange{8, 8}}), &d),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "1 of its 2 chunks are flat ranges, the others boxes"));
}

TEST(PieceOf, EvenSplitSpreadsTheRemainder) {
  const Shape s{10, 3};
  const Split rows{Kind::kDim, 0};
  std::vector<uint64_t> sizes;
  for (int r = 0; r < 4; ++r) {
    Box b = std::get<Box>(PieceOf(rows, s, r, 4));
    sizes.push_back(b.size[0]);
    EXPECT_EQ(b.size[1], 3u);
  }
  EXPECT_EQ(sizes, (std::vector<uint64_t>{3, 3, 2, 2}));
  EXPECT_EQ(std::get<Box>(PieceOf(rows, s, 2, 4)).offset[0], 6u);
  EXPECT_EQ(std::get<FlatRange>(PieceOf({Kind::kFlat}, {7}, 1, 3)),
            (FlatRange{3, 2}));
  EXPECT_EQ(std::get<FlatRange>(PieceOf({Kind::kFlat}, {7}, 2, 3)),
            (FlatRange{5, 2}));
  EXPECT_EQ(std::get<Box>(PieceOf({Kind::kReplicated}, s, 3, 4)), FullBox(s));
}

TEST(PieceOf, MoreRanksThanRowsGivesEmptyPieces) {
  Box b = std::get<Box>(PieceOf({Kind::kDim, 0}, {2, 5}, 3, 4));
  EXPECT_EQ(b.size[0], 0u);
  EXPECT_EQ(b.offset[0], 2u);
}

TEST(PlanEntry, OverrideWins) {
  EntryRecord e = Entry({4, 6}, {Box{{0, 0}, {2, 6}}, Box{{2, 0}, {2, 6}}});
  OverrideRule rule{"t", {Kind::kDim, 1}};
  CKPT_ASSERT_OK_AND_ASSIGN(EntryLayout l, PlanEntry(e, 3, &rule));
  EXPECT_TRUE(l.from_override);
  EXPECT_EQ(l.LayoutName(), "dim1");
  EXPECT_EQ(l.source, "2 parts along dim0");
  ASSERT_EQ(l.ranks, 3);
  EXPECT_EQ(std::get<Box>(*l.Piece(2)), (Box{{0, 4}, {4, 2}}));
  EXPECT_FALSE(l.replica);
}

TEST(PlanEntry, OverrideWithADimTheTensorLacks) {
  EntryRecord e = Entry({4, 6}, {FullBox({4, 6})});
  OverrideRule rule{"t*", {Kind::kDim, 2}};
  EXPECT_THAT(PlanEntry(e, 2, &rule),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "override t* -> dim2 for entry 't': the tensor has 2 "
                       "dims (shape [4, 6])"));
}

TEST(PlanEntry, OverrideOfAnObject) {
  EntryRecord e = Entry({5}, {FlatRange{0, 5}});
  e.kind = format::EntryKind::kObject;
  OverrideRule rule{"t", {Kind::kFlat}};
  EXPECT_THAT(PlanEntry(e, 2, &rule),
              StatusIs(absl::StatusCode::kInvalidArgument, "it is an object"));
  CKPT_ASSERT_OK_AND_ASSIGN(EntryLayout l, PlanEntry(e, 2, nullptr));
  EXPECT_EQ(l.LayoutName(), "object");
}

TEST(PlanEntry, ReplicatedIsHeldByEveryRankAsAReplica) {
  CKPT_ASSERT_OK_AND_ASSIGN(EntryLayout l,
                            PlanEntry(Entry({3}, {FullBox({3})}), 3, nullptr));
  EXPECT_TRUE(l.replica);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(std::get<Box>(*l.Piece(r)), FullBox({3}));
}

TEST(PlanEntry, PartialKeepsChunksOnePerRank) {
  EntryRecord e = Entry({8, 2}, {Box{{0, 0}, {2, 2}}, Box{{5, 0}, {1, 2}}},
                        format::kEntryFlagPartial);
  CKPT_ASSERT_OK_AND_ASSIGN(EntryLayout l, PlanEntry(e, 3, nullptr));
  EXPECT_EQ(l.LayoutName(), "partial");
  EXPECT_EQ(std::get<Box>(*l.Piece(1)), (Box{{5, 0}, {1, 2}}));
  EXPECT_FALSE(l.Piece(2).has_value());
  EXPECT_THAT(PlanEntry(e, 1, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "entry 't' is partial with 2 chunks: its chunks are "
                       "kept as stored, one "
                       "per rank, so it needs --to >= 2"));
  OverrideRule rule{"t", {Kind::kFlat}};
  EXPECT_THAT(PlanEntry(e, 3, &rule),
              StatusIs(absl::StatusCode::kInvalidArgument, "it is partial"));
}

}  // namespace
}  // namespace ckpt::ops

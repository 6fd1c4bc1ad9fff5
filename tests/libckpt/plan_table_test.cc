// The coordinator's columnar table of local plans (libckpt/save/plan_table.h):
// interning, rank spans, and one named test per malformed message.
#include "save/plan_table.h"

#include <string>
#include <vector>

#include "ckpt/format/coding.h"
#include "gtest/gtest.h"
#include "save/save_plan.h"
#include "testing/status_matchers.h"

namespace ckpt::internal {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::StatusIs;

LocalItem Tensor(const std::string& name, Shape shape, Region region,
                 bool replica = false) {
  LocalItem it;
  it.name = name;
  it.dtype = DType::kBFloat16;
  it.shape = std::move(shape);
  it.region = std::move(region);
  it.replica = replica;
  return it;
}

// Appends `plan` as the table's next rank.
absl::Status Append(PlanTable* t, const LocalPlan& plan) {
  return t->AppendEncoded(EncodeLocalPlan(plan));
}

TEST(InternerTest, EqualKeysShareAnIdWithAndWithoutHint) {
  Interner in;
  const uint32_t a = in.Intern("alpha");
  const uint32_t b = in.Intern("beta", a);  // wrong hint: hashed
  EXPECT_EQ(in.Intern(std::string("alpha")), a);
  EXPECT_EQ(in.Intern("beta", b), b);
  EXPECT_EQ(in.Intern("", 7), 2u);  // out-of-range hint is ignored
  EXPECT_EQ(in.size(), 3u);
  EXPECT_EQ(in.Get(a), "alpha");
  EXPECT_EQ(in.Get(2), "");
}

// A scalar's shape is the empty key, and may be the first one interned.
TEST(InternerTest, EmptyFirstKeyIsInterned) {
  Interner in;
  EXPECT_EQ(in.Intern(""), 0u);
  EXPECT_EQ(in.Intern("x"), 1u);
  EXPECT_EQ(in.Intern(""), 0u);
  EXPECT_EQ(in.Get(0), "");
}

TEST(InternerTest, ViewsStayValidAcrossManyKeys) {
  Interner in;
  const std::string big(100000, 'x');  // larger than a block
  const uint32_t first = in.Intern("first");
  for (int i = 0; i < 20000; ++i) in.Intern("key" + std::to_string(i));
  const uint32_t b = in.Intern(big);
  EXPECT_EQ(in.Get(first), "first");
  EXPECT_EQ(in.Get(b), big);
  EXPECT_EQ(in.Get(first + 1234), "key1233");
}

TEST(PlanTableTest, ReplicatedRanksShareNamesShapesAndRegions) {
  PlanTable t;
  for (int r = 0; r < 4; ++r) {
    const uint64_t half = r % 2;
    ASSERT_THAT(Append(&t, {Tensor("a", {4, 2}, Box{{2 * half, 0}, {2, 2}}),
                            Tensor("b", {8}, FlatRange{0, 8}, true)}),
                IsOk());
  }
  EXPECT_EQ(t.ranks(), 4u);
  EXPECT_EQ(t.total_items(), 8u);
  EXPECT_EQ(t.names(), 2u);
  EXPECT_EQ(t.shapes(), 2u);
  EXPECT_EQ(t.regions(), 3u);
  EXPECT_EQ(t.rank(3)[0].region, t.rank(1)[0].region);
  EXPECT_NE(t.rank(2)[0].region, t.rank(1)[0].region);
}

TEST(PlanTableTest, ItemsMaterialiseAsDecoded) {
  PlanTable t;
  LocalItem box = Tensor("w", {3, 5}, Box{{1, 0}, {2, 5}}, true);
  box.partial = true;
  ASSERT_THAT(Append(&t, {}), IsOk());  // a rank with nothing
  ASSERT_THAT(Append(&t, {box, Tensor("f", {100}, FlatRange{10, 20})}), IsOk());
  EXPECT_TRUE(t.rank(0).empty());
  const PlanItem& a = t.rank(1)[0];
  EXPECT_EQ(t.name(a.name), "w");
  EXPECT_EQ(a.dtype, DType::kBFloat16);
  EXPECT_TRUE(a.replica);
  EXPECT_TRUE(a.partial);
  EXPECT_EQ(t.shape(a.shape), (Shape{3, 5}));
  EXPECT_EQ(t.FirstDim(a.shape), 3u);
  EXPECT_EQ(std::get<Box>(t.region(a.region)).offset, (Dims{1, 0}));
  EXPECT_EQ(std::get<Box>(t.region(a.region)).size, (Dims{2, 5}));
  EXPECT_EQ(t.RegionElements(a.region), 10u);
  const PlanItem& f = t.rank(1)[1];
  EXPECT_EQ(std::get<FlatRange>(t.region(f.region)).start, 10u);
  EXPECT_EQ(t.RegionElements(f.region), 20u);
}

TEST(PlanTableTest, HintsFromAnotherOrderStillIntern) {
  PlanTable t;
  ASSERT_THAT(Append(&t, {Tensor("x", {2}, FlatRange{0, 2}),
                          Tensor("y", {4}, FlatRange{0, 4})}),
              IsOk());
  ASSERT_THAT(Append(&t, {Tensor("y", {4}, FlatRange{0, 4}),
                          Tensor("x", {2}, FlatRange{0, 2})}),
              IsOk());
  EXPECT_EQ(t.names(), 2u);
  EXPECT_EQ(t.rank(1)[0].name, t.rank(0)[1].name);
  EXPECT_EQ(t.rank(1)[1].region, t.rank(0)[0].region);
}

TEST(PlanTableTest, RegionLessOrdersBoxesByOffsetThenSizeBeforeFlats) {
  PlanTable t;
  ASSERT_THAT(Append(&t, {Tensor("a", {4, 4}, Box{{2, 0}, {2, 4}}),
                          Tensor("b", {4, 4}, Box{{0, 1}, {2, 3}}),
                          Tensor("c", {4, 4}, Box{{0, 1}, {1, 3}}),
                          Tensor("d", {4}, FlatRange{0, 4})}),
              IsOk());
  auto id = [&](int i) { return t.rank(0)[i].region; };
  EXPECT_TRUE(t.RegionLess(id(2), id(1)));  // same offset, smaller size
  EXPECT_TRUE(t.RegionLess(id(1), id(0)));  // smaller offset
  EXPECT_TRUE(t.RegionLess(id(0), id(3)));  // box before flat
  EXPECT_FALSE(t.RegionLess(id(0), id(0)));
}

// The encoding of one tensor item with a corrupted byte, for the tests of
// malformed messages: byte `at` of EncodeLocalPlan({w}) set to `value`.
std::string Corrupted(size_t at, char value) {
  std::string b = EncodeLocalPlan({Tensor("w", {4}, FlatRange{0, 4})});
  b[at] = value;
  return b;
}
// Offsets in that encoding: count(1) name-len(1) 'w'(1) kind dtype flags
// ndim dim geometry start length.
constexpr size_t kKindAt = 3, kGeometryAt = 8;

TEST(PlanTableTest, UnknownKindIsDataLossAndLeavesTheTableUnchanged) {
  PlanTable t;
  ASSERT_THAT(Append(&t, {Tensor("v", {1}, FlatRange{0, 1})}), IsOk());
  EXPECT_THAT(
      t.AppendEncoded(Corrupted(kKindAt, 9)),
      StatusIs(absl::StatusCode::kDataLoss, "entry 'w': unknown kind 9"));
  EXPECT_EQ(t.ranks(), 1u);
  EXPECT_EQ(t.total_items(), 1u);
}

TEST(PlanTableTest, UnknownGeometryIsDataLoss) {
  PlanTable t;
  EXPECT_THAT(
      t.AppendEncoded(Corrupted(kGeometryAt, 3)),
      StatusIs(absl::StatusCode::kDataLoss, "entry 'w': unknown geometry 3"));
  EXPECT_EQ(t.ranks(), 0u);
}

TEST(PlanTableTest, TrailingBytesAreDataLoss) {
  PlanTable t;
  std::string b = EncodeLocalPlan({Tensor("w", {4}, FlatRange{0, 4})});
  EXPECT_THAT(t.AppendEncoded(b + "x"),
              StatusIs(absl::StatusCode::kDataLoss, "1 trailing bytes"));
}

TEST(PlanTableTest, TruncatedPlanIsDataLoss) {
  PlanTable t;
  std::string b = EncodeLocalPlan({Tensor("w", {4}, FlatRange{0, 4})});
  for (size_t n = 0; n < b.size(); ++n) {
    EXPECT_THAT(t.AppendEncoded(b.substr(0, n)),
                StatusIs(absl::StatusCode::kDataLoss, ""))
        << n;
  }
  EXPECT_EQ(t.ranks(), 0u);
}

TEST(PlanTableTest, TooManyDimensionsAreDataLoss) {
  LocalItem it = Tensor("w", Shape(format::kMaxDims + 1, 1), FlatRange{0, 1});
  PlanTable t;
  EXPECT_THAT(t.AppendEncoded(EncodeLocalPlan({it})),
              StatusIs(absl::StatusCode::kDataLoss, "ndim"));
}

}  // namespace
}  // namespace ckpt::internal

#include "diff/diff.h"

#include <filesystem>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "tools/diff/fixtures.h"

namespace ckpt::tools {
namespace {

using ::ckpt::testing::FixtureObject;
using ::ckpt::testing::FixtureTensor;
using ::ckpt::testing::Layout;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteFixture;

// A small model with every kind of layout and several dtypes.
std::vector<FixtureTensor> Model() {
  return {
      {"emb", DType::kFloat32, {12, 8}, Layout::kRows},
      {"layers.0.w", DType::kBFloat16, {8, 6}, Layout::kCols},
      {"layers.0.b", DType::kFloat32, {6}, Layout::kReplicated},
      {"grid", DType::kFloat16, {6, 4}, Layout::kGrid},
      {"opt.exp_avg", DType::kFloat32, {10, 7}, Layout::kFlatUneven},
      {"counts", DType::kInt64, {5}, Layout::kWhole},
      {"mask", DType::kBool, {3, 3}, Layout::kRows},
      {"fp8", DType::kFloat8E4M3FN, {4, 4}, Layout::kCols},
      {"scalar", DType::kFloat64, {}, Layout::kReplicated},
  };
}

std::vector<FixtureObject> Objects(int rank) {
  return {{"loader", "position=42", rank}};
}

// The same model under other layouts.
std::vector<FixtureTensor> Relayout(std::vector<FixtureTensor> m) {
  for (auto& t : m) {
    if (t.layout == Layout::kRows) {
      t.layout = Layout::kFlatUneven;
    } else if (t.layout == Layout::kFlatUneven) {
      t.layout = Layout::kCols;
    } else if (t.layout == Layout::kCols) {
      t.layout = Layout::kRows;
    }
  }
  return m;
}

class DiffTest : public ::testing::Test {
 protected:
  std::string A() const { return tmp_ / "a"; }
  std::string B() const { return tmp_ / "b"; }
  DiffOptions Opts() const {
    DiffOptions o;
    o.a = A();
    o.b = B();
    o.progress = false;
    return o;
  }
  TempDir tmp_;
};

TEST_F(DiffTest, EqualAcrossWorldSizesAndShardings) {
  CKPT_ASSERT_OK(WriteFixture(A(), 7, 4, Model(), Objects(3)));
  CKPT_ASSERT_OK(WriteFixture(B(), 7, 2, Relayout(Model()), Objects(0)));
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport r, Diff(Opts()));
  EXPECT_TRUE(r.equal());
  EXPECT_EQ(r.entries_compared, 10u);
  EXPECT_EQ(r.a.world_size, 4u);
  EXPECT_EQ(r.b.world_size, 2u);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_EQ(r.notes[0].what, "world size");
}

TEST_F(DiffTest, TinyWindowsGiveTheSameAnswer) {
  auto model = Model();
  CKPT_ASSERT_OK(WriteFixture(A(), 7, 4, model, Objects(0)));
  std::string g = ::ckpt::testing::GlobalOf(model[0]);
  g[4 * 50] ^= 0x40;
  g[4 * 51 + 3] ^= 0x01;
  model[0].global = g;
  CKPT_ASSERT_OK(WriteFixture(B(), 7, 3, Relayout(model), Objects(1)));
  DiffOptions o = Opts();
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport big, Diff(o));
  o.window_bytes = 12;  // 3 float32 elements per window
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport small, Diff(o));
  ASSERT_EQ(big.values.size(), 1u);
  ASSERT_EQ(small.values.size(), 1u);
  EXPECT_EQ(big.values[0].differing, 2u);
  EXPECT_EQ(small.values[0].differing, 2u);
  EXPECT_EQ(small.values[0].max_abs_diff, big.values[0].max_abs_diff);
  EXPECT_EQ(small.values[0].first_at, (Dims{6, 2}));
  EXPECT_EQ(big.values[0].first_at, (Dims{6, 2}));
}

// Entries that fit in a window together are loaded together, with one
// Reader::Load per side for as many as fit in the window and 16384 requests
// (issue 28: two Loads per entry took 53 s for 2^20 scalar entries), and
// found different as entry by entry.
TEST_F(DiffTest, SmallEntriesAreLoadedInBatches) {
  std::vector<FixtureTensor> ts;
  for (int i = 0; i < 20000; ++i) {
    ts.push_back({absl::StrFormat("s.%05d", i),
                  DType::kFloat32,
                  {},
                  Layout::kReplicated});
  }
  CKPT_ASSERT_OK(WriteFixture(A(), 1, 2, ts, {{"a", "abc", 1}}));
  ts[12345].global = ::ckpt::testing::FloatRamp(1, 7.5f);
  CKPT_ASSERT_OK(WriteFixture(B(), 1, 3, ts, {{"a", "abd", 0}}));
  DiffOptions o = Opts();
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport big, Diff(o));
  // The object and 16383 scalars (16384 requests), then the other 3617.
  EXPECT_EQ(big.loads, 2u);
  o.window_bytes = 64;  // 16 scalars
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport small, Diff(o));
  // The object and 15 scalars (63 bytes), then 16 scalars a load.
  EXPECT_EQ(small.loads, 1u + (20000u - 15 + 15) / 16);
  for (const DiffReport* r : {&big, &small}) {
    EXPECT_EQ(r->entries_compared, 20001u);
    EXPECT_EQ(r->bytes_compared, 20000u * 4 + 3);
    ASSERT_EQ(r->values.size(), 2u);
    EXPECT_EQ(r->values[0].entry, "a");
    EXPECT_TRUE(r->values[0].object);
    EXPECT_EQ(r->values[0].differing, 1u);
    EXPECT_EQ(r->values[1].entry, "s.12345");
    EXPECT_EQ(r->values[1].differing, 1u);
    EXPECT_EQ(r->values[1].total, 1u);
    EXPECT_EQ(r->values[1].first_at, Dims{});
    EXPECT_EQ(r->values[1].first_b, "7.5");
  }
  EXPECT_EQ(small.values[1].first_a, big.values[1].first_a);
}

TEST_F(DiffTest, OneValueChangedReportsCountMaxAndPosition) {
  FixtureTensor t{"w",
                  DType::kFloat32,
                  {4, 6},
                  Layout::kRows,
                  ::ckpt::testing::FloatRamp(24)};
  CKPT_ASSERT_OK(WriteFixture(A(), 1, 4, {t}));
  ::ckpt::testing::SetFloat(&t.global, 9, 2.5f);  // was 2.25
  t.layout = Layout::kCols;
  CKPT_ASSERT_OK(WriteFixture(B(), 1, 2, {t}));
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport r, Diff(Opts()));
  EXPECT_FALSE(r.equal());
  EXPECT_TRUE(r.structural.empty());
  ASSERT_EQ(r.values.size(), 1u);
  const ValueDiff& v = r.values[0];
  EXPECT_EQ(v.entry, "w");
  EXPECT_EQ(v.differing, 1u);
  EXPECT_EQ(v.total, 24u);
  EXPECT_DOUBLE_EQ(v.max_abs_diff, 0.25);
  EXPECT_EQ(v.first_at, (Dims{1, 3}));
  EXPECT_EQ(v.first_a, "2.25");
  EXPECT_EQ(v.first_b, "2.5");
}

TEST_F(DiffTest, AtolAcceptsASmallChange) {
  FixtureTensor t{"w",
                  DType::kFloat32,
                  {4, 6},
                  Layout::kRows,
                  ::ckpt::testing::FloatRamp(24)};
  CKPT_ASSERT_OK(WriteFixture(A(), 1, 2, {t}));
  ::ckpt::testing::SetFloat(&t.global, 9, 2.3f);
  CKPT_ASSERT_OK(WriteFixture(B(), 1, 2, {t}));
  DiffOptions o = Opts();
  o.tolerance.atol = 0.1;
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport r, Diff(o));
  EXPECT_TRUE(r.equal());
  o.tolerance.atol = 0.01;
  CKPT_ASSERT_OK_AND_ASSIGN(r, Diff(o));
  EXPECT_FALSE(r.equal());
}

TEST_F(DiffTest, RtolAcceptsARelativeChange) {
  FixtureTensor t{"w",
                  DType::kFloat32,
                  {4},
                  Layout::kWhole,
                  ::ckpt::testing::FloatRamp(4, 100)};
  CKPT_ASSERT_OK(WriteFixture(A(), 1, 1, {t}));
  ::ckpt::testing::SetFloat(&t.global, 0, 100.5f);
  CKPT_ASSERT_OK(WriteFixture(B(), 1, 1, {t}));
  DiffOptions o = Opts();
  o.tolerance.rtol = 0.01;
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport r, Diff(o));
  EXPECT_TRUE(r.equal());
  o.tolerance.rtol = 0.001;
  CKPT_ASSERT_OK_AND_ASSIGN(r, Diff(o));
  EXPECT_FALSE(r.equal());
}

TEST_F(DiffTest, NaNAtTheSamePositionIsEqual) {
  std::string g = ::ckpt::testing::FloatRamp(8);
  ::ckpt::testing::SetFloat(&g, 3, std::numeric_limits<float>::quiet_NaN());
  FixtureTensor t{"w", DType::kFloat32, {8}, Layout::kRows, g};
  CKPT_ASSERT_OK(WriteFixture(A(), 1, 2, {t}));
  t.layout = Layout::kFlatUneven;
  CKPT_ASSERT_OK(WriteFixture(B(), 1, 3, {t}));
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport r, Diff(Opts()));
  EXPECT_TRUE(r.equal());
  DiffOptions o = Opts();
  o.tolerance.atol = 1e-6;
  CKPT_ASSERT_OK_AND_ASSIGN(r, Diff(o));
  EXPECT_TRUE(r.equal());
}

TEST_F(DiffTest, DtypeChangeIsStructural) {
  CKPT_ASSERT_OK(
      WriteFixture(A(), 1, 2, {{"w", DType::kFloat32, {4, 4}, Layout::kRows}}));
  CKPT_ASSERT_OK(WriteFixture(
      B(), 1, 2, {{"w", DType::kBFloat16, {4, 4}, Layout::kRows}}));
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport r, Diff(Opts()));
  ASSERT_EQ(r.structural.size(), 1u);
  EXPECT_EQ(r.structural[0].change, "dtype");
  EXPECT_EQ(r.structural[0].a, "float32");
  EXPECT_EQ(r.structural[0].b, "bfloat16");
  EXPECT_TRUE(r.values.empty());
  EXPECT_EQ(r.entries_compared, 0u);
}

TEST_F(DiffTest, ShapeChangeIsStructural) {
  CKPT_ASSERT_OK(
      WriteFixture(A(), 1, 2, {{"w", DType::kFloat32, {4, 6}, Layout::kRows}}));
  CKPT_ASSERT_OK(
      WriteFixture(B(), 1, 2, {{"w", DType::kFloat32, {6, 4}, Layout::kRows}}));
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport r, Diff(Opts()));
  ASSERT_EQ(r.structural.size(), 1u);
  EXPECT_EQ(r.structural[0].change, "shape");
  EXPECT_EQ(r.structural[0].a, "[4, 6]");
  EXPECT_EQ(r.structural[0].b, "[6, 4]");
}

TEST_F(DiffTest, EntriesAddedAndRemoved) {
  CKPT_ASSERT_OK(WriteFixture(A(), 1, 2,
                              {{"a", DType::kFloat32, {4}, Layout::kRows},
                               {"gone", DType::kFloat32, {4}, Layout::kRows}}));
  CKPT_ASSERT_OK(WriteFixture(B(), 1, 2,
                              {{"a", DType::kFloat32, {4}, Layout::kRows},
                               {"new", DType::kFloat32, {4}, Layout::kRows}}));
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport r, Diff(Opts()));
  ASSERT_EQ(r.structural.size(), 2u);
  EXPECT_EQ(r.structural[0].entry, "gone");
  EXPECT_EQ(r.structural[0].change, "removed");
  EXPECT_EQ(r.structural[1].entry, "new");
  EXPECT_EQ(r.structural[1].change, "added");
  EXPECT_EQ(r.entries_compared, 1u);
}

TEST_F(DiffTest, KindChangeIsStructural) {
  CKPT_ASSERT_OK(
      WriteFixture(A(), 1, 1, {{"x", DType::kUInt8, {4}, Layout::kWhole}}));
  CKPT_ASSERT_OK(WriteFixture(B(), 1, 1, {}, {{"x", "abcd", 0}}));
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport r, Diff(Opts()));
  ASSERT_EQ(r.structural.size(), 1u);
  EXPECT_EQ(r.structural[0].change, "kind");
  EXPECT_EQ(r.structural[0].a, "tensor");
  EXPECT_EQ(r.structural[0].b, "object");
}

TEST_F(DiffTest, ObjectsAreComparedByBytes) {
  CKPT_ASSERT_OK(WriteFixture(A(), 1, 2, {},
                              {{"rng", "0123456789", 0}, {"same", "x", 1}}));
  CKPT_ASSERT_OK(WriteFixture(B(), 1, 2, {},
                              {{"rng", "0123X56789ab", 1}, {"same", "x", 0}}));
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport r, Diff(Opts()));
  ASSERT_EQ(r.values.size(), 1u);
  const ValueDiff& v = r.values[0];
  EXPECT_TRUE(v.object);
  EXPECT_EQ(v.entry, "rng");
  EXPECT_EQ(v.differing, 3u);  // one changed byte, two extra bytes
  EXPECT_EQ(v.total, 12u);
  EXPECT_EQ(v.size_a, 10u);
  EXPECT_EQ(v.size_b, 12u);
}

TEST_F(DiffTest, PartialEntriesCompareWhereStored) {
  using ::ckpt::testing::BoxPiece;
  FixtureTensor t{"emb",
                  DType::kFloat32,
                  {8, 4},
                  Layout::kRows,
                  ::ckpt::testing::FloatRamp(32)};
  t.partial = true;
  t.pieces = {BoxPiece({0, 0}, {2, 4}), BoxPiece({5, 0}, {2, 4})};
  CKPT_ASSERT_OK(WriteFixture(A(), 1, 2, {t}));
  // The same rows, stored as one chunk per row.
  t.pieces = {BoxPiece({0, 0}, {1, 4}), BoxPiece({1, 0}, {1, 4}),
              BoxPiece({5, 0}, {1, 4}), BoxPiece({6, 0}, {1, 4})};
  CKPT_ASSERT_OK(WriteFixture(B(), 1, 4, {t}));
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport r, Diff(Opts()));
  EXPECT_TRUE(r.equal());
  EXPECT_EQ(r.bytes_compared, 16u * 4);
}

TEST_F(DiffTest, PartialEntriesWithOtherCoverageDiffer) {
  using ::ckpt::testing::BoxPiece;
  FixtureTensor t{"emb", DType::kFloat32, {8, 4}, Layout::kRows};
  t.partial = true;
  t.pieces = {BoxPiece({0, 0}, {2, 4}), BoxPiece({5, 0}, {2, 4})};
  CKPT_ASSERT_OK(WriteFixture(A(), 1, 2, {t}));
  t.pieces = {BoxPiece({0, 0}, {2, 4}), BoxPiece({4, 0}, {2, 4})};
  CKPT_ASSERT_OK(WriteFixture(B(), 1, 2, {t}));
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport r, Diff(Opts()));
  ASSERT_EQ(r.structural.size(), 1u);
  EXPECT_EQ(r.structural[0].change, "coverage");
  EXPECT_EQ(r.structural[0].a, "16 of 32 elements");
}

TEST_F(DiffTest, PartialFlagChangeIsStructural) {
  FixtureTensor t{"emb", DType::kFloat32, {4, 4}, Layout::kRows};
  CKPT_ASSERT_OK(WriteFixture(A(), 1, 2, {t}));
  t.partial = true;
  CKPT_ASSERT_OK(WriteFixture(B(), 1, 2, {t}));
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport r, Diff(Opts()));
  ASSERT_EQ(r.structural.size(), 1u);
  EXPECT_EQ(r.structural[0].change, "partial");
}

TEST_F(DiffTest, StepAndMetadataAreNotesNotFindings) {
  SaveOptions so;
  so.metadata = {{"lr", "0.1"}, {"run", "x"}};
  CKPT_ASSERT_OK(WriteFixture(A(), 5, 2, Model(), {}, so));
  so.metadata = {{"lr", "0.2"}, {"seed", "1"}};
  CKPT_ASSERT_OK(WriteFixture(B(), 6, 2, Model(), {}, so));
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport r, Diff(Opts()));
  EXPECT_TRUE(r.equal());
  ASSERT_EQ(r.notes.size(), 4u);
  EXPECT_EQ(r.notes[0].what, "step");
  EXPECT_EQ(r.notes[1].what, "metadata 'lr'");
  EXPECT_EQ(r.notes[2].what, "metadata 'run'");
  EXPECT_EQ(r.notes[2].b, "(absent)");
  EXPECT_EQ(r.notes[3].what, "metadata 'seed'");
}

TEST_F(DiffTest, EveryDTypeAcrossShardings) {
  std::vector<FixtureTensor> ts;
  for (DType d : kAllDTypes)
    ts.push_back({std::string(DTypeName(d)), d, {5, 7}, Layout::kGrid});
  CKPT_ASSERT_OK(WriteFixture(A(), 1, 4, ts));
  for (auto& t : ts) t.layout = Layout::kFlatUneven;
  CKPT_ASSERT_OK(WriteFixture(B(), 1, 3, ts));
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport r, Diff(Opts()));
  EXPECT_TRUE(r.equal());
  EXPECT_EQ(r.entries_compared, std::size(kAllDTypes));
}

TEST_F(DiffTest, MissingDirectoryIsNotFound) {
  DiffOptions o = Opts();
  EXPECT_THAT(Diff(o),
              StatusIs(absl::StatusCode::kNotFound,
                       A() + ": no such checkpoint or checkpoint root"));
}

TEST_F(DiffTest, NotACheckpointIsNotFound) {
  std::filesystem::create_directories(A());
  EXPECT_THAT(Diff(Opts()),
              StatusIs(absl::StatusCode::kNotFound, "not a checkpoint"));
}

TEST_F(DiffTest, CorruptedBlockIsDataLossNamingFileEntryAndBlock) {
  FixtureTensor t{"w", DType::kFloat32, {64, 64}, Layout::kRows};
  CKPT_ASSERT_OK(WriteFixture(A(), 1, 2, {t}));
  CKPT_ASSERT_OK(WriteFixture(B(), 1, 2, {t}));
  const std::string shard = B() + "/step-00000001/shard-00001.ckpt";
  std::string bytes = ::ckpt::testing::ReadFileBytes(shard);
  bytes[4096 + 100] ^= 1;  // first payload byte at the default 4 KiB alignment
  ::ckpt::testing::WriteFileBytes(shard, bytes);
  auto r = Diff(Opts());
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kDataLoss,
                          "shard-00001.ckpt: block 0 of chunk"));
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kDataLoss, "of 'w'"));
}

TEST_F(DiffTest, NegativeToleranceIsInvalid) {
  DiffOptions o = Opts();
  o.tolerance.atol = -1;
  EXPECT_THAT(Diff(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                "tolerances must be"));
}

}  // namespace
}  // namespace ckpt::tools

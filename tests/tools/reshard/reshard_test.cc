#include "reshard/reshard.h"

#include <filesystem>

#include "ckpt/format/status_macros.h"
#include "ckpt/ops/reshard_layout.h"
#include "ckpt/reader.h"
#include "diff/diff.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "tools/diff/fixtures.h"

namespace ckpt::tools {
namespace {

using ::ckpt::testing::BoxPiece;
using ::ckpt::testing::FixtureObject;
using ::ckpt::testing::FixtureTensor;
using ::ckpt::testing::Layout;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteFixture;

std::vector<FixtureTensor> Model() {
  return {
      {"emb", DType::kFloat32, {13, 8}, Layout::kRows},
      {"layers.0.w", DType::kBFloat16, {8, 7}, Layout::kCols},
      {"layers.0.b", DType::kFloat32, {6}, Layout::kReplicated},
      {"grid", DType::kFloat16, {6, 5}, Layout::kGrid},
      {"opt.exp_avg", DType::kFloat32, {10, 7}, Layout::kFlatUneven},
      {"counts", DType::kInt64, {5}, Layout::kWhole},
      {"mask", DType::kBool, {3, 3}, Layout::kRows},
      {"fp8", DType::kFloat8E5M2, {4, 9}, Layout::kCols},
      {"scalar", DType::kFloat64, {}, Layout::kReplicated},
      {"empty", DType::kFloat32, {0, 4}, Layout::kRows},
      {"big",
       DType::kFloat64,
       {67, 129},
       Layout::kRows},  // several 4 KiB blocks
  };
}

std::vector<FixtureObject> Objects() {
  return {{"loader", "position=42", 0}, {"rng", std::string(5000, 'r'), 0}};
}

// The output is a valid checkpoint: Reader::Open checks the manifest and
// coverage; a full load reads and verifies every block.
void ExpectLoadsFully(const std::string& path) {
  auto reader = Reader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<std::string> bufs((*reader)->manifest().entries.size());
  std::vector<LoadRequest> reqs;
  size_t i = 0;
  for (const auto& e : (*reader)->manifest().entries) {
    LoadRequest q;
    q.name = e.name;
    if (e.kind == format::EntryKind::kObject) {
      q.object = &bufs[i++];
    } else {
      q.dtype = e.dtype;
      q.shape = e.shape;
      q.region = FullBox(e.shape);
      bufs[i].resize(RegionElements(q.region) * DTypeSize(e.dtype));
      q.data = bufs[i++].data();
    }
    reqs.push_back(std::move(q));
  }
  auto report = (*reader)->Load(reqs);
  ASSERT_TRUE(report.ok()) << report.status();
}

// Rank r finds its part of every split tensor in shard r, as one chunk.
void ExpectRankLocal(const ReshardReport& report) {
  auto reader = Reader::Open(report.dst_dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const int n = report.to;
  EXPECT_EQ((*reader)->manifest().info.world_size, report.to);
  EXPECT_EQ((*reader)->manifest().shards.size(), report.to);
  for (const ReshardedEntry& re : report.entries) {
    const format::EntryRecord* e = (*reader)->Find(re.name);
    ASSERT_NE(e, nullptr) << re.name;
    if (re.layout == "object") {
      ASSERT_EQ(e->chunks.size(), 1u);
      EXPECT_EQ(e->chunks[0].shard, 0u) << re.name;
      continue;
    }
    if (re.layout == "replicated") {
      ASSERT_EQ(e->chunks.size(), 1u) << re.name;
      EXPECT_EQ(std::get<Box>(e->chunks[0].region), FullBox(e->shape))
          << re.name;
      continue;
    }
    CKPT_ASSERT_OK_AND_ASSIGN(Split split, ParseSplit(re.layout));
    size_t nonempty = 0;
    for (int r = 0; r < n; ++r) {
      Region piece = PieceOf(split, e->shape, r, n);
      if (RegionElements(piece) == 0) continue;
      ++nonempty;
      bool found = false;
      for (const auto& c : e->chunks) {
        if (c.region == piece) {
          found = true;
          EXPECT_EQ(c.shard, static_cast<uint32_t>(r))
              << re.name << " " << RegionToString(piece);
        }
      }
      EXPECT_TRUE(found) << re.name << ": no chunk " << RegionToString(piece);
    }
    EXPECT_EQ(e->chunks.size(), std::max<size_t>(nonempty, 1)) << re.name;
  }
}

void ExpectEqual(const std::string& a, const std::string& b) {
  DiffOptions d;
  d.a = a;
  d.b = b;
  d.progress = false;
  auto r = Diff(d);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->equal());
  std::ostringstream text;
  PrintDiffText(*r, text);
  EXPECT_TRUE(r->equal()) << text.str();
}

class ReshardTest : public ::testing::Test {
 protected:
  std::string Src() const { return tmp_ / "src"; }
  std::string Dst() const { return tmp_ / "dst"; }
  ReshardOptions Opts(int to) const {
    ReshardOptions o;
    o.src = Src();
    o.dst = Dst();
    o.to = to;
    o.progress = false;
    return o;
  }
  TempDir tmp_;
};

struct Case {
  int from, to;
};

class ReshardToolMatrixTest : public ReshardTest,
                              public ::testing::WithParamInterface<Case> {};

TEST_P(ReshardToolMatrixTest, OutputIsValidEqualAndRankLocal) {
  const auto [from, to] = GetParam();
  CKPT_ASSERT_OK(WriteFixture(Src(), 7, from, Model(), Objects()));
  CKPT_ASSERT_OK_AND_ASSIGN(ReshardReport report, Reshard(Opts(to)));
  EXPECT_EQ(report.from, static_cast<uint32_t>(from));
  EXPECT_EQ(report.to, static_cast<uint32_t>(to));
  EXPECT_EQ(report.step, 7u);
  EXPECT_EQ(report.dst_dir, Dst() + "/step-00000007");
  ExpectLoadsFully(Dst());
  ExpectEqual(Src(), Dst());
  ExpectRankLocal(report);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ReshardToolMatrixTest,
                         ::testing::Values(Case{4, 2}, Case{4, 3}, Case{2, 4},
                                           Case{3, 1}, Case{1, 1}, Case{2, 7}),
                         [](const auto& info) {
                           return std::to_string(info.param.from) + "to" +
                                  std::to_string(info.param.to);
                         });

TEST_F(ReshardTest, InfersLayoutsFromTheStoredChunks) {
  CKPT_ASSERT_OK(WriteFixture(Src(), 7, 4, Model(), Objects()));
  CKPT_ASSERT_OK_AND_ASSIGN(ReshardReport report, Reshard(Opts(3)));
  std::map<std::string, std::pair<std::string, std::string>> got;
  for (const auto& e : report.entries) got[e.name] = {e.source, e.layout};
  using P = std::pair<std::string, std::string>;
  EXPECT_EQ(got["emb"], P("4 parts along dim0", "dim0"));
  // Uneven columns: the first rank holds none of the 7 columns.
  EXPECT_EQ(got["layers.0.w"], P("3 parts along dim1", "dim1"));
  EXPECT_EQ(got["layers.0.b"], P("whole", "replicated"));
  EXPECT_EQ(got["grid"], P("2 x 2 grid", "dim0"));
  EXPECT_EQ(got["opt.exp_avg"], P("4 flat ranges", "flat"));
  EXPECT_EQ(got["counts"], P("whole", "replicated"));
  EXPECT_EQ(got["empty"], P("empty", "replicated"));
  EXPECT_EQ(got["loader"], P("object", "object"));
  EXPECT_EQ(report.object_bytes, 5011u);
}

TEST_F(ReshardTest, ReplicatedTensorIsWrittenOnce) {
  CKPT_ASSERT_OK(WriteFixture(
      Src(), 1, 2, {{"norm", DType::kFloat32, {64}, Layout::kReplicated}}));
  CKPT_ASSERT_OK_AND_ASSIGN(ReshardReport report, Reshard(Opts(4)));
  EXPECT_EQ(report.stored_bytes, 64u * 4);
  ExpectRankLocal(report);
  ExpectEqual(Src(), Dst());
}

TEST_F(ReshardTest, FlatUnevenIsResplitEvenly) {
  CKPT_ASSERT_OK(WriteFixture(
      Src(), 1, 3, {{"m", DType::kFloat32, {11, 3}, Layout::kFlatUneven}}));
  CKPT_ASSERT_OK_AND_ASSIGN(ReshardReport report, Reshard(Opts(4)));
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(Dst()));
  const format::EntryRecord* e = reader->Find("m");
  ASSERT_NE(e, nullptr);
  std::map<uint32_t, FlatRange> by_shard;
  for (const auto& c : e->chunks)
    by_shard[c.shard] = std::get<FlatRange>(c.region);
  EXPECT_EQ(by_shard[0], (FlatRange{0, 9}));
  EXPECT_EQ(by_shard[1], (FlatRange{9, 8}));
  EXPECT_EQ(by_shard[2], (FlatRange{17, 8}));
  EXPECT_EQ(by_shard[3], (FlatRange{25, 8}));
  ExpectEqual(Src(), Dst());
}

TEST_F(ReshardTest, IrregularLayoutNeedsAnOverride) {
  FixtureTensor t{"odd", DType::kFloat32, {4, 4}, Layout::kRows};
  t.pieces = {BoxPiece({0, 0}, {2, 2}), BoxPiece({0, 2}, {2, 2}),
              BoxPiece({2, 0}, {2, 4})};
  CKPT_ASSERT_OK(WriteFixture(Src(), 1, 3, {t}));
  EXPECT_THAT(Reshard(Opts(2)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "entry 'odd': cannot infer its layout: its 3 chunks are "
                       "not a regular grid"));
  EXPECT_TRUE(::ckpt::testing::LeftoversIn(Dst()).empty());
  ::ckpt::testing::WriteFileBytes(tmp_ / "layout.json",
                                  R"({"entries": {"odd": {"split": "dim1"}}})");
  ReshardOptions o = Opts(2);
  o.layout_file = tmp_ / "layout.json";
  CKPT_ASSERT_OK_AND_ASSIGN(ReshardReport report, Reshard(o));
  ASSERT_EQ(report.entries.size(), 1u);
  EXPECT_EQ(report.entries[0].layout, "dim1");
  EXPECT_TRUE(report.entries[0].from_override);
  EXPECT_EQ(report.entries[0].source, "irregular");
  ExpectRankLocal(report);
  ExpectEqual(Src(), Dst());
}

TEST_F(ReshardTest, GlobOverrideChangesTheSplit) {
  CKPT_ASSERT_OK(
      WriteFixture(Src(), 1, 2,
                   {{"layers.0.w", DType::kFloat32, {6, 4}, Layout::kRows},
                    {"layers.1.w", DType::kFloat32, {6, 4}, Layout::kRows},
                    {"emb", DType::kFloat32, {6, 4}, Layout::kRows}}));
  ::ckpt::testing::WriteFileBytes(
      tmp_ / "layout.json",
      R"({"entries": {"layers.*.w": {"split": "dim1"},
                                                  "emb": {"split": "flat"}}})");
  ReshardOptions o = Opts(3);
  o.layout_file = tmp_ / "layout.json";
  CKPT_ASSERT_OK_AND_ASSIGN(ReshardReport report, Reshard(o));
  std::map<std::string, std::string> got;
  for (const auto& e : report.entries) got[e.name] = e.layout;
  EXPECT_EQ(got["layers.0.w"], "dim1");
  EXPECT_EQ(got["layers.1.w"], "dim1");
  EXPECT_EQ(got["emb"], "flat");
  ExpectRankLocal(report);
  ExpectEqual(Src(), Dst());
}

TEST_F(ReshardTest, OverrideFileErrorsNameTheFile) {
  CKPT_ASSERT_OK(
      WriteFixture(Src(), 1, 2, {{"w", DType::kFloat32, {4}, Layout::kRows}}));
  const std::string path = tmp_ / "layout.json";
  ReshardOptions o = Opts(2);
  o.layout_file = path;
  ::ckpt::testing::WriteFileBytes(path,
                                  R"({"entries": {"w": {"split": "rows"}}})");
  EXPECT_THAT(Reshard(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       path + ": entries.\"w\".split: expected \"dim<k>\""));
  ::ckpt::testing::WriteFileBytes(path,
                                  R"({"entries": {"v": {"split": "dim0"}}})");
  EXPECT_THAT(Reshard(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       path + ": \"v\" matches no entry of the checkpoint"));
  ::ckpt::testing::WriteFileBytes(path,
                                  R"({"entries": {"w": {"split": "dim1"}}})");
  EXPECT_THAT(
      Reshard(o),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "override w -> dim1 for entry 'w': the tensor has 1 dims"));
  EXPECT_TRUE(::ckpt::testing::LeftoversIn(Dst()).empty());
}

TEST_F(ReshardTest, MissingOverrideFileIsNotFound) {
  CKPT_ASSERT_OK(
      WriteFixture(Src(), 1, 2, {{"w", DType::kFloat32, {4}, Layout::kRows}}));
  ReshardOptions o = Opts(2);
  o.layout_file = tmp_ / "nope.json";
  EXPECT_THAT(Reshard(o), StatusIs(absl::StatusCode::kNotFound, "nope.json"));
}

TEST_F(ReshardTest, WrongFromFailsClearly) {
  CKPT_ASSERT_OK(
      WriteFixture(Src(), 7, 4, {{"w", DType::kFloat32, {4}, Layout::kRows}}));
  ReshardOptions o = Opts(2);
  o.from = 3;
  auto r = Reshard(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            Src() + "/step-00000007: saved on 4 ranks, --from 3 given");
  o.from = 4;
  CKPT_EXPECT_OK(Reshard(o));
}

TEST_F(ReshardTest, CorruptSourceBlockFailsAndCommitsNothing) {
  CKPT_ASSERT_OK(WriteFixture(
      Src(), 7, 2, {{"w", DType::kFloat32, {64, 64}, Layout::kRows}}));
  const std::string shard = Src() + "/step-00000007/shard-00001.ckpt";
  std::string bytes = ::ckpt::testing::ReadFileBytes(shard);
  bytes[4096 + 10] ^= 0x10;
  ::ckpt::testing::WriteFileBytes(shard, bytes);
  auto r = Reshard(Opts(3));
  EXPECT_THAT(
      r, StatusIs(absl::StatusCode::kDataLoss,
                  Src() + "/step-00000007/shard-00001.ckpt: block 0 of chunk 1 "
                          "[21:64, 0:64] of 'w': checksum"));
  // Nothing committed, nothing left behind.
  EXPECT_TRUE(::ckpt::testing::LeftoversIn(Dst()).empty());
}

TEST_F(ReshardTest, ExistingStepIsNotOverwritten) {
  CKPT_ASSERT_OK(
      WriteFixture(Src(), 7, 2, {{"w", DType::kFloat32, {8}, Layout::kRows}}));
  CKPT_ASSERT_OK(Reshard(Opts(3)).status());
  EXPECT_THAT(Reshard(Opts(3)),
              StatusIs(absl::StatusCode::kAlreadyExists, "already exists"));
  ReshardOptions o = Opts(3);
  o.step = 8;
  CKPT_ASSERT_OK_AND_ASSIGN(ReshardReport report, Reshard(o));
  EXPECT_EQ(report.dst_dir, Dst() + "/step-00000008");
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader,
                            Reader::Open(Dst()));  // latest moved on
  EXPECT_EQ(reader->manifest().info.step, 8u);
}

TEST_F(ReshardTest, DstMustBeARootNotACheckpoint) {
  CKPT_ASSERT_OK(
      WriteFixture(Src(), 7, 2, {{"w", DType::kFloat32, {8}, Layout::kRows}}));
  ReshardOptions o = Opts(2);
  o.dst = Src() + "/step-00000007";
  EXPECT_THAT(
      Reshard(o),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "step-00000007: is a checkpoint directory; DST must be a "
               "checkpoint root"));
}

TEST_F(ReshardTest, MissingSourceIsNotFound) {
  EXPECT_THAT(Reshard(Opts(2)),
              StatusIs(absl::StatusCode::kNotFound,
                       Src() + ": no such checkpoint or checkpoint root"));
}

TEST_F(ReshardTest, BadWorldSizeIsInvalid) {
  EXPECT_THAT(Reshard(Opts(0)), StatusIs(absl::StatusCode::kInvalidArgument,
                                         "--to must be in [1, 65536], got 0"));
  EXPECT_THAT(Reshard(Opts(65537)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--to must be in [1, 65536], got 65537"));
}

// A job of thousands of ranks: the output ranks are written a few at a
// time (no thread each); every rank still finds its part in its shard.
TEST_F(ReshardTest, ReshardsToFourThousandRanks) {
  CKPT_ASSERT_OK(WriteFixture(Src(), 7, 2, Model(), Objects()));
  CKPT_ASSERT_OK_AND_ASSIGN(ReshardReport report, Reshard(Opts(4096)));
  EXPECT_EQ(report.to, 4096u);
  ExpectLoadsFully(Dst());
  ExpectEqual(Src(), Dst());
  ExpectRankLocal(report);
}

TEST_F(ReshardTest, KeepsCodecMetadataAndStepUnlessOverridden) {
  SaveOptions so;
  so.codec = format::Codec::kZstd;
  so.block_size = 8192;
  so.metadata = {{"lr", "0.1"}};
  CKPT_ASSERT_OK(WriteFixture(Src(), 9, 2, Model(), Objects(), so));
  CKPT_ASSERT_OK_AND_ASSIGN(ReshardReport report, Reshard(Opts(3)));
  EXPECT_EQ(report.codec, "zstd");
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(Dst()));
  EXPECT_EQ(reader->manifest().info.step, 9u);
  EXPECT_EQ(reader->manifest().metadata, so.metadata);
  for (const auto& e : reader->manifest().entries) {
    for (const auto& c : e.chunks) {
      if (c.stored_length == 0) continue;
      EXPECT_EQ(c.codec, format::Codec::kZstd) << e.name;
      EXPECT_EQ(c.block_size, 8192u) << e.name;
    }
  }
  ExpectEqual(Src(), Dst());
  ReshardOptions o = Opts(2);
  o.dst = tmp_ / "plain";
  o.codec = format::Codec::kNone;
  CKPT_ASSERT_OK_AND_ASSIGN(report, Reshard(o));
  EXPECT_EQ(report.codec, "none");
  ExpectEqual(Src(), o.dst);
}

TEST_F(ReshardTest, PartialEntriesKeepTheirChunks) {
  FixtureTensor t{"emb", DType::kFloat32, {8, 4}, Layout::kRows};
  t.partial = true;
  t.pieces = {BoxPiece({0, 0}, {2, 4}), BoxPiece({5, 0}, {2, 4}),
              BoxPiece({7, 0}, {0, 4})};
  CKPT_ASSERT_OK(WriteFixture(Src(), 1, 3,
                              {t, {"w", DType::kFloat32, {6}, Layout::kRows}}));
  CKPT_ASSERT_OK_AND_ASSIGN(ReshardReport report, Reshard(Opts(2)));
  EXPECT_EQ(report.entries[0].layout, "partial");
  ExpectEqual(Src(), Dst());
  EXPECT_THAT(Reshard([&] {
                ReshardOptions o = Opts(1);
                o.dst = tmp_ / "one";
                return o;
              }()),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs --to >= 2"));
}

TEST_F(ReshardTest, ReadsFromSourceInBoundedPieces) {
  // 8 MiB tensor; the writer asks for at most a few MiB at a time.
  CKPT_ASSERT_OK(WriteFixture(Src(), 1, 2,
                              {{"w",
                                DType::kFloat32,
                                {1024, 2048},
                                Layout::kRows,
                                std::string(8u << 20, '\x3f')}}));
  CKPT_ASSERT_OK_AND_ASSIGN(ReshardReport report, Reshard(Opts(3)));
  EXPECT_EQ(report.tensor_bytes, 8u << 20);
  EXPECT_GT(report.largest_read, 0u);
  EXPECT_LE(report.largest_read, 2u << 20);
  ExpectEqual(Src(), Dst());
}

TEST_F(ReshardTest, VerifyComparesTheOutput) {
  CKPT_ASSERT_OK(WriteFixture(Src(), 1, 4, Model(), Objects()));
  ReshardOptions o = Opts(2);
  o.verify = true;
  CKPT_ASSERT_OK_AND_ASSIGN(ReshardReport report, Reshard(o));
  ASSERT_TRUE(report.verify.has_value());
  EXPECT_TRUE(report.verify->equal());
  EXPECT_EQ(report.verify->entries_compared, report.entries.size());
}

}  // namespace
}  // namespace ckpt::tools

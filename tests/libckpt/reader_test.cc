// Reader: strict mode, callbacks, reports, partial reads, and corruption.
#include "ckpt/reader.h"

#include <filesystem>
#include <fstream>

#include "ckpt/format/status_macros.h"
#include "ckpt/writer.h"
#include "format/golden_spec.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "load/reader_impl.h"  // NameOrder
#include "testing/status_matchers.h"
#include "tools/inspect/fixture.h"

namespace ckpt {
namespace {

using ::ckpt::testing::Extract;
using ::ckpt::testing::ReferenceBytes;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;

class ReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto writer = Writer::Create({}).value();
    CKPT_ASSERT_OK(writer->AddTensor("optimizer.exp_avg.layers.3",
                                     DType::kFloat32, {64}, FlatRange{0, 64},
                                     avg_.data()));
    CKPT_ASSERT_OK(writer->AddTensor("big", DType::kFloat32, {1024, 256},
                                     FullBox({1024, 256}), big_.data()));
    CKPT_ASSERT_OK(writer->SetObject("rng", "seed"));
    SaveOptions o;
    o.block_size = 4096;
    CKPT_ASSERT_OK(writer->Save(dir_.path(), 3, o));
    reader_ = Reader::Open(dir_.path()).value();
  }

  LoadRequest Avg(std::string* buf, Shape shape = {64},
                  DType d = DType::kFloat32) {
    buf->assign(64 * 4, 0);
    return LoadRequest{"optimizer.exp_avg.layers.3", d, shape, FlatRange{0, 64},
                       buf->data()};
  }

  TempDir dir_;
  std::string avg_ = ReferenceBytes(DType::kFloat32, {64}, 5);
  std::string big_ = ReferenceBytes(DType::kFloat32, {1024, 256}, 6);
  std::unique_ptr<Reader> reader_;
};

TEST_F(ReaderTest, GlobalShapeMismatchNamesEntryAndBothShapes) {
  std::string buf;
  LoadOptions all;
  all.allow_unrequested = true;
  EXPECT_THAT(reader_->Load({Avg(&buf, {128})}, all),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "optimizer.exp_avg.layers.3: global shape [64] in "
                       "checkpoint, [128] requested"));
}

TEST_F(ReaderTest, DTypeMismatch) {
  std::string buf;
  LoadOptions all;
  all.allow_unrequested = true;
  EXPECT_THAT(reader_->Load({Avg(&buf, {64}, DType::kBFloat16)}, all),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "optimizer.exp_avg.layers.3: dtype float32 in "
                       "checkpoint, bfloat16 requested"));
}

TEST_F(ReaderTest, MissingEntry) {
  std::string buf(4, 0);
  LoadOptions all;
  all.allow_unrequested = true;
  EXPECT_THAT(
      reader_->Load(
          {{"nope", DType::kFloat32, {1}, FlatRange{0, 1}, buf.data()}}, all),
      StatusIs(absl::StatusCode::kNotFound,
               "entry 'nope' is not in the checkpoint"));
}

TEST_F(ReaderTest, UnrequestedEntriesFailWithoutAFilter) {
  std::string buf;
  EXPECT_THAT(
      reader_->Load({Avg(&buf)}),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               "2 entries in the checkpoint were not requested: big, rng"));
}

TEST_F(ReaderTest, FilterMakesPartialLoadExplicitAndReported) {
  std::string buf;
  LoadOptions o;
  o.filter = [](const std::string& n) { return n.rfind("optimizer.", 0) == 0; };
  auto report = reader_->Load({Avg(&buf)}, o);
  CKPT_ASSERT_OK(report);
  EXPECT_EQ(buf, avg_);
  EXPECT_EQ(report->loaded,
            std::vector<std::string>{"optimizer.exp_avg.layers.3"});
  ASSERT_EQ(report->not_loaded.size(), 2u);
  EXPECT_EQ(report->not_loaded[0],
            (std::pair<std::string, std::string>{"big", "excluded by filter"}));
  std::string big(16, 0);
  EXPECT_THAT(
      reader_->Load(
          {Avg(&buf),
           {"big", DType::kFloat32, {1024, 256}, FlatRange{0, 4}, big.data()}},
          o),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "'big' is requested but excluded by the filter"));
}

TEST_F(ReaderTest, NotLoadedIsSortedByNameAndCanBeLeftEmpty) {
  std::string buf;
  LoadOptions o;
  o.allow_unrequested = true;
  auto report = reader_->Load({Avg(&buf)}, o);
  CKPT_ASSERT_OK(report);
  using Why = std::pair<std::string, std::string>;
  EXPECT_EQ(report->not_loaded, (std::vector<Why>{{"big", "not requested"},
                                                  {"rng", "not requested"}}));
  o.report_not_loaded = false;
  buf.clear();
  report = reader_->Load({Avg(&buf)}, o);
  CKPT_ASSERT_OK(report);
  EXPECT_EQ(buf, avg_);
  EXPECT_TRUE(report->not_loaded.empty());
  EXPECT_EQ(report->loaded,
            std::vector<std::string>{"optimizer.exp_avg.layers.3"});
}

TEST(NameOrderTest, SortsOnlyWhatIsNotInNameOrder) {
  format::Manifest m;
  for (const char* n : {"b", "a", "c"}) {
    m.entries.emplace_back();
    m.entries.back().name = n;
  }
  EXPECT_EQ(internal::NameOrder(m), (std::vector<uint32_t>{1, 0, 2}));
  std::swap(m.entries[0], m.entries[1]);
  EXPECT_EQ(internal::NameOrder(m), (std::vector<uint32_t>{0, 1, 2}));
}

TEST_F(ReaderTest, CallbackRunsOncePerDestinationBeforeLoadReturns) {
  std::string a, b(8 * 256 * 4, 0), c(4 * 4 * 4, 0);
  std::atomic<int> calls_a{0}, calls_b{0}, calls_c{0};
  std::vector<LoadRequest> reqs;
  reqs.push_back(Avg(&a));
  reqs.back().on_complete = [&] { ++calls_a; };
  // b spans many blocks and several read tasks.
  reqs.push_back(
      {"big", DType::kFloat32, {1024, 256}, Box{{100, 0}, {8, 256}}, b.data()});
  reqs.back().on_complete = [&] {
    ++calls_b;
    EXPECT_EQ(b, Extract(big_, DType::kFloat32, {1024, 256},
                         Box{{100, 0}, {8, 256}}));
  };
  reqs.push_back(
      {"big", DType::kFloat32, {1024, 256}, Box{{0, 10}, {4, 4}}, c.data()});
  reqs.back().on_complete = [&] { ++calls_c; };
  LoadOptions o;
  o.allow_unrequested = true;
  CKPT_ASSERT_OK(reader_->Load(reqs, o));
  EXPECT_EQ(calls_a, 1);
  EXPECT_EQ(calls_b, 1);
  EXPECT_EQ(calls_c, 1);
}

// Column bands are copied a row at a time, each row's bytes counted
// towards their request by a tally that holds a few requests at once
// (ReadExecutor::Tally): with more bands than it holds, interleaved row by
// row, every band is still completed once, whole, before Load returns.
TEST_F(ReaderTest, MoreColumnBandsThanATallyHoldsCompleteOnceEach) {
  constexpr int kBands = 16;  // of 16 columns each: twice a tally's requests
  std::vector<std::string> bufs(kBands, std::string(1024 * 16 * 4, 0));
  std::vector<std::atomic<int>> calls(kBands);
  std::vector<LoadRequest> reqs;
  for (int i = 0; i < kBands; ++i) {
    const Box band{{0, 16 * static_cast<uint64_t>(i)}, {1024, 16}};
    reqs.push_back({"big", DType::kFloat32, {1024, 256}, band, bufs[i].data()});
    reqs.back().on_complete = [&, i, band] {
      ++calls[i];
      EXPECT_EQ(bufs[i], Extract(big_, DType::kFloat32, {1024, 256}, band))
          << "band " << i;
    };
  }
  LoadOptions o;
  o.allow_unrequested = true;
  CKPT_ASSERT_OK(reader_->Load(reqs, o));
  for (int i = 0; i < kBands; ++i) EXPECT_EQ(calls[i], 1) << "band " << i;
}

TEST_F(ReaderTest, SmallSliceReadsOnlyTheBlocksItNeeds) {
  // 4 floats of column 10..13 in rows 0..3: rows are 1 KiB, blocks 4 KiB,
  // so one block is read, not the 1 MiB tensor.
  std::string c(4 * 4 * 4, 0);
  LoadOptions o;
  o.allow_unrequested = true;
  auto report = reader_->Load(
      {{"big", DType::kFloat32, {1024, 256}, Box{{0, 10}, {4, 4}}, c.data()}},
      o);
  CKPT_ASSERT_OK(report);
  EXPECT_EQ(report->bytes_read, 4096u);
  EXPECT_EQ(report->blocks_verified, 1u);
  EXPECT_EQ(c,
            Extract(big_, DType::kFloat32, {1024, 256}, Box{{0, 10}, {4, 4}}));
}

TEST_F(ReaderTest, RegionOutsideTensor) {
  std::string c(64, 0);
  LoadOptions o;
  o.allow_unrequested = true;
  EXPECT_THAT(reader_->Load({{"big",
                              DType::kFloat32,
                              {1024, 256},
                              Box{{1020, 0}, {8, 2}},
                              c.data()}},
                            o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "big: box [1020:1028, 0:2] exceeds shape"));
}

TEST_F(ReaderTest, ObjectAndReport) {
  auto obj = reader_->ReadObject("rng");
  CKPT_ASSERT_OK(obj);
  EXPECT_EQ(*obj, "seed");
  EXPECT_THAT(reader_->ReadObject("big"),
              StatusIs(absl::StatusCode::kInvalidArgument, "is a tensor"));
}

TEST_F(ReaderTest, FlippedPayloadBitIsDataLossNamingTheBlock) {
  std::string shard = dir_.path() + "/step-00000003/shard-00000.ckpt";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8192 + 100);  // inside the payload area
    char ch;
    f.seekg(8192 + 100);
    f.get(ch);
    f.seekp(8192 + 100);
    f.put(static_cast<char>(ch ^ 0x04));
  }
  auto reader = Reader::Open(dir_.path()).value();
  std::string a, big(big_.size(), 0), rng;
  std::vector<LoadRequest> reqs = {
      Avg(&a),
      {"big", DType::kFloat32, {1024, 256}, FullBox({1024, 256}), big.data()}};
  reqs.push_back({});
  reqs.back().name = "rng";
  reqs.back().object = &rng;
  EXPECT_THAT(reader->Load(reqs),
              StatusIs(absl::StatusCode::kDataLoss, "shard-00000.ckpt: block"));
}

TEST_F(ReaderTest, MissingShardFile) {
  std::filesystem::remove(dir_.path() + "/step-00000003/shard-00000.ckpt");
  auto reader = Reader::Open(dir_.path()).value();
  std::string a;
  LoadOptions o;
  o.allow_unrequested = true;
  EXPECT_THAT(reader->Load({Avg(&a)}, o),
              StatusIs(absl::StatusCode::kDataLoss, "shard file is missing"));
}

TEST_F(ReaderTest, ShardFromAnotherCheckpoint) {
  // Save the same structure again as step 4 and swap its shard into step 3.
  auto writer = Writer::Create({}).value();
  CKPT_ASSERT_OK(writer->AddTensor("optimizer.exp_avg.layers.3",
                                   DType::kFloat32, {64}, FlatRange{0, 64},
                                   avg_.data()));
  CKPT_ASSERT_OK(writer->AddTensor("big", DType::kFloat32, {1024, 256},
                                   FullBox({1024, 256}), big_.data()));
  CKPT_ASSERT_OK(writer->SetObject("rng", "seed"));
  SaveOptions o;
  o.block_size = 4096;
  CKPT_ASSERT_OK(writer->Save(dir_.path(), 4, o));
  std::filesystem::copy_file(dir_.path() + "/step-00000004/shard-00000.ckpt",
                             dir_.path() + "/step-00000003/shard-00000.ckpt",
                             std::filesystem::copy_options::overwrite_existing);
  auto reader = Reader::Open(dir_.path() + "/step-00000003").value();
  std::string a;
  LoadOptions lo;
  lo.allow_unrequested = true;
  EXPECT_THAT(reader->Load({Avg(&a)}, lo),
              StatusIs(absl::StatusCode::kDataLoss,
                       "this shard belongs to another checkpoint"));
}

TEST(ReaderOpenTest, NotACheckpoint) {
  TempDir dir;
  EXPECT_THAT(Reader::Open(dir.path()),
              StatusIs(absl::StatusCode::kNotFound,
                       "not a checkpoint (no MANIFEST) nor a checkpoint root"));
  EXPECT_THAT(Reader::Open(dir / "missing"),
              StatusIs(absl::StatusCode::kNotFound, "missing"));
}

TEST(ReaderOpenTest, PartialEntryLoadOfUncoveredRegionFails) {
  TempDir dir;
  auto writer = Writer::Create({}).value();
  float x[4] = {1, 2, 3, 4};
  TensorOptions partial;
  partial.partial = true;
  CKPT_ASSERT_OK(writer->AddTensor("emb", DType::kFloat32, {8}, FlatRange{0, 4},
                                   x, partial));
  CKPT_ASSERT_OK(writer->Save(dir.path(), 1, {}));
  auto reader = Reader::Open(dir.path()).value();
  float y[8];
  EXPECT_THAT(reader->Load({{"emb", DType::kFloat32, {8}, FlatRange{0, 8}, y}}),
              StatusIs(absl::StatusCode::kDataLoss,
                       "entry 'emb': requested region flat[0:8) is not covered "
                       "by the checkpoint: 4 of 8 elements missing"));
  CKPT_EXPECT_OK(
      reader->Load({{"emb", DType::kFloat32, {8}, FlatRange{1, 3}, y}}));
  EXPECT_EQ(y[0], 2);
}

TEST_F(ReaderTest, ViewsDescribeTheCheckpointWithoutRecords) {
  const CheckpointDescription& d = reader_->description();
  EXPECT_EQ(d.step, 3u);
  EXPECT_EQ(d.world_size, 1u);
  EXPECT_EQ(d.id.size(), 32u);
  EXPECT_EQ(d.format_version, "1.0");
  std::vector<EntryView> entries = reader_->entries();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].name(), "big");  // manifest order: by name
  std::optional<EntryView> big = reader_->FindEntry("big");
  ASSERT_TRUE(big.has_value());
  EXPECT_FALSE(big->is_object());
  EXPECT_EQ(big->dtype(), DType::kFloat32);
  EXPECT_EQ(big->shape(), (Shape{1024, 256}));
  EXPECT_FALSE(big->partial());
  ASSERT_EQ(big->num_chunks(), 1u);
  EXPECT_EQ(big->chunk_region(0), Region(FullBox({1024, 256})));
  EXPECT_EQ(big->chunk_shard(0), 0u);
  EXPECT_EQ(big->chunk_stored_bytes(0), 1024u * 256 * 4);
  std::optional<EntryView> rng = reader_->FindEntry("rng");
  ASSERT_TRUE(rng.has_value());
  EXPECT_TRUE(rng->is_object());
  EXPECT_EQ(rng->shape(), (Shape{4}));
  EXPECT_FALSE(reader_->FindEntry("nope").has_value());
}

TEST(ReaderGoldenTest, GoldenV1CheckpointLoadsThroughTheReader) {
  auto reader =
      Reader::Open(std::string(CKPT_SOURCE_DIR) + "/" + golden::kGoldenDir);
  CKPT_ASSERT_OK(reader);
  std::vector<golden::GoldenEntry> entries = golden::GoldenEntries();
  std::vector<std::string> bufs(entries.size());
  std::vector<LoadRequest> reqs;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    bufs[i].assign(testing::Numel(e.shape) * DTypeSize(e.dtype), 0);
    reqs.push_back(
        {e.name, e.dtype, e.shape, FullBox(e.shape), bufs[i].data()});
  }
  std::string rng;
  reqs.push_back({});
  reqs.back().name = golden::kObjectName;
  reqs.back().object = &rng;
  CKPT_ASSERT_OK((*reader)->Load(reqs));
  for (size_t i = 0; i < entries.size(); ++i)
    EXPECT_EQ(bufs[i], golden::GoldenBytes(entries[i])) << entries[i].name;
  EXPECT_EQ(rng, golden::kObjectValue);
}

// The spec decisions the Reader shares with ckpt-validate through the read
// core (spec/FORMAT.md changelog), on checkpoints written byte by byte.
namespace spec_decisions {

using ::ckpt::tools::testing::FixtureSpec;
using ::ckpt::tools::testing::FixtureTensor;
using ::ckpt::tools::testing::WriteCheckpoint;

// "b" (bool, in shard 0) and "empty" (no element, no chunk).
FixtureSpec Spec() {
  FixtureSpec spec;
  spec.world = 2;
  FixtureTensor b{"b", DType::kBool, {4}};
  b.pieces = {{FullBox({4}), 0}};
  b.data = std::string("\1\0\1\1", 4);
  FixtureTensor empty{"empty", DType::kFloat32, {0, 4}};
  spec.tensors = {b, empty};
  return spec;
}

absl::Status LoadAll(const std::string& dir) {
  auto reader = Reader::Open(dir);
  if (!reader.ok()) return reader.status();
  std::string b(4, '\0');
  float none;
  return (*reader)
      ->Load({{"b", DType::kBool, {4}, FullBox({4}), b.data()},
              {"empty", DType::kFloat32, {0, 4}, FullBox({0, 4}), &none}})
      .status();
}

TEST(ReaderSpecTest, ChunklessEntryListedByAShardIndexLoads) {
  TempDir tmp;
  CKPT_EXPECT_OK(LoadAll(WriteCheckpoint(tmp.path(), Spec())));
}

TEST(ReaderSpecTest, ChunklessEntryInNoShardIndexIsDataLoss) {
  TempDir tmp;
  FixtureSpec spec = Spec();
  spec.edit_index = [](uint32_t, format::ShardIndex* index) {
    auto& v = index->entries;
    v.erase(std::remove_if(v.begin(), v.end(),
                           [](auto& e) { return e.name == "empty"; }),
            v.end());
  };
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  EXPECT_THAT(LoadAll(dir),
              StatusIs(absl::StatusCode::kDataLoss,
                       dir + ": entry 'empty': has no chunk in any shard"));
}

TEST(ReaderSpecTest,
     EmptyIndexMetadataSectionWhenTheManifestHasPairsIsDataLoss) {
  TempDir tmp;
  FixtureSpec spec = Spec();
  spec.edit_index = [](uint32_t, format::ShardIndex* index) {
    index->metadata.clear();
    index->metadata_present = true;
  };
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  EXPECT_THAT(
      LoadAll(dir),
      StatusIs(absl::StatusCode::kDataLoss,
               "shard-00000.ckpt: METADATA differs from the manifest's"));
}

TEST(ReaderSpecTest, BoolByteOtherThanZeroOrOneIsDataLoss) {
  TempDir tmp;
  FixtureSpec spec = Spec();
  spec.tensors[0].data[2] = 7;
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  EXPECT_THAT(LoadAll(dir),
              StatusIs(absl::StatusCode::kDataLoss,
                       "block 0 of chunk 0 [0:4] of 'b': bool element 2 of the "
                       "chunk is 0x07"));
}

}  // namespace spec_decisions

}  // namespace
}  // namespace ckpt

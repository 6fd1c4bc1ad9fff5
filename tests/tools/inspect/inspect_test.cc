#include "inspect/inspect.h"

#include <cmath>
#include <filesystem>
#include <sstream>

#include "ckpt/format/status_macros.h"
#include "common/escaped_output.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "tools/inspect/fixture.h"

namespace ckpt::tools {
namespace {

using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;
using format::ChunkRecord;
using format::EntryRecord;
using testing::StandardSpec;
using testing::WriteCheckpoint;

EntryRecord Entry(Shape shape, std::vector<Region> regions,
                  bool partial = false) {
  EntryRecord e;
  e.name = "t";
  e.shape = std::move(shape);
  e.flags = partial ? format::kEntryFlagPartial : 0;
  for (Region& r : regions) {
    ChunkRecord c;
    c.region = std::move(r);
    e.chunks.push_back(std::move(c));
  }
  return e;
}

TEST(ShardingSummary, Whole) {
  EXPECT_EQ(ShardingSummary(Entry({4, 4}, {FullBox({4, 4})})), "whole");
  EXPECT_EQ(ShardingSummary(Entry({4, 4}, {FlatRange{0, 16}})), "whole");
  EXPECT_EQ(ShardingSummary(Entry({}, {FullBox({})})), "whole");
}

TEST(ShardingSummary, RowsAndColumns) {
  EXPECT_EQ(ShardingSummary(
                Entry({8, 2}, {Box{{0, 0}, {2, 2}}, Box{{2, 0}, {2, 2}},
                               Box{{4, 0}, {2, 2}}, Box{{6, 0}, {2, 2}}})),
            "dim0 x4");
  EXPECT_EQ(ShardingSummary(
                Entry({2, 3}, {Box{{0, 2}, {2, 1}}, Box{{0, 0}, {2, 2}}})),
            "dim1 x2 uneven");
}

TEST(ShardingSummary, GridInAnyOrder) {
  std::vector<Region> r;
  for (uint64_t j = 0; j < 4; ++j) {
    for (uint64_t i = 0; i < 2; ++i) r.push_back(Box{{i * 2, j}, {2, 1}});
  }
  EXPECT_EQ(ShardingSummary(Entry({4, 4}, r)), "dim0 x2 dim1 x4");
}

TEST(ShardingSummary, FlatEvenAndUneven) {
  EXPECT_EQ(ShardingSummary(Entry({8}, {FlatRange{0, 4}, FlatRange{4, 4}})),
            "flat x2 even");
  EXPECT_EQ(ShardingSummary(Entry({8}, {FlatRange{0, 3}, FlatRange{3, 5}})),
            "flat x2 uneven");
}

TEST(ShardingSummary, IrregularAndMixed) {
  EXPECT_EQ(
      ShardingSummary(Entry({4, 4}, {Box{{0, 0}, {2, 4}}, Box{{2, 0}, {2, 2}},
                                     Box{{2, 2}, {2, 2}}})),
      "irregular x3");
  EXPECT_EQ(
      ShardingSummary(Entry({4, 4}, {Box{{0, 0}, {2, 4}}, FlatRange{8, 8}})),
      "irregular x2");
  // As many boxes as grid cells, but one cell twice and one missing.
  EXPECT_EQ(ShardingSummary(
                Entry({2, 2}, {Box{{0, 0}, {1, 1}}, Box{{0, 0}, {1, 1}},
                               Box{{1, 1}, {1, 1}}, Box{{0, 1}, {1, 1}}})),
            "irregular x4");
}

TEST(ShardingSummary, NoneEmptyAndPartial) {
  EXPECT_EQ(ShardingSummary(Entry({0, 4}, {})), "none");
  EXPECT_EQ(ShardingSummary(Entry({4}, {FlatRange{0, 0}, FlatRange{4, 0}})),
            "empty");
  EXPECT_EQ(ShardingSummary(Entry({10}, {FlatRange{0, 5}}, true)),
            "flat x1 even partial");
  EXPECT_EQ(ShardingSummary(Entry({4, 4}, {Box{{0, 0}, {2, 4}}}, true)),
            "box x1 partial");
}

TEST(ShardingSummary, IgnoresChunksWithoutElements) {
  EXPECT_EQ(ShardingSummary(Entry({4}, {FlatRange{0, 0}, FlatRange{0, 4}})),
            "whole");
}

TEST(Summarize, TotalsAndCompression) {
  TempDir tmp;
  WriteCheckpoint(tmp.path(), StandardSpec());
  CKPT_ASSERT_OK_AND_ASSIGN(CheckpointSummary s, LoadSummary(tmp.path()));
  EXPECT_EQ(s.dir, tmp / "step-00000007");
  EXPECT_EQ(s.manifest.info.step, 7u);
  EXPECT_EQ(s.tensors, 14u);
  EXPECT_EQ(s.objects, 2u);
  EXPECT_EQ(s.entries.size(), 16u);
  // Only lm_head.w is compressed; everything else is stored raw.
  EXPECT_GT(s.compression_ratio(), 1.0);
  EXPECT_EQ(s.raw_bytes,
            s.logical_bytes - 20);  // 'sparse' stores 5 of 10 floats
  CKPT_ASSERT_OK_AND_ASSIGN(size_t i, s.FindEntry("layers.0.attn.w"));
  EXPECT_EQ(s.entries[i].sharding, "dim0 x2 dim1 x2");
  EXPECT_EQ(s.entries[i].logical_bytes, 256u);
}

TEST(LoadSummary, MissingDirectory) {
  TempDir tmp;
  EXPECT_THAT(LoadSummary(tmp / "nope"),
              StatusIs(absl::StatusCode::kNotFound,
                       "nope: no such checkpoint or checkpoint root"));
}

TEST(LoadSummary, NotACheckpoint) {
  TempDir tmp;
  EXPECT_THAT(LoadSummary(tmp.path()),
              StatusIs(absl::StatusCode::kNotFound,
                       "not a checkpoint (no MANIFEST) nor a checkpoint root "
                       "(no 'latest')"));
}

TEST(LoadSummary, CorruptManifestNamesTheFile) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  testing::FlipByte(dir + "/MANIFEST", 100);
  EXPECT_THAT(LoadSummary(dir),
              StatusIs(absl::StatusCode::kDataLoss, dir + "/MANIFEST: "));
}

TEST(LoadSummary, ReadsOnlyTheManifest) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  std::filesystem::remove(dir + "/shard-00001.ckpt");
  CKPT_EXPECT_OK(LoadSummary(dir));
}

TEST(FindEntry, UnknownEntry) {
  TempDir tmp;
  WriteCheckpoint(tmp.path(), StandardSpec());
  CKPT_ASSERT_OK_AND_ASSIGN(CheckpointSummary s, LoadSummary(tmp.path()));
  EXPECT_THAT(s.FindEntry("nope"),
              StatusIs(absl::StatusCode::kNotFound,
                       "entry 'nope' is not in the checkpoint " +
                           tmp / "step-00000007"));
}

TEST(AddStats, ValuesOfEveryTensor) {
  TempDir tmp;
  WriteCheckpoint(tmp.path(), StandardSpec());
  CKPT_ASSERT_OK_AND_ASSIGN(CheckpointSummary s, LoadSummary(tmp.path()));
  CKPT_ASSERT_OK(AddStats(&s, "", 2));
  auto stats = [&](const std::string& name) {
    size_t i = s.FindEntry(name).value();
    EXPECT_TRUE(s.entries[i].has_stats) << name;
    return s.entries[i].stats;
  };
  // i * 0.25 - 8 for i in [0, 64).
  ValueStats w = stats("layers.0.attn.w");
  EXPECT_EQ(w.count, 64u);
  EXPECT_EQ(w.min, -8);
  EXPECT_EQ(w.max, 7.75);
  EXPECT_DOUBLE_EQ(w.mean(), -0.125);
  double ss = 0;
  for (int i = 0; i < 64; ++i) ss += (i * 0.25 - 8) * (i * 0.25 - 8);
  EXPECT_DOUBLE_EQ(w.l2(), std::sqrt(ss));
  // Decoded from zstd blocks.
  ValueStats head = stats("lm_head.w");
  EXPECT_EQ(head.count, 4096u);
  EXPECT_DOUBLE_EQ(head.mean(), 1.5);
  // Narrow floats, integers, bool; a partial entry counts what is stored.
  EXPECT_EQ(stats("scales").max, 448);
  EXPECT_EQ(stats("grads8").min, -2);
  EXPECT_EQ(stats("layers.0.mlp.w").min, -3);
  EXPECT_EQ(stats("embed.w").max, 3);
  EXPECT_EQ(stats("tokens").max, 300);
  EXPECT_DOUBLE_EQ(stats("mask").mean(), 0.4);
  EXPECT_EQ(stats("step").sum, 7);
  EXPECT_EQ(stats("sparse").count, 5u);
  EXPECT_EQ(stats("empty").count, 0u);
  EXPECT_FALSE(s.entries[s.FindEntry("rng.rank0").value()].has_stats);
}

TEST(AddStats, OnlyOneEntry) {
  TempDir tmp;
  WriteCheckpoint(tmp.path(), StandardSpec());
  CKPT_ASSERT_OK_AND_ASSIGN(CheckpointSummary s, LoadSummary(tmp.path()));
  CKPT_ASSERT_OK(AddStats(&s, "tokens", 1));
  for (const EntrySummary& e : s.entries) {
    EXPECT_EQ(e.has_stats, s.manifest.entries[e.index].name == "tokens");
  }
}

TEST(AddStats, CorruptBlockNamesFileEntryChunkAndBlock) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  testing::FlipByte(dir + "/shard-00002.ckpt",
                    testing::ChunkOffset(dir, "lm_head.w", 1) + 10);
  CKPT_ASSERT_OK_AND_ASSIGN(CheckpointSummary s, LoadSummary(tmp.path()));
  EXPECT_THAT(
      AddStats(&s, "", 2),
      StatusIs(absl::StatusCode::kDataLoss,
               dir + "/shard-00002.ckpt: block 0 of chunk 1 [32:64, 0:64] of "
                     "'lm_head.w': checksum 0x"));
}

TEST(InspectJson, RequiredFields) {
  TempDir tmp;
  WriteCheckpoint(tmp.path(), StandardSpec());
  CKPT_ASSERT_OK_AND_ASSIGN(CheckpointSummary s, LoadSummary(tmp.path()));
  nlohmann::ordered_json j = InspectJson(s);
  EXPECT_EQ(j["format_version"], "1.0");
  EXPECT_EQ(j["step"], 7);
  EXPECT_EQ(j["world_size"], 4);
  ASSERT_EQ(j["entries"].size(), 16u);
  EXPECT_EQ(j["entries"][0]["name"], "embed.w");
  EXPECT_EQ(j["entries"][0]["dtype"], "bfloat16");
  EXPECT_EQ(j["entries"][0]["shape"], nlohmann::ordered_json::array({16, 8}));
  EXPECT_EQ(j["entries"][0]["chunks"], 4);
  EXPECT_FALSE(j["entries"][0].contains("chunk_map"));
  nlohmann::ordered_json one =
      InspectJson(s, static_cast<int64_t>(s.FindEntry("grads8").value()));
  ASSERT_EQ(one["entries"].size(), 1u);
  ASSERT_EQ(one["entries"][0]["chunk_map"].size(), 2u);
  EXPECT_EQ(one["entries"][0]["chunk_map"][1]["flat"]["start"], 4);
  EXPECT_EQ(one["entries"][0]["chunk_map"][1]["shard"], 1);
}

// What --json prints, one element at a time, is the document's text, with
// stats and with an entry's chunk map.
TEST(PrintInspectJson, SameTextAsTheDocument) {
  TempDir tmp;
  WriteCheckpoint(tmp.path(), StandardSpec());
  CKPT_ASSERT_OK_AND_ASSIGN(CheckpointSummary s, LoadSummary(tmp.path()));
  CKPT_ASSERT_OK(AddStats(&s, "", 2));
  const int64_t grads8 = static_cast<int64_t>(s.FindEntry("grads8").value());
  for (int64_t entry : {int64_t{-1}, int64_t{0}, grads8}) {
    std::ostringstream out;
    PrintInspectJson(s, entry, out);
    EXPECT_EQ(out.str(), JsonText(InspectJson(s, entry)) + "\n") << entry;
  }
}

}  // namespace
}  // namespace ckpt::tools

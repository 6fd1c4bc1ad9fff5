// Decodes the checked-in v1 golden checkpoint. These files are never
// regenerated: if this test fails, the change broke compatibility with
// format v1.
#include <fstream>
#include <set>
#include <sstream>

#include "ckpt/format/block_codec.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/shard.h"
#include "format/golden_spec.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace ckpt::golden {
namespace {

using namespace ckpt::format;

// A file of the source tree.
std::string Slurp(const std::string& path) {
  std::string bytes =
      ::ckpt::testing::ReadFileBytes(std::string(CKPT_SOURCE_DIR) + "/" + path);
  EXPECT_FALSE(bytes.empty()) << path;
  return bytes;
}

TEST(GoldenV1Test, LatestPointer) {
  auto d = DecodeLatest(Slurp(std::string(kGoldenDir) + "/latest"));
  CKPT_ASSERT_OK(d);
  EXPECT_EQ(*d, "step-00000042");
}

TEST(GoldenV1Test, ManifestDecodesAndCovers) {
  auto m = DecodeManifest(Slurp(std::string(kGoldenCheckpoint) + "/MANIFEST"));
  CKPT_ASSERT_OK(m);
  CKPT_EXPECT_OK(ValidateCoverage(*m));
  EXPECT_EQ(m->info.step, kStep);
  EXPECT_EQ(m->info.world_size, 2u);
  EXPECT_EQ(m->required_features, kFeatureZstd);
  ASSERT_EQ(m->metadata.size(), 1u);
  EXPECT_EQ(m->metadata[0].second, "golden");
  std::vector<GoldenEntry> expected = GoldenEntries();
  ASSERT_EQ(m->entries.size(), expected.size() + 1);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(m->entries[i].name, expected[i].name);
    EXPECT_EQ(m->entries[i].dtype, expected[i].dtype);
    EXPECT_EQ(m->entries[i].shape, expected[i].shape);
    ASSERT_EQ(m->entries[i].chunks.size(), expected[i].chunks.size());
    for (size_t c = 0; c < expected[i].chunks.size(); ++c) {
      EXPECT_EQ(m->entries[i].chunks[c].region, expected[i].chunks[c].region);
      EXPECT_EQ(m->entries[i].chunks[c].shard, expected[i].chunks[c].shard);
    }
  }
  EXPECT_EQ(m->entries.back().kind, EntryKind::kObject);
}

TEST(GoldenV1Test, EveryBlockOfEveryShardDecodesToTheExpectedBytes) {
  auto m = DecodeManifest(Slurp(std::string(kGoldenCheckpoint) + "/MANIFEST"));
  CKPT_ASSERT_OK(m);
  std::vector<GoldenEntry> expected = GoldenEntries();
  BlockDecoder dec;
  int blocks = 0;
  for (const ShardInfo& si : m->shards) {
    std::string file =
        Slurp(std::string(kGoldenCheckpoint) + "/" + si.file_name);
    ASSERT_EQ(file.size(), si.file_size);
    auto h = DecodeShardHeader(file);
    CKPT_ASSERT_OK(h);
    EXPECT_EQ(h->checkpoint_id, m->info.id);
    auto t = DecodeShardTail(file, file.size());
    CKPT_ASSERT_OK(t);
    auto idx = DecodeShardIndex(
        absl::string_view(file).substr(t->index_offset, t->index_length), *h,
        *t);
    CKPT_ASSERT_OK(idx);
    for (const EntryRecord& e : idx->entries) {
      std::string global;
      const GoldenEntry* ge = nullptr;
      for (const auto& g : expected)
        if (g.name == e.name) ge = &g;
      global = ge ? GoldenBytes(*ge) : std::string(kObjectValue);
      int es = DTypeSize(e.dtype);
      uint64_t numel = global.size() / es;
      for (const ChunkRecord& c : e.chunks) {
        std::string local(RegionElements(c.region) * es, '\0');
        uint64_t pos = c.data_offset;
        for (size_t b = 0; b < c.blocks.size(); ++b) {
          uint64_t raw =
              std::min<uint64_t>(c.block_size, local.size() - b * c.block_size);
          CKPT_ASSERT_OK(dec.Decode(
              c.codec,
              absl::string_view(file).substr(pos, c.blocks[b].stored_size),
              c.blocks[b].checksum, raw, local.data() + b * c.block_size));
          pos += c.blocks[b].stored_size;
          ++blocks;
        }
        std::string want(local.size(), '\0');
        ForEachRun(e.shape, FlatRange{0, numel}, c.region,
                   [&](uint64_t s, uint64_t d, uint64_t n) {
                     std::memcpy(want.data() + d * es, global.data() + s * es,
                                 n * es);
                   });
        EXPECT_EQ(local, want) << e.name << " " << RegionToString(c.region);
      }
    }
  }
  EXPECT_GE(blocks, 20);
}

// §5.7: the manifest can be rebuilt from the shards only if every entry,
// including one with no chunks, appears in some shard's SHARD_CHUNKS.
TEST(GoldenV1Test, EntryWithNoChunksIsListedInShardZero) {
  auto m = DecodeManifest(Slurp(std::string(kGoldenCheckpoint) + "/MANIFEST"));
  CKPT_ASSERT_OK(m);
  std::set<std::string> indexed;
  for (const ShardInfo& si : m->shards) {
    std::string file =
        Slurp(std::string(kGoldenCheckpoint) + "/" + si.file_name);
    auto h = DecodeShardHeader(file);
    CKPT_ASSERT_OK(h);
    auto t = DecodeShardTail(file, file.size());
    CKPT_ASSERT_OK(t);
    auto idx = DecodeShardIndex(
        absl::string_view(file).substr(t->index_offset, t->index_length), *h,
        *t);
    CKPT_ASSERT_OK(idx);
    for (const EntryRecord& e : idx->entries) {
      indexed.insert(e.name);
      if (e.name == "empty") {
        EXPECT_EQ(h->shard_id, 0u);
        EXPECT_TRUE(e.chunks.empty());
        EXPECT_EQ(e.shape, (Shape{0, 4}));
      }
    }
  }
  EXPECT_EQ(indexed.count("empty"), 1u);
  for (const EntryRecord& e : m->entries) {
    EXPECT_EQ(indexed.count(e.name), 1u) << e.name << " is in no shard index";
  }
}

}  // namespace
}  // namespace ckpt::golden

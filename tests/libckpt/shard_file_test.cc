// The shared read core's shard checks (libckpt/read/shard_file.h,
// index_check.h): opening a shard against the manifest, index-against-manifest
// checks, chunk matching (§8.6), overlaps (§5.2), §5.7, and block
// reading/verification. One test per failure mode, asserting code and message.
#include "read/shard_file.h"

#include <filesystem>
#include <fstream>

#include "ckpt/format/checksum.h"
#include "ckpt/format/manifest.h"
#include "ckpt/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "read/index_check.h"
#include "storage/checkpoint_dir.h"
#include "testing/status_matchers.h"

namespace ckpt::internal {
namespace {

using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;
using format::BlockRecord;
using format::ChunkRecord;
using format::EntryRecord;
using format::Manifest;
using format::ShardIndex;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr auto kDataLoss = absl::StatusCode::kDataLoss;

// A checkpoint of one tensor, saved by the Writer, and its manifest.
class ShardFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto writer = Writer::Create({}).value();
    CKPT_ASSERT_OK(writer->AddTensor("w", DType::kFloat32, {64},
                                     FlatRange{0, 64}, data_.data()));
    SaveOptions o;
    o.metadata = {{"run", "a"}};
    CKPT_ASSERT_OK(writer->Save(root_.path(), 1, o).status());
    dir_ = ResolveCheckpointDir(DefaultStorage(), root_.path()).value();
    manifest_ =
        format::DecodeManifest(
            DefaultStorage()->ReadFile(JoinPath(dir_, "MANIFEST")).value())
            .value();
  }
  std::string ShardPath() const {
    return JoinPath(dir_, manifest_.shards[0].file_name);
  }
  absl::StatusOr<ShardFile> Open(const format::ShardInfo& info) {
    return OpenShardFile(DefaultStorage(), ShardPath(), info,
                         manifest_.info.id);
  }

  TempDir root_;
  std::string data_ = ::ckpt::testing::ReferenceBytes(DType::kFloat32, {64}, 3);
  std::string dir_;
  Manifest manifest_;
};

TEST_F(ShardFileTest, OpensAShardThatAgreesWithTheManifest) {
  auto s = Open(manifest_.shards[0]);
  CKPT_ASSERT_OK(s);
  EXPECT_EQ(s->header.shard_id, 0u);
  CKPT_EXPECT_OK(CheckIndexInfo(s->index, manifest_));
  CKPT_EXPECT_OK(CheckIndexMetadata(s->index, manifest_));
  ManifestIndex index(manifest_);
  std::vector<IndexProblem> problems;
  auto matched = MatchIndexChunks(index, 0, s->index, &problems);
  EXPECT_THAT(problems, IsEmpty());
  ASSERT_THAT(matched, SizeIs(1));
  EXPECT_THAT(matched[0].indexed->blocks, SizeIs(1));
}

TEST_F(ShardFileTest, MissingShardFile) {
  std::filesystem::remove(ShardPath());
  EXPECT_THAT(
      Open(manifest_.shards[0]),
      StatusIs(kDataLoss, "shard file is missing (shard 0 in the manifest)"));
}

TEST_F(ShardFileTest, ShardOfAnotherCheckpoint) {
  format::CheckpointId other = manifest_.info.id;
  other[0] ^= 1;
  EXPECT_THAT(
      OpenShardFile(DefaultStorage(), ShardPath(), manifest_.shards[0], other),
      StatusIs(kDataLoss, "this shard belongs to another checkpoint"));
}

TEST_F(ShardFileTest, ShardIdDiffersFromTheManifest) {
  format::ShardInfo info = manifest_.shards[0];
  info.shard_id = 3;
  EXPECT_THAT(Open(info),
              StatusIs(kDataLoss, "shard id 0 != 3 in the manifest"));
}

TEST_F(ShardFileTest, SizeDiffersFromTheManifest) {
  format::ShardInfo info = manifest_.shards[0];
  const uint64_t size = info.file_size;
  info.file_size = size + 1;
  EXPECT_THAT(Open(info),
              StatusIs(kDataLoss, absl::StrCat("file is ", size,
                                               " bytes, the manifest says ",
                                               size + 1, " (truncated)")));
  info.file_size = size - 1;
  EXPECT_THAT(Open(info), StatusIs(kDataLoss, "(extended)"));
}

TEST_F(ShardFileTest, IndexInfoDiffersNamingEachField) {
  ShardIndex index = Open(manifest_.shards[0]).value().index;
  index.info.step = 9;
  index.info.writer = "other";
  EXPECT_THAT(
      CheckIndexInfo(index, manifest_),
      StatusIs(kDataLoss,
               "CHECKPOINT_INFO differs from the manifest's: step 9 != 1, "
               "writer 'other' != '"));
}

TEST(CheckIndexMetadata, AbsentSectionIsNotCompared) {
  Manifest m;
  m.metadata = {{"k", "v"}};
  ShardIndex index;  // no METADATA section
  CKPT_EXPECT_OK(CheckIndexMetadata(index, m));
}

TEST(CheckIndexMetadata, EmptySectionWhenTheManifestHasPairsIsDataLoss) {
  Manifest m;
  m.metadata = {{"k", "v"}};
  ShardIndex index;
  index.metadata_present = true;  // a METADATA section with no pairs
  EXPECT_THAT(CheckIndexMetadata(index, m),
              StatusIs(kDataLoss,
                       "METADATA differs from the manifest's (0 pairs in the "
                       "index, 1 in the manifest)"));
}

TEST(CheckIndexMetadata, EqualSectionIsAccepted) {
  Manifest m;
  m.metadata = {{"k", "v"}};
  ShardIndex index;
  index.metadata = m.metadata;
  index.metadata_present = true;
  CKPT_EXPECT_OK(CheckIndexMetadata(index, m));
}

// A manifest with entry "a" (2 chunks in shard 0) and "b" (1 chunk in shard
// 1), and the index of shard 0 that agrees with it.
struct TwoEntries {
  Manifest m;
  ShardIndex index;
  TwoEntries() {
    m.info.world_size = 2;
    EntryRecord a{"a", format::EntryKind::kTensor, DType::kFloat32, 0, {8}, {}};
    a.chunks.push_back(Chunk(FlatRange{0, 4}, 0, 4096, 16));
    a.chunks.push_back(Chunk(FlatRange{4, 4}, 0, 8192, 16));
    EntryRecord b{"b", format::EntryKind::kTensor, DType::kFloat32, 0, {2}, {}};
    b.chunks.push_back(Chunk(FlatRange{0, 2}, 1, 4096, 8));
    m.entries = {a, b};
    EntryRecord ia = a;
    for (ChunkRecord& c : ia.chunks)
      c.blocks = {BlockRecord{c.stored_length, 1}};
    index.entries = {ia};
  }
  static ChunkRecord Chunk(Region r, uint32_t shard, uint64_t offset,
                           uint64_t length) {
    ChunkRecord c;
    c.region = r;
    c.shard = shard;
    c.data_offset = offset;
    c.stored_length = length;
    return c;
  }
  std::vector<IndexProblem> Match(std::vector<ChunkRef>* matched = nullptr) {
    ManifestIndex mi(m);
    std::vector<IndexProblem> problems;
    auto got = MatchIndexChunks(mi, 0, index, &problems);
    if (matched != nullptr) *matched = got;
    return problems;
  }
};

MATCHER_P3(Problem, entry, chunk, substr, "") {
  return arg.entry == entry && arg.chunk == chunk &&
         arg.message.find(substr) != std::string::npos;
}

TEST(MatchIndexChunks, ChunksInAnotherOrderMatch) {
  TwoEntries t;
  std::swap(t.index.entries[0].chunks[0], t.index.entries[0].chunks[1]);
  std::vector<ChunkRef> matched;
  EXPECT_THAT(t.Match(&matched), IsEmpty());
  ASSERT_THAT(matched, SizeIs(2));
  EXPECT_EQ(matched[0].chunk, 0u);  // by data_offset
  EXPECT_EQ(matched[0].indexed->data_offset, 4096u);
}

TEST(MatchIndexChunks, ManifestChunkMissingFromTheIndex) {
  TwoEntries t;
  t.index.entries[0].chunks.pop_back();
  EXPECT_THAT(t.Match(),
              ElementsAre(Problem("a", 1,
                                  "not in the shard index (the manifest "
                                  "puts it at offset 8192, 16 bytes)")));
}

TEST(MatchIndexChunks, IndexChunkTheManifestDoesNotList) {
  TwoEntries t;
  t.m.entries[0].chunks.pop_back();
  t.m.entries[0].flags = format::kEntryFlagPartial;
  t.index.entries[0].flags = format::kEntryFlagPartial;
  EXPECT_THAT(t.Match(),
              ElementsAre(Problem("a", -1,
                                  "the shard index has a chunk "
                                  "flat[4:8) at offset 8192 that the "
                                  "manifest does not list")));
}

TEST(MatchIndexChunks, ChunkFieldsDifferIndexFirst) {
  TwoEntries t;
  t.index.entries[0].chunks[1].block_size = 7;
  t.index.entries[0].chunks[1].codec = format::Codec::kZstd;
  EXPECT_THAT(t.Match(),
              ElementsAre(Problem("a", 1,
                                  "the shard index differs from the "
                                  "manifest: codec zstd != none, "
                                  "block_size 7 != 1048576 (index != "
                                  "manifest)")));
}

TEST(MatchIndexChunks, IndexEntryUnknownToTheManifest) {
  TwoEntries t;
  t.index.entries.push_back(t.index.entries[0]);
  t.index.entries.back().name = "ghost";
  EXPECT_THAT(t.Match(),
              ElementsAre(Problem("ghost", -1,
                                  "entry is in the shard index (2 "
                                  "chunks) but not in the manifest")));
}

TEST(MatchIndexChunks, IndexEntryDescribedDifferently) {
  TwoEntries t;
  t.index.entries[0].shape = {9};
  EXPECT_THAT(t.Match(),
              ElementsAre(Problem("a", -1,
                                  "the shard index has tensor float32 "
                                  "[9], the manifest has tensor float32 "
                                  "[8]")));
}

TEST(MatchIndexChunks, EntryTheIndexDoesNotList) {
  TwoEntries t;
  t.index.entries.clear();
  EXPECT_THAT(t.Match(),
              ElementsAre(Problem("a", 0,
                                  "the manifest stores 2 chunk(s) of this "
                                  "entry in this shard, but the shard index "
                                  "does not list the entry")));
}

TEST(MatchIndexChunks, DataOffsetIsIgnoredWithoutStoredBytes) {
  TwoEntries t;
  t.m.entries[0].chunks[0].stored_length = 0;
  t.m.entries[0].chunks[0].data_offset = 0;
  t.index.entries[0].chunks[0].stored_length = 0;
  t.index.entries[0].chunks[0].data_offset = 77;
  t.index.entries[0].chunks[0].blocks.clear();
  EXPECT_THAT(t.Match(), IsEmpty());
}

// A hostile index that lists an entry without the manifest's many chunks
// gets 100 problems listed and the rest counted, not one message per chunk
// (2^24 of them took over 3 GB in ckpt-validate).
TEST(MatchIndexChunks, ProblemsPastAHundredAreCountedNotListed) {
  TwoEntries t;
  EntryRecord& a = t.m.entries[0];
  a.flags = format::kEntryFlagPartial;
  t.index.entries[0].flags = format::kEntryFlagPartial;
  for (uint64_t i = 0; i < 1500; ++i) {
    a.chunks.push_back(TwoEntries::Chunk(FlatRange{8, 0}, 0, 0, 0));
  }
  const std::vector<IndexProblem> problems = t.Match();
  ASSERT_THAT(problems, SizeIs(101));
  EXPECT_EQ(problems[0].entry, "a");
  EXPECT_THAT(problems[0].message, HasSubstr("not in the shard index"));
  EXPECT_THAT(problems[100],
              Problem("", -1,
                      "1400 more disagreements between the shard index and "
                      "the manifest are not listed"));
}

TEST(FindPayloadOverlaps, OverlapNamesBothChunks) {
  TwoEntries t;
  t.m.entries[0].chunks[1].data_offset = 4100;
  t.index.entries[0].chunks[1].data_offset = 4100;
  std::vector<ChunkRef> matched;
  ASSERT_THAT(t.Match(&matched), IsEmpty());
  std::vector<IndexProblem> problems;
  FindPayloadOverlaps(t.m, matched, &problems);
  EXPECT_THAT(problems,
              ElementsAre(Problem("a", 1,
                                  "payload at offset 4100 overlaps that of "
                                  "chunk 0 of 'a' (offset 4096, 16 bytes)")));
}

TEST(UnindexedChunklessEntries, AnEntryWithoutChunksMustBeInSomeIndex) {
  TwoEntries t;
  t.m.entries.push_back(EntryRecord{
      "empty", format::EntryKind::kTensor, DType::kFloat32, 0, {0}, {}});
  EXPECT_THAT(UnindexedChunklessEntries(t.m, {&t.index}), ElementsAre(2u));
  t.index.entries.push_back(t.m.entries[2]);
  EXPECT_THAT(UnindexedChunklessEntries(t.m, {&t.index}), IsEmpty());
  EXPECT_THAT(ChunklessEntryNotIndexed(), StatusIs(kDataLoss, "§5.7"));
}

TEST_F(ShardFileTest, ReadExactlyShortReadNamesTheRangeAndTheEnd) {
  auto s = Open(manifest_.shards[0]).value();
  const uint64_t size = manifest_.shards[0].file_size;
  std::string buf(100, '\0');
  EXPECT_THAT(
      ReadExactly(*s.file, size - 10, 100, buf.data()),
      StatusIs(kDataLoss,
               absl::StrCat("reading bytes [", size - 10, ", ", size + 90,
                            "): file ends at offset ", size)));
}

// Entry `name` of dtype `dtype` with one chunk of `stored`, uncompressed,
// in blocks of 4 bytes.
struct OneChunk {
  EntryRecord e;
  ChunkRecord c;
  OneChunk(DType dtype, const std::string& stored) {
    e.dtype = dtype;
    e.shape = {stored.size() / DTypeSize(dtype)};
    c.region = FlatRange{0, e.shape[0]};
    c.block_size = 4;
    for (size_t b = 0; b < stored.size(); b += 4) {
      c.blocks.push_back(BlockRecord{4, format::Checksum(stored.substr(b, 4))});
    }
  }
};

TEST(VerifyBlock, ChecksumMismatchOfARawBlock) {
  std::string stored = "abcd";
  OneChunk t(DType::kUInt8, stored);
  auto raw = VerifyBlock(t.e, t.c, 0, stored, nullptr, nullptr);
  CKPT_ASSERT_OK(raw);
  EXPECT_EQ(*raw, stored.data());  // verified in place
  stored[0] = 'x';
  EXPECT_THAT(VerifyBlock(t.e, t.c, 0, stored, nullptr, nullptr),
              StatusIs(kDataLoss, "(stored != computed)"));
}

TEST(VerifyBlock, BoolByteOtherThanZeroOrOneIsDataLoss) {
  const std::string stored("\1\0\1\1\0\2\1\0", 8);
  OneChunk t(DType::kBool, stored);
  CKPT_EXPECT_OK(
      VerifyBlock(t.e, t.c, 0, stored.substr(0, 4), nullptr, nullptr));
  EXPECT_THAT(VerifyBlock(t.e, t.c, 1, stored.substr(4, 4), nullptr, nullptr),
              StatusIs(kDataLoss,
                       "bool element 5 of the chunk is 0x02, not 0x00 or 0x01 "
                       "(spec/FORMAT.md §9)"));
}

TEST(LocationText, MostSpecificFirst) {
  EXPECT_EQ(LocationText("f", "w", 1, "[4:8, 0:8]", 3),
            "f: block 3 of chunk 1 [4:8, 0:8] of 'w'");
  EXPECT_EQ(LocationText("f", "w", -1, "", -1), "f: entry 'w'");
  EXPECT_EQ(LocationText("f", "", -1, "", -1), "f");
  EXPECT_EQ(LocationText("", "a\x1b", -1, "", -1), "entry 'a\\x1b'");
}

}  // namespace
}  // namespace ckpt::internal

#include "ckpt/format/shard.h"

#include "absl/strings/str_cat.h"
#include "ckpt/format/block_codec.h"
#include "ckpt/format/checksum.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/section_coding.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::format {
namespace {

using ::ckpt::testing::StatusIs;
constexpr auto kDataLoss = absl::StatusCode::kDataLoss;
constexpr auto kPrecondition = absl::StatusCode::kFailedPrecondition;

ShardHeader SampleHeader() {
  ShardHeader h;
  for (int i = 0; i < 16; ++i) h.checkpoint_id[i] = static_cast<uint8_t>(i + 1);
  h.shard_id = 3;
  h.alignment = 4096;
  return h;
}

ShardIndex SampleIndex() {
  ShardIndex idx;
  idx.info.id = SampleHeader().checkpoint_id;
  idx.info.step = 7;
  idx.info.world_size = 4;
  idx.info.writer = "test";
  EntryRecord e;
  e.name = "w";
  e.dtype = DType::kFloat32;
  e.shape = {4096};
  ChunkRecord c;
  c.region = FlatRange{1024, 2048};  // 8192 bytes: two 4096-byte blocks
  c.shard = 3;
  c.data_offset = 4096;
  c.stored_length = 8192;
  c.block_size = 4096;
  c.blocks = {{4096, 0x1111}, {4096, 0x2222}};
  e.chunks = {c};
  idx.entries = {e};
  return idx;
}

// Tail describing `index` placed at `offset`.
ShardTail TailFor(const std::string& index, uint64_t offset) {
  return ShardTail{offset, index.size(), Checksum(index)};
}

TEST(ShardTest, HeaderRoundTrip) {
  std::string b = EncodeShardHeader(SampleHeader());
  ASSERT_EQ(b.size(), static_cast<size_t>(kShardHeaderSize));
  auto h = DecodeShardHeader(b);
  CKPT_ASSERT_OK(h);
  EXPECT_EQ(*h, SampleHeader());
}

TEST(ShardTest, HeaderTruncatedAtEveryByte) {
  std::string b = EncodeShardHeader(SampleHeader());
  for (size_t n = 0; n < b.size(); ++n) {
    EXPECT_THAT(DecodeShardHeader(b.substr(0, n)),
                StatusIs(kDataLoss, "shard header"));
  }
}

TEST(ShardTest, HeaderBadMagic) {
  std::string b = EncodeShardHeader(SampleHeader());
  b[0] = 'C';
  EXPECT_THAT(DecodeShardHeader(b),
              StatusIs(kDataLoss, "bad magic at offset 0"));
}

TEST(ShardTest, HeaderNewerMajorVersion) {
  std::string b = EncodeShardHeader(SampleHeader());
  StoreFixed16(b.data() + 8, 3);
  EXPECT_THAT(DecodeShardHeader(b),
              StatusIs(kPrecondition, "format version 3.0 is newer"));
}

TEST(ShardTest, HeaderChecksumMismatch) {
  std::string b = EncodeShardHeader(SampleHeader());
  b[33] ^= 1;  // shard id
  EXPECT_THAT(DecodeShardHeader(b),
              StatusIs(kDataLoss, "shard header: checksum"));
}

TEST(ShardTest, HeaderReservedBytesSet) {
  std::string b = EncodeShardHeader(SampleHeader());
  b[45] = 1;
  StoreFixed64(b.data() + 56, Checksum(b.data(), 56));
  EXPECT_THAT(DecodeShardHeader(b),
              StatusIs(kDataLoss, "reserved byte at offset 45"));
  b = EncodeShardHeader(SampleHeader());
  StoreFixed32(b.data() + 12, 4);
  StoreFixed64(b.data() + 56, Checksum(b.data(), 56));
  EXPECT_THAT(DecodeShardHeader(b),
              StatusIs(kDataLoss, "reserved field at offset 12"));
}

TEST(ShardTest, HeaderAlignmentNotPowerOfTwo) {
  ShardHeader h = SampleHeader();
  h.alignment = 3000;
  EXPECT_THAT(DecodeShardHeader(EncodeShardHeader(h)),
              StatusIs(kDataLoss, "alignment 3000 is not a power of two"));
}

TEST(ShardTest, TailRoundTrip) {
  ShardTail t{16384, 200, 0xabc};
  std::string b = EncodeShardTail(t);
  ASSERT_EQ(b.size(), static_cast<size_t>(kShardTailSize));
  auto d = DecodeShardTail(b, 16384 + 200 + kShardTailSize);
  CKPT_ASSERT_OK(d);
  EXPECT_EQ(*d, t);
}

TEST(ShardTest, TailBadMagicMeansTruncatedOrExtended) {
  std::string b = EncodeShardTail(ShardTail{16384, 200, 0});
  EXPECT_THAT(DecodeShardTail(b.substr(1) + "x", 16384 + 232),
              StatusIs(kDataLoss, "shard tail: bad magic"));
}

TEST(ShardTest, TailIndexNotEndingAtTail) {
  std::string b = EncodeShardTail(ShardTail{16384, 200, 0});
  EXPECT_THAT(DecodeShardTail(b, 16384 + 232 + 4096),
              StatusIs(kDataLoss, "does not end at the tail"));
  EXPECT_THAT(DecodeShardTail(EncodeShardTail(ShardTail{10, 86, 0}), 128),
              StatusIs(kDataLoss, "does not end at the tail"));
}

TEST(ShardTest, TailOfTinyFile) {
  EXPECT_THAT(DecodeShardTail("", 10), StatusIs(kDataLoss, "truncated"));
}

TEST(ShardTest, IndexRoundTrip) {
  std::string idx = EncodeShardIndex(SampleIndex());
  auto d = DecodeShardIndex(idx, SampleHeader(), TailFor(idx, 12288));
  CKPT_ASSERT_OK(d);
  EXPECT_EQ(*d, SampleIndex());
}

TEST(ShardTest, IndexTruncatedAtEveryByte) {
  std::string idx = EncodeShardIndex(SampleIndex());
  for (size_t n = 0; n < idx.size(); ++n) {
    std::string part = idx.substr(0, n);
    EXPECT_THAT(DecodeShardIndex(part, SampleHeader(), TailFor(part, 12288)),
                StatusIs(kDataLoss, "shard index"))
        << n;
  }
}

TEST(ShardTest, IndexChecksumMismatch) {
  std::string idx = EncodeShardIndex(SampleIndex());
  ShardTail t = TailFor(idx, 12288);
  idx[idx.size() - 3] ^= 0x40;
  EXPECT_THAT(DecodeShardIndex(idx, SampleHeader(), t),
              StatusIs(kDataLoss, "shard index: checksum"));
}

TEST(ShardTest, ShardFromAnotherCheckpoint) {
  std::string idx = EncodeShardIndex(SampleIndex());
  ShardHeader other = SampleHeader();
  other.checkpoint_id[0] ^= 0xff;
  EXPECT_THAT(DecodeShardIndex(idx, other, TailFor(idx, 12288)),
              StatusIs(kDataLoss, "checkpoint id 0102"));
}

TEST(ShardTest, ChunkOfAnotherShard) {
  ShardHeader h = SampleHeader();
  h.shard_id = 2;
  std::string idx = EncodeShardIndex(SampleIndex());
  EXPECT_THAT(
      DecodeShardIndex(idx, h, TailFor(idx, 12288)),
      StatusIs(kDataLoss, "entry 'w': chunk 0: shard id 3 != this file's 2"));
}

TEST(ShardTest, PayloadOverlapsIndex) {
  std::string idx = EncodeShardIndex(SampleIndex());
  EXPECT_THAT(DecodeShardIndex(idx, SampleHeader(), TailFor(idx, 8192)),
              StatusIs(kDataLoss, "lie outside the payload area [64, 8192)"));
}

TEST(ShardTest, MisalignedPayload) {
  ShardIndex s = SampleIndex();
  s.entries[0].chunks[0].data_offset = 4100;
  std::string idx = EncodeShardIndex(s);
  EXPECT_THAT(DecodeShardIndex(idx, SampleHeader(), TailFor(idx, 16384)),
              StatusIs(kDataLoss, "data offset 4100 is not aligned to 4096"));
}

TEST(ShardTest, WrongBlockCount) {
  ShardIndex s = SampleIndex();
  s.entries[0].chunks[0].blocks.pop_back();
  std::string idx = EncodeShardIndex(s);
  EXPECT_THAT(
      DecodeShardIndex(idx, SampleHeader(), TailFor(idx, 16384)),
      StatusIs(kDataLoss, "block count 1 != 2 expected for 8192 bytes"));
}

TEST(ShardTest, BlockSizesDoNotAddUp) {
  ShardIndex s = SampleIndex();
  auto& c = s.entries[0].chunks[0];
  c.codec = Codec::kZstd;
  c.stored_length = 5000;
  c.blocks = {{3000, 1}, {1000, 2}};
  std::string idx = EncodeShardIndex(s);
  EXPECT_THAT(DecodeShardIndex(idx, SampleHeader(), TailFor(idx, 16384)),
              StatusIs(kDataLoss,
                       "blocks add up to 4000 bytes, stored length is 5000"));
}

TEST(ShardTest, UncompressedBlockOfWrongSize) {
  ShardIndex s = SampleIndex();
  s.entries[0].chunks[0].blocks[0].stored_size = 4000;
  std::string idx = EncodeShardIndex(s);
  EXPECT_THAT(DecodeShardIndex(idx, SampleHeader(), TailFor(idx, 16384)),
              StatusIs(kDataLoss,
                       "block 0: stored size 4000 invalid for 4096 raw bytes"));
}

TEST(ShardTest, BlockSizeOutOfRange) {
  ShardIndex s = SampleIndex();
  s.entries[0].chunks[0].block_size = 100;
  std::string idx = EncodeShardIndex(s);
  EXPECT_THAT(DecodeShardIndex(idx, SampleHeader(), TailFor(idx, 16384)),
              StatusIs(kDataLoss, "block size 100 outside [4096, 1073741824]"));
}

TEST(ShardTest, HeaderNewerMajorVersionShorterThanV1Header) {
  // §2: the version is checked before the v1 size, so a newer file whose
  // header is shorter is Unsupported, not truncated.
  std::string b(kShardMagic, kMagicSize);
  PutFixed16(&b, 2);
  PutFixed16(&b, 0);
  EXPECT_THAT(DecodeShardHeader(b),
              StatusIs(kPrecondition, "format version 2.0 is newer"));
  b += std::string(20, 'x');
  EXPECT_THAT(DecodeShardHeader(b),
              StatusIs(kPrecondition, "format version 2.0 is newer"));
  EXPECT_THAT(
      DecodeShardHeader(b.substr(0, 11)),
      StatusIs(kDataLoss, "shard header: truncated: 11 bytes, 64 needed"));
}

TEST(ShardTest, HeaderShortV1HeaderIsTruncated) {
  std::string b = EncodeShardHeader(SampleHeader()).substr(0, 40);
  EXPECT_THAT(DecodeShardHeader(b),
              StatusIs(kDataLoss, "shard header: truncated: 40 bytes"));
}

TEST(ShardTest, ShardIdNotBelowWorldSize) {
  ShardIndex s = SampleIndex();
  s.info.world_size = 3;
  std::string idx = EncodeShardIndex(s);
  EXPECT_THAT(
      DecodeShardIndex(idx, SampleHeader(), TailFor(idx, 12288)),
      StatusIs(kDataLoss,
               "shard index: shard id 3 is not below the world size 3"));
}

// An index assembled section by section, so tests can edit one body or flag.
struct Section {
  uint32_t tag;
  bool required;
  std::string body;
};

std::vector<Section> SampleSections() {
  ShardIndex idx = SampleIndex();
  std::vector<Section> v;
  std::string body;
  internal::EncodeCheckpointInfo(idx.info, &body);
  v.push_back({kSectionCheckpointInfo, true, body});
  body.clear();
  internal::EncodeMetadata({{"run", "x"}}, &body);
  v.push_back({kSectionMetadata, false, body});
  body.clear();
  internal::EncodeEntries(idx.entries, /*with_blocks=*/true, &body);
  v.push_back({kSectionShardChunks, true, body});
  return v;
}

std::string Assemble(const std::vector<Section>& sections) {
  std::string out;
  PutFixed64(&out, 0);
  PutFixed64(&out, 0);
  for (const Section& s : sections)
    internal::PutSection(&out, s.tag, s.required, s.body);
  return out;
}

absl::StatusOr<ShardIndex> DecodeAssembled(
    const std::vector<Section>& sections) {
  std::string idx = Assemble(sections);
  return DecodeShardIndex(idx, SampleHeader(), TailFor(idx, 12288));
}

TEST(ShardTest, AssembledSampleMatchesEncoder) {
  ShardIndex s = SampleIndex();
  s.metadata = {{"run", "x"}};
  EXPECT_EQ(Assemble(SampleSections()), EncodeShardIndex(s));
}

TEST(ShardTest, IndexTrailingBytesAfterCheckpointInfoAreIgnored) {
  std::vector<Section> v = SampleSections();
  v[0].body += "new field";
  auto d = DecodeAssembled(v);
  CKPT_ASSERT_OK(d);
  EXPECT_EQ(d->info, SampleIndex().info);
}

TEST(ShardTest, IndexTrailingBytesAfterMetadata) {
  std::vector<Section> v = SampleSections();
  v[1].body += "z";
  EXPECT_THAT(
      DecodeAssembled(v),
      StatusIs(kDataLoss,
               "section 2: 1 trailing bytes after the last metadata pair"));
}

TEST(ShardTest, IndexTrailingBytesAfterShardChunks) {
  std::vector<Section> v = SampleSections();
  v[2].body += "abc";
  EXPECT_THAT(
      DecodeAssembled(v),
      StatusIs(kDataLoss,
               "shard index: section 5: 3 trailing bytes after the last "
               "entry"));
}

TEST(ShardTest, ManifestOnlySectionsInIndex) {
  // Tags 3, 4 and 6 are known to v1 but not allowed in an index: corrupt,
  // whatever their required flag, never skipped as unknown.
  for (uint32_t tag : {kSectionShards, kSectionEntries, kSectionPlan}) {
    for (bool required : {true, false}) {
      std::vector<Section> v = SampleSections();
      v.push_back({tag, required, "x"});
      EXPECT_THAT(
          DecodeAssembled(v),
          StatusIs(kDataLoss, absl::StrCat("section ", tag,
                                           " is not allowed in a shard index")))
          << tag << " " << required;
    }
  }
}

TEST(ShardTest, ShardChunksSectionMarkedOptional) {
  std::vector<Section> v = SampleSections();
  v[2].required = false;
  EXPECT_THAT(DecodeAssembled(v),
              StatusIs(kDataLoss, "section 5 (SHARD_CHUNKS) at offset"));
}

TEST(ShardTest, CheckpointInfoSectionMarkedOptional) {
  std::vector<Section> v = SampleSections();
  v[0].required = false;
  EXPECT_THAT(
      DecodeAssembled(v),
      StatusIs(kDataLoss,
               "section 1 (CHECKPOINT_INFO) at offset 12304 has required "
               "flag 0; v1 defines it as 1"));
}

TEST(ShardTest, IndexMetadataSectionMarkedRequired) {
  std::vector<Section> v = SampleSections();
  v[1].required = true;
  EXPECT_THAT(DecodeAssembled(v), StatusIs(kDataLoss, "section 2 (METADATA)"));
}

TEST(ShardTest, UnknownSectionsInIndex) {
  std::vector<Section> v = SampleSections();
  v.push_back({77, false, "later"});
  CKPT_EXPECT_OK(DecodeAssembled(v));
  v.back().required = true;
  EXPECT_THAT(DecodeAssembled(v),
              StatusIs(kPrecondition, "unknown required section 77"));
}

TEST(ShardTest, FileName) { EXPECT_EQ(ShardFileName(3), "shard-00003.ckpt"); }

}  // namespace
}  // namespace ckpt::format

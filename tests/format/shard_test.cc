#include "format/shard.h"

#include "format/block_codec.h"
#include "format/checksum.h"
#include "format/coding.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

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
    EXPECT_THAT(DecodeShardHeader(b.substr(0, n)), StatusIs(kDataLoss, "shard header"));
  }
}

TEST(ShardTest, HeaderBadMagic) {
  std::string b = EncodeShardHeader(SampleHeader());
  b[0] = 'C';
  EXPECT_THAT(DecodeShardHeader(b), StatusIs(kDataLoss, "bad magic at offset 0"));
}

TEST(ShardTest, HeaderNewerMajorVersion) {
  std::string b = EncodeShardHeader(SampleHeader());
  StoreFixed16(b.data() + 8, 3);
  EXPECT_THAT(DecodeShardHeader(b), StatusIs(kPrecondition, "format version 3.0 is newer"));
}

TEST(ShardTest, HeaderChecksumMismatch) {
  std::string b = EncodeShardHeader(SampleHeader());
  b[33] ^= 1;  // shard id
  EXPECT_THAT(DecodeShardHeader(b), StatusIs(kDataLoss, "shard header: checksum"));
}

TEST(ShardTest, HeaderReservedBytesSet) {
  std::string b = EncodeShardHeader(SampleHeader());
  b[45] = 1;
  StoreFixed64(b.data() + 56, Checksum(b.data(), 56));
  EXPECT_THAT(DecodeShardHeader(b), StatusIs(kDataLoss, "reserved byte at offset 45"));
  b = EncodeShardHeader(SampleHeader());
  StoreFixed32(b.data() + 12, 4);
  StoreFixed64(b.data() + 56, Checksum(b.data(), 56));
  EXPECT_THAT(DecodeShardHeader(b), StatusIs(kDataLoss, "reserved field at offset 12"));
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
                StatusIs(kDataLoss, "shard index")) << n;
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
  EXPECT_THAT(DecodeShardIndex(idx, h, TailFor(idx, 12288)),
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
  EXPECT_THAT(DecodeShardIndex(idx, SampleHeader(), TailFor(idx, 16384)),
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
              StatusIs(kDataLoss, "blocks add up to 4000 bytes, stored length is 5000"));
}

TEST(ShardTest, UncompressedBlockOfWrongSize) {
  ShardIndex s = SampleIndex();
  s.entries[0].chunks[0].blocks[0].stored_size = 4000;
  std::string idx = EncodeShardIndex(s);
  EXPECT_THAT(DecodeShardIndex(idx, SampleHeader(), TailFor(idx, 16384)),
              StatusIs(kDataLoss, "block 0: stored size 4000 invalid for 4096 raw bytes"));
}

TEST(ShardTest, BlockSizeOutOfRange) {
  ShardIndex s = SampleIndex();
  s.entries[0].chunks[0].block_size = 100;
  std::string idx = EncodeShardIndex(s);
  EXPECT_THAT(DecodeShardIndex(idx, SampleHeader(), TailFor(idx, 16384)),
              StatusIs(kDataLoss, "block size 100 outside [4096, 1073741824]"));
}

TEST(ShardTest, FileName) { EXPECT_EQ(ShardFileName(3), "shard-00003.ckpt"); }

}  // namespace
}  // namespace ckpt::format

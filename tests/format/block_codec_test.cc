#include "ckpt/format/block_codec.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "ckpt/format/checksum.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::format {
namespace {

using ::ckpt::testing::StatusIs;

std::string Compressible(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i % 7);
  return s;
}
std::string Random(size_t n) {
  std::mt19937_64 rng(1);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

TEST(BlockCodecTest, ZstdRoundTrip) {
  BlockEncoder enc(3);
  BlockDecoder dec;
  std::string raw = Compressible(10000), stored;
  CKPT_ASSERT_OK(enc.EncodeZstd(raw, &stored));
  EXPECT_LT(stored.size(), raw.size());
  std::string out(raw.size(), '\0');
  CKPT_ASSERT_OK(dec.Decode(Codec::kZstd, stored, Checksum(stored), raw.size(),
                            out.data()));
  EXPECT_EQ(out, raw);
}

TEST(BlockCodecTest, IncompressibleBlockIsStoredRaw) {
  BlockEncoder enc(3);
  std::string raw = Random(4096), stored;
  CKPT_ASSERT_OK(enc.EncodeZstd(raw, &stored));
  EXPECT_EQ(stored, raw);
  BlockDecoder dec;
  std::string out(raw.size(), '\0');
  CKPT_ASSERT_OK(dec.Decode(Codec::kZstd, stored, Checksum(stored), raw.size(),
                            out.data()));
  EXPECT_EQ(out, raw);
}

TEST(BlockCodecTest, ChecksumMismatchInOneBlock) {
  std::string raw = Random(4096);
  uint64_t sum = Checksum(raw);
  raw[100] ^= 0x10;
  BlockDecoder dec;
  std::string out(raw.size(), '\0');
  EXPECT_THAT(dec.Decode(Codec::kNone, raw, sum, raw.size(), out.data()),
              StatusIs(absl::StatusCode::kDataLoss, "checksum 0x"));
}

TEST(BlockCodecTest, GarbageZstdFrameWithValidChecksum) {
  // A writer bug or a malicious file: the checksum matches, the frame does
  // not decode. Must be DataLoss, never a crash or a short block.
  BlockEncoder enc(3);
  std::string raw = Compressible(10000), stored;
  CKPT_ASSERT_OK(enc.EncodeZstd(raw, &stored));
  for (size_t i = 6; i < stored.size(); ++i)
    stored[i] = static_cast<char>(0xA5 ^ i);
  BlockDecoder dec;
  std::string out(raw.size(), '\0');
  EXPECT_THAT(dec.Decode(Codec::kZstd, stored, Checksum(stored), raw.size(),
                         out.data()),
              StatusIs(absl::StatusCode::kDataLoss, "zstd"));
}

TEST(BlockCodecTest, FrameOfWrongContentSize) {
  BlockEncoder enc(3);
  std::string raw = Compressible(10000), stored;
  CKPT_ASSERT_OK(enc.EncodeZstd(raw, &stored));
  BlockDecoder dec;
  std::string out(20000, '\0');
  EXPECT_THAT(
      dec.Decode(Codec::kZstd, stored, Checksum(stored), 20000, out.data()),
      StatusIs(absl::StatusCode::kDataLoss,
               "zstd frame declares 10000 bytes, expected 20000"));
}

TEST(BlockCodecTest, UncompressedBlockOfWrongSize) {
  std::string raw = Random(100);
  BlockDecoder dec;
  std::string out(200, '\0');
  EXPECT_THAT(
      dec.Decode(Codec::kNone, raw, Checksum(raw), 200, out.data()),
      StatusIs(absl::StatusCode::kDataLoss, "expected 200 for codec none"));
}

// §5.3: a compressed block is exactly one zstd frame. Anything after it
// (garbage, a second frame, a skippable frame) is corrupt even when the
// checksum, which covers the stored bytes, matches.
TEST(BlockCodecTest, ZstdBlockWithTrailingGarbage) {
  BlockEncoder enc(3);
  std::string raw = Compressible(10000), stored;
  CKPT_ASSERT_OK(enc.EncodeZstd(raw, &stored));
  stored += "xyz";
  BlockDecoder dec;
  std::string out(raw.size(), '\0');
  EXPECT_THAT(dec.Decode(Codec::kZstd, stored, Checksum(stored), raw.size(),
                         out.data()),
              StatusIs(absl::StatusCode::kDataLoss,
                       "zstd block has 3 trailing bytes after its frame"));
}

TEST(BlockCodecTest, TwoZstdFramesInOneBlock) {
  BlockEncoder enc(3);
  std::string raw = Compressible(10000), frame;
  CKPT_ASSERT_OK(enc.EncodeZstd(raw, &frame));
  std::string stored = frame + frame;
  ASSERT_LT(stored.size(), raw.size());
  BlockDecoder dec;
  std::string out(raw.size(), '\0');
  EXPECT_THAT(dec.Decode(Codec::kZstd, stored, Checksum(stored), raw.size(),
                         out.data()),
              StatusIs(absl::StatusCode::kDataLoss,
                       absl::StrCat("zstd block has ", frame.size(),
                                    " trailing bytes after its frame")));
}

TEST(BlockCodecTest, SkippableFrameAfterZstdFrame) {
  BlockEncoder enc(3);
  std::string raw = Compressible(10000), stored;
  CKPT_ASSERT_OK(enc.EncodeZstd(raw, &stored));
  // Skippable frame: magic 0x184D2A50, u32le payload size, payload.
  const char skippable[] = {'\x50', '\x2a', '\x4d', '\x18', 4,   0,
                            0,      0,      'a',    'b',    'c', 'd'};
  stored.append(skippable, sizeof(skippable));
  BlockDecoder dec;
  std::string out(raw.size(), '\0');
  EXPECT_THAT(dec.Decode(Codec::kZstd, stored, Checksum(stored), raw.size(),
                         out.data()),
              StatusIs(absl::StatusCode::kDataLoss,
                       "zstd block has 12 trailing bytes after its frame"));
}

TEST(BlockCodecTest, NumBlocks) {
  EXPECT_EQ(NumBlocks(0, 4096), 0u);
  EXPECT_EQ(NumBlocks(1, 4096), 1u);
  EXPECT_EQ(NumBlocks(4096, 4096), 1u);
  EXPECT_EQ(NumBlocks(4097, 4096), 2u);
}

}  // namespace
}  // namespace ckpt::format

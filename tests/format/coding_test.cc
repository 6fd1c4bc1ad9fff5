#include "ckpt/format/coding.h"

#include <limits>

#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::format {
namespace {

using ::ckpt::testing::StatusIs;

TEST(CodingTest, FixedRoundTrip) {
  std::string s;
  PutFixed8(&s, 0xab);
  PutFixed16(&s, 0x1234);
  PutFixed32(&s, 0xdeadbeef);
  PutFixed64(&s, 0x0102030405060708ull);
  ASSERT_EQ(s.size(), 15u);
  EXPECT_EQ(static_cast<unsigned char>(s[1]), 0x34);  // little-endian
  ByteReader r(s);
  EXPECT_EQ(*r.Read8("a"), 0xab);
  EXPECT_EQ(*r.Read16("b"), 0x1234);
  EXPECT_EQ(*r.Read32("c"), 0xdeadbeefu);
  EXPECT_EQ(*r.Read64("d"), 0x0102030405060708ull);
  EXPECT_TRUE(r.empty());
}

TEST(CodingTest, VarintRoundTrip) {
  const uint64_t values[] = {
      0, 1, 127, 128, 300, 1ull << 32, std::numeric_limits<uint64_t>::max()};
  std::string s;
  for (uint64_t v : values) PutVarint(&s, v);
  ByteReader r(s);
  for (uint64_t v : values) EXPECT_EQ(*r.ReadVarint("v"), v);
  EXPECT_TRUE(r.empty());
}

TEST(CodingTest, TruncatedFixedNamesFieldAndOffset) {
  std::string s = "abc";
  ByteReader r(s, 100);
  EXPECT_THAT(r.Read32("index offset"),
              StatusIs(absl::StatusCode::kDataLoss,
                       "index offset: truncated at offset 100"));
}

TEST(CodingTest, TruncatedVarint) {
  std::string s = "\x80\x80";
  ByteReader r(s);
  EXPECT_THAT(r.ReadVarint("dim"),
              StatusIs(absl::StatusCode::kDataLoss, "dim: truncated"));
}

TEST(CodingTest, OverlongVarint) {
  std::string s(11, '\x80');
  ByteReader r(s);
  EXPECT_THAT(r.ReadVarint("dim"),
              StatusIs(absl::StatusCode::kDataLoss, "dim"));
}

TEST(CodingTest, VarintOverflowing64Bits) {
  std::string s(9, '\xff');
  s.push_back('\x02');
  ByteReader r(s);
  EXPECT_THAT(r.ReadVarint("step"),
              StatusIs(absl::StatusCode::kDataLoss, "overflows 64 bits"));
}

TEST(CodingTest, VarintAboveLimit) {
  std::string s;
  PutVarint(&s, 33);
  ByteReader r(s);
  EXPECT_THAT(r.ReadVarintAtMost("ndim", 32),
              StatusIs(absl::StatusCode::kDataLoss,
                       "value 33 at offset 0 exceeds the limit 32"));
}

TEST(CodingTest, StringLongerThanInput) {
  std::string s;
  PutVarint(&s, 1000);
  s += "short";
  ByteReader r(s);
  EXPECT_THAT(r.ReadString("name", 2000),
              StatusIs(absl::StatusCode::kDataLoss, "name: truncated"));
}

}  // namespace
}  // namespace ckpt::format

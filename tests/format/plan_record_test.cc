// PLAN section body (spec/FORMAT.md §7.4): round trip, exact bytes, and one
// test per corruption.
#include "ckpt/format/plan_record.h"

#include "ckpt/format/coding.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::format {
namespace {

using ::ckpt::testing::StatusIs;

PlanRecord Sample() {
  PlanRecord p;
  p.ranks.resize(3);
  for (int r = 0; r < 3; ++r)
    p.ranks[r].fingerprint.fill(static_cast<uint8_t>(0xa0 + r));
  p.ranks[0].writes = {0, 1, 5, 300};
  p.ranks[2].writes = {7};
  return p;
}

TEST(PlanRecordTest, RoundTrip) {
  PlanRecord p = Sample();
  auto back = DecodePlanRecord(EncodePlanRecord(p));
  CKPT_ASSERT_OK(back.status());
  EXPECT_EQ(*back, p);
}

TEST(PlanRecordTest, ExactBytesDeltaCoded) {
  PlanRecord p;
  p.ranks.resize(1);
  p.ranks[0].writes = {2, 3, 10};
  std::string want =
      "\x01\x01" + std::string(16, 0) + std::string("\x03\x02\x00\x06", 4);
  EXPECT_EQ(EncodePlanRecord(p), want);
}

TEST(PlanRecordTest, TruncatedAtEveryByteIsDataLoss) {
  std::string b = EncodePlanRecord(Sample());
  for (size_t n = 0; n < b.size(); ++n) {
    EXPECT_THAT(DecodePlanRecord(b.substr(0, n)),
                StatusIs(absl::StatusCode::kDataLoss, ""))
        << n;
  }
}

TEST(PlanRecordTest, TrailingBytesAreDataLoss) {
  EXPECT_THAT(DecodePlanRecord(EncodePlanRecord(Sample()) + "x"),
              StatusIs(absl::StatusCode::kDataLoss, "trailing"));
}

TEST(PlanRecordTest, UnknownVersionIsDataLoss) {
  std::string b = EncodePlanRecord(Sample());
  b[0] = 2;
  EXPECT_THAT(DecodePlanRecord(b),
              StatusIs(absl::StatusCode::kDataLoss, "version 2"));
}

TEST(PlanRecordTest, ZeroWorldIsDataLoss) {
  EXPECT_THAT(DecodePlanRecord(std::string("\x01\x00", 2)),
              StatusIs(absl::StatusCode::kDataLoss, "world_size 0"));
}

TEST(PlanRecordTest, HugeWorldDoesNotAllocate) {
  std::string b = "\x01";
  PutVarint(&b, kMaxShards);
  EXPECT_THAT(DecodePlanRecord(b),
              StatusIs(absl::StatusCode::kDataLoss, "world_size"));
  std::string c = "\x01";
  PutVarint(&c, kMaxShards + 1);
  EXPECT_THAT(DecodePlanRecord(c),
              StatusIs(absl::StatusCode::kDataLoss, "world_size"));
}

TEST(PlanRecordTest, HugeWriteCountDoesNotAllocate) {
  std::string b = "\x01\x01" + std::string(16, '\0');
  PutVarint(&b, 1ull << 40);
  EXPECT_THAT(DecodePlanRecord(b),
              StatusIs(absl::StatusCode::kDataLoss, "write count"));
}

TEST(PlanRecordTest, PositionBeyond32BitsIsDataLoss) {
  std::string b = "\x01\x01" + std::string(16, '\0') + "\x02";
  PutVarint(&b, UINT32_MAX);
  PutVarint(&b, 5);  // UINT32_MAX + 6
  EXPECT_THAT(DecodePlanRecord(b),
              StatusIs(absl::StatusCode::kDataLoss, "exceeds"));
}

}  // namespace
}  // namespace ckpt::format

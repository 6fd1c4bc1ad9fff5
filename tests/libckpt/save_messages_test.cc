// The messages ranks exchange during a save (libckpt/save/save_messages.h): a
// round trip of each, and one test per way a message can be malformed.
#include "save/save_messages.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "util/rank_status.h"

namespace ckpt::internal {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::StatusIs;

format::EntryRecord SampleEntry() {
  format::EntryRecord e;
  e.name = "layers.0.w";
  e.dtype = DType::kBFloat16;
  e.shape = {8, 4};
  format::ChunkRecord c;
  c.region = Box{{4, 0}, {4, 4}};
  c.shard = 1;
  c.codec = format::Codec::kNone;
  c.block_size = 4096;
  c.data_offset = 4096;
  c.stored_length = 32;
  e.chunks.push_back(c);
  return e;
}

TEST(SaveMessagesTest, StatusOrRoundTripsPayloadAndError) {
  auto ok = DecodeStatusOr(EncodeStatusOr(std::string("payload\0bytes", 13)));
  ASSERT_THAT(ok, IsOk());
  EXPECT_EQ(*ok, std::string("payload\0bytes", 13));
  auto err = DecodeStatusOr(
      EncodeStatusOr(absl::DataLossError("shard-00001.ckpt: bad")));
  EXPECT_THAT(err,
              StatusIs(absl::StatusCode::kDataLoss, "shard-00001.ckpt: bad"));
}

TEST(SaveMessagesTest, EmptyStatusOrIsInternal) {
  EXPECT_THAT(DecodeStatusOr(""), StatusIs(absl::StatusCode::kInternal,
                                           "empty message from another rank"));
}

TEST(SaveMessagesTest, RankPlanRoundTrips) {
  RankPlan plan;
  for (int i = 0; i < 16; ++i)
    plan.fingerprint[i] = static_cast<uint8_t>(i * 7);
  LocalItem t;
  t.name = "w";
  t.dtype = DType::kFloat32;
  t.shape = {10, 3};
  t.region = Box{{2, 0}, {5, 3}};
  t.replica = true;
  LocalItem o;
  o.name = "rng";
  o.kind = format::EntryKind::kObject;
  o.dtype = DType::kUInt8;
  o.shape = {96};
  o.region = FlatRange{0, 96};
  plan.plan = {t, o};
  auto got = DecodeRankPlan(EncodeRankPlan(plan));
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->fingerprint, plan.fingerprint);
  ASSERT_EQ(got->plan.size(), 2u);
  EXPECT_EQ(got->plan[0].name, "w");
  EXPECT_EQ(got->plan[0].shape, t.shape);
  EXPECT_TRUE(got->plan[0].replica);
  EXPECT_EQ(std::get<Box>(got->plan[0].region).offset,
            std::get<Box>(t.region).offset);
  EXPECT_EQ(got->plan[1].kind, format::EntryKind::kObject);
  EXPECT_EQ(std::get<FlatRange>(got->plan[1].region).length, 96u);
}

TEST(SaveMessagesTest, RankPlanShorterThanItsFingerprintIsInternal) {
  EXPECT_THAT(DecodeRankPlan(std::string(15, '\0')),
              StatusIs(absl::StatusCode::kInternal,
                       "malformed local plan from another rank"));
}

TEST(SaveMessagesTest, RankPlanWithTruncatedItemsIsInternal) {
  RankPlan plan;
  LocalItem t;
  t.name = "w";
  t.shape = {4};
  t.region = FullBox({4});
  plan.plan = {t};
  std::string bytes = EncodeRankPlan(plan);
  bytes.resize(bytes.size() - 1);
  EXPECT_THAT(DecodeRankPlan(bytes),
              StatusIs(absl::StatusCode::kInternal,
                       "malformed local plan from another rank"));
}

TEST(SaveMessagesTest, CoordinatorPlanRoundTrips) {
  for (bool reused : {false, true}) {
    auto got = DecodeCoordinatorPlan(
        EncodeCoordinatorPlan(CoordinatorPlan{std::string("p\0q", 3), reused}));
    ASSERT_THAT(got, IsOk());
    EXPECT_EQ(got->body, std::string("p\0q", 3));
    EXPECT_EQ(got->reused, reused);
  }
}

TEST(SaveMessagesTest, MalformedCoordinatorPlanIsInternal) {
  EXPECT_THAT(DecodeCoordinatorPlan(""),
              StatusIs(absl::StatusCode::kInternal, "malformed plan"));
  EXPECT_THAT(DecodeCoordinatorPlan("\x02plan"),
              StatusIs(absl::StatusCode::kInternal, "reused flag 2"));
}

TEST(SaveMessagesTest, SavePrepRoundTrips) {
  SavePrep prep;
  for (int i = 0; i < 16; ++i) {
    prep.id[i] = static_cast<uint8_t>(i);
    prep.fingerprint[i] = static_cast<uint8_t>(255 - i);
  }
  prep.created_unix_ns = 1795219200000000000;
  prep.tmp_dir = "/ck/.tmp-step-00000007-0123456789abcdef";
  auto got = DecodeSavePrep(EncodeSavePrep(prep));
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->id, prep.id);
  EXPECT_EQ(got->fingerprint, prep.fingerprint);
  EXPECT_EQ(got->created_unix_ns, prep.created_unix_ns);
  EXPECT_EQ(got->tmp_dir, prep.tmp_dir);
}

TEST(SaveMessagesTest, TruncatedSavePrepIsInternal) {
  SavePrep prep;
  prep.tmp_dir = "/ck/.tmp-x";
  std::string bytes = EncodeSavePrep(prep);
  for (size_t n : {size_t{0}, size_t{16}, size_t{39}, bytes.size() - 1}) {
    EXPECT_THAT(
        DecodeSavePrep(bytes.substr(0, n)),
        StatusIs(absl::StatusCode::kInternal, "malformed save preparation"))
        << n << " bytes";
  }
}

TEST(SaveMessagesTest, SavePrepWithTrailingBytesIsInternal) {
  EXPECT_THAT(DecodeSavePrep(EncodeSavePrep(SavePrep{}) + "x"),
              StatusIs(absl::StatusCode::kInternal, "1 trailing bytes"));
}

TEST(SaveMessagesTest, ShardReportRoundTrips) {
  ShardReport report;
  report.file_size = 123456;
  report.entries = {SampleEntry()};
  auto got = DecodeShardReport(EncodeShardReport(report));
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->file_size, 123456u);
  ASSERT_EQ(got->entries.size(), 1u);
  EXPECT_EQ(got->entries[0], report.entries[0]);
}

TEST(SaveMessagesTest, TruncatedShardReportIsInternal) {
  ShardReport report;
  report.file_size = 1 << 20;
  report.entries = {SampleEntry()};
  const std::string bytes = EncodeShardReport(report);
  EXPECT_THAT(DecodeShardReport(""),
              StatusIs(absl::StatusCode::kInternal, "malformed shard report"));
  EXPECT_THAT(DecodeShardReport(bytes.substr(0, bytes.size() - 3)),
              StatusIs(absl::StatusCode::kInternal, "malformed shard report"));
}

TEST(SaveMessagesTest, CommitSummaryRoundTrips) {
  auto got = DecodeCommitSummary(EncodeCommitSummary({uint64_t{1} << 40, 77}));
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->stored_bytes, uint64_t{1} << 40);
  EXPECT_EQ(got->logical_bytes, 77u);
}

TEST(SaveMessagesTest, TruncatedCommitSummaryIsInternal) {
  std::string bytes = EncodeCommitSummary({300, 300});
  EXPECT_THAT(
      DecodeCommitSummary(bytes.substr(0, 3)),
      StatusIs(absl::StatusCode::kInternal, "malformed commit summary"));
}

TEST(SaveMessagesTest, CommitSummaryWithTrailingBytesIsInternal) {
  EXPECT_THAT(DecodeCommitSummary(EncodeCommitSummary({1, 2}) + "zz"),
              StatusIs(absl::StatusCode::kInternal, "2 trailing bytes"));
}

}  // namespace
}  // namespace ckpt::internal

// The save planner (libckpt/save/save_plan.h) as a pure function: which rank
// writes which chunk, and one named test per way the ranks' registrations
// can disagree.
#include "save/save_plan.h"

#include <string>
#include <vector>

#include "ckpt/format/plan_record.h"
#include "gtest/gtest.h"
#include "save/save_messages.h"
#include "testing/status_matchers.h"

namespace ckpt::internal {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

LocalItem Tensor(const std::string& name, Shape shape, Region region,
                 bool replica = false) {
  LocalItem it;
  it.name = name;
  it.dtype = DType::kFloat32;
  it.shape = std::move(shape);
  it.region = std::move(region);
  it.replica = replica;
  return it;
}

LocalItem Object(const std::string& name, uint64_t size) {
  LocalItem it;
  it.name = name;
  it.kind = format::EntryKind::kObject;
  it.dtype = DType::kUInt8;
  it.shape = {size};
  it.region = FlatRange{0, size};
  return it;
}

TEST(SavePlanTest, ShardedTensorIsWrittenByEveryHolder) {
  auto plan = PlanSave({{Tensor("w", {4, 2}, Box{{0, 0}, {2, 2}})},
                        {Tensor("w", {4, 2}, Box{{2, 0}, {2, 2}})}});
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->writes, ElementsAre(ElementsAre(0u), ElementsAre(0u)));
  EXPECT_EQ(plan->unique_bytes, 32u);
}

TEST(SavePlanTest, ReplicasAreWrittenOnceAndBalancedLargestFirst) {
  // Two replicated tensors on both ranks, and a 40-byte shard fixed on rank
  // 0: the larger replica goes to rank 1 (less loaded), the smaller one
  // then to rank 1 too (32 < 40 + 0).
  const Shape big = {8}, small = {2};
  auto plan = PlanSave({{Tensor("a", big, FullBox(big), true),
                         Tensor("b", small, FullBox(small), true),
                         Tensor("c", {10}, FullBox({10}))},
                        {Tensor("a", big, FullBox(big), true),
                         Tensor("b", small, FullBox(small), true)}});
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->writes[0], ElementsAre(2u));
  EXPECT_THAT(plan->writes[1], ElementsAre(0u, 1u));
  EXPECT_EQ(plan->unique_bytes, 4u * (8 + 2 + 10));
}

TEST(SavePlanTest, OneNonReplicaAmongReplicasIsAllowed) {
  const Shape s = {4};
  auto plan = PlanSave(
      {{Tensor("w", s, FullBox(s))}, {Tensor("w", s, FullBox(s), true)}});
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->writes[0].size() + plan->writes[1].size(), 1u);
}

TEST(SavePlanTest, EmptyPiecesAreNotWritten) {
  auto plan = PlanSave({{Tensor("w", {4}, FlatRange{0, 4})},
                        {Tensor("w", {4}, FlatRange{4, 0})}});
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->writes[0], ElementsAre(0u));
  EXPECT_THAT(plan->writes[1], IsEmpty());
}

TEST(SavePlanTest, AllEmptyTensorKeepsTheLowestRanksPiece) {
  auto plan = PlanSave({{Tensor("w", {0}, FlatRange{0, 0})},
                        {Tensor("w", {0}, FlatRange{0, 0})}});
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->writes[0], ElementsAre(0u));
  EXPECT_THAT(plan->writes[1], IsEmpty());
}

TEST(SavePlanTest, ObjectIsWrittenByItsHolder) {
  auto plan = PlanSave({{}, {Object("rng", 96)}});
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->writes[1], ElementsAre(0u));
  EXPECT_EQ(plan->unique_bytes, 96u);
}

TEST(SavePlanTest, KindMismatchNamesEntryAndRanks) {
  EXPECT_THAT(PlanSave({{Tensor("x", {1}, FullBox({1}))}, {Object("x", 1)}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "entry 'x': kind differs between ranks: rank 0 has "
                       "tensor, rank 1 has "
                       "object"));
}

TEST(SavePlanTest, DtypeMismatchNamesEntryAndRanks) {
  LocalItem b = Tensor("w", {4}, FlatRange{2, 2});
  b.dtype = DType::kBFloat16;
  EXPECT_THAT(
      PlanSave({{Tensor("w", {4}, FlatRange{0, 2})}, {b}}),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          "entry 'w': dtype differs between ranks: rank 0 has float32, rank 1 "
          "has bfloat16"));
}

TEST(SavePlanTest, GlobalShapeMismatchNamesEntryAndRanks) {
  EXPECT_THAT(PlanSave({{Tensor("w", {4}, FlatRange{0, 2})},
                        {Tensor("w", {6}, FlatRange{2, 4})}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "entry 'w': global shape differs between ranks"));
}

TEST(SavePlanTest, PartialFlagMismatchNamesEntryAndRanks) {
  LocalItem b = Tensor("w", {4}, FlatRange{2, 2});
  b.partial = true;
  EXPECT_THAT(
      PlanSave({{Tensor("w", {4}, FlatRange{0, 2})}, {b}}),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          "entry 'w': partial flag differs between ranks: rank 0 has false, "
          "rank 1 has true"));
}

TEST(SavePlanTest, ObjectOnTwoRanksIsRejected) {
  EXPECT_THAT(PlanSave({{Object("rng", 8)}, {Object("rng", 8)}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "object 'rng' is registered on ranks 0, 1"));
}

TEST(SavePlanTest, SameRegionOnTwoNonReplicasIsRejected) {
  const Shape s = {4};
  EXPECT_THAT(
      PlanSave({{Tensor("w", s, FullBox(s))}, {Tensor("w", s, FullBox(s))}}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "entry 'w': ranks 0, 1 all hold"));
}

TEST(SavePlanTest, OverlappingChunksAreRejected) {
  EXPECT_THAT(PlanSave({{Tensor("w", {4}, FlatRange{0, 3})},
                        {Tensor("w", {4}, FlatRange{2, 2})}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "on rank 1"));
}

TEST(SavePlanTest, GapNamesEntryAndTheRankOfEachChunk) {
  auto plan = PlanSave({{Tensor("w", {4}, FlatRange{0, 1})},
                        {Tensor("w", {4}, FlatRange{2, 2})}});
  EXPECT_THAT(plan, StatusIs(absl::StatusCode::kInvalidArgument,
                             "entry 'w': elements not covered by any chunk"));
  EXPECT_THAT(plan, StatusIs(absl::StatusCode::kInvalidArgument,
                             "flat[0:1) on rank 0"));
  EXPECT_THAT(plan, StatusIs(absl::StatusCode::kInvalidArgument,
                             "flat[2:4) on rank 1"));
}

TEST(SavePlanTest, GapIsAllowedForPartialTensors) {
  LocalItem a = Tensor("w", {4}, FlatRange{0, 1});
  a.partial = true;
  auto plan = PlanSave({{a}});
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->unique_bytes, 4u);
}

TEST(SavePlanTest, PlanDoesNotDependOnRegistrationOrder) {
  std::vector<LocalPlan> a = {{Tensor("x", {2}, FullBox({2}), true),
                               Tensor("y", {4}, FullBox({4}), true)},
                              {Tensor("x", {2}, FullBox({2}), true),
                               Tensor("y", {4}, FullBox({4}), true)}};
  std::vector<LocalPlan> b = a;
  std::swap(b[0][0], b[0][1]);
  std::swap(b[1][0], b[1][1]);
  auto pa = PlanSave(a), pb = PlanSave(b);
  ASSERT_THAT(pa, IsOk());
  ASSERT_THAT(pb, IsOk());
  // The same entries go to the same ranks (indices follow each order).
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> na, nb;
    for (uint32_t i : pa->writes[r]) na.push_back(a[r][i].name);
    for (uint32_t i : pb->writes[r]) nb.push_back(b[r][i].name);
    std::sort(na.begin(), na.end());
    std::sort(nb.begin(), nb.end());
    EXPECT_EQ(na, nb) << "rank " << r;
  }
}

TEST(SavePlanTest, LocalPlanRoundTrips) {
  LocalItem p = Tensor("w", {3, 5}, Box{{1, 0}, {2, 5}}, true);
  p.partial = true;
  LocalPlan plan = {p, Object("o", 7), Tensor("f", {100}, FlatRange{10, 20})};
  auto got = DecodeLocalPlan(EncodeLocalPlan(plan));
  ASSERT_THAT(got, IsOk());
  ASSERT_EQ(got->size(), 3u);
  for (size_t i = 0; i < plan.size(); ++i) {
    EXPECT_EQ(ItemFingerprint((*got)[i]), ItemFingerprint(plan[i])) << i;
    EXPECT_EQ((*got)[i].shape, plan[i].shape) << i;
  }
}

TEST(SavePlanTest, TruncatedLocalPlanIsDataLoss) {
  std::string bytes = EncodeLocalPlan({Tensor("w", {4}, FullBox({4}))});
  EXPECT_THAT(DecodeLocalPlan(bytes.substr(0, bytes.size() - 1)),
              StatusIs(absl::StatusCode::kDataLoss, ""));
}

TEST(SavePlanTest, FingerprintIgnoresObjectSizeButNotTensorGeometry) {
  EXPECT_EQ(ItemFingerprint(Object("o", 8)), ItemFingerprint(Object("o", 9)));
  EXPECT_NE(ItemFingerprint(Tensor("w", {4}, FlatRange{0, 2})),
            ItemFingerprint(Tensor("w", {4}, FlatRange{0, 3})));
  EXPECT_NE(ItemFingerprint(Tensor("w", {4}, FullBox({4}))),
            ItemFingerprint(Tensor("w", {4}, FullBox({4}), true)));
}

TEST(SavePlanTest, CombinedFingerprintDependsOnOrderAndCount) {
  const std::vector<format::Fingerprint> fps = {
      ItemFingerprint(Object("a", 1)), ItemFingerprint(Object("b", 1))};
  auto combine = [](const std::vector<format::Fingerprint>& v) {
    return CombineFingerprints(
        v.size(), [&](size_t i) -> const format::Fingerprint& { return v[i]; });
  };
  EXPECT_NE(combine(fps), combine({fps[1], fps[0]}));
  EXPECT_NE(combine(fps), combine({fps[0]}));
  EXPECT_EQ(combine(fps), combine(fps));
}

// Tensor parallel 2 x data parallel 4: every distinct piece is written once,
// and the 8 replicated pieces spread one per rank.
TEST(SavePlanTest, ReplicatedTensorParallelPiecesAreWrittenOncePerRank) {
  std::vector<LocalPlan> ranks(8);
  for (uint64_t r = 0; r < 8; ++r) {
    const uint64_t tp = r % 2;
    ranks[r] = {Tensor("a", {4, 2}, Box{{2 * tp, 0}, {2, 2}}, true),
                Tensor("b", {4, 2}, Box{{0, tp}, {4, 1}}, true),
                Tensor("c", {4, 4}, Box{{2 * tp, 0}, {2, 4}}, true),
                Tensor("d", {8}, FlatRange{4 * tp, 4}, true)};
  }
  auto plan = PlanSave(ranks);
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->unique_bytes, (8 + 8 + 16 + 8) * 4u);
  std::vector<int> writes_of_piece(8, 0);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(plan->writes[r].size(), 1u) << "rank " << r;
    for (uint32_t i : plan->writes[r]) ++writes_of_piece[2 * i + r % 2];
  }
  EXPECT_THAT(writes_of_piece, ::testing::Each(1));
}

TEST(SavePlanTest, CoordinatorRecordsEveryRanksFingerprintAndWrites) {
  std::vector<std::string> messages;
  std::vector<LocalPlan> plans = {
      {Tensor("w", {4}, FlatRange{0, 2}), Object("rng.0", 8)},
      {Object("rng.1", 8), Tensor("w", {4}, FlatRange{2, 2})}};
  for (int r = 0; r < 2; ++r) {
    RankPlan rp;
    rp.fingerprint[0] = static_cast<uint8_t>(10 + r);
    rp.plan = plans[r];
    messages.push_back(EncodeRankPlan(rp));
  }
  auto planned = PlanOnCoordinator(std::move(messages));
  ASSERT_THAT(planned, IsOk());
  EXPECT_FALSE(planned->reused);
  auto record = format::DecodePlanRecord(planned->body);
  ASSERT_THAT(record, IsOk());
  ASSERT_EQ(record->ranks.size(), 2u);
  EXPECT_EQ(record->ranks[0].fingerprint[0], 10);
  EXPECT_EQ(record->ranks[1].fingerprint[0], 11);
  EXPECT_THAT(record->ranks[0].writes, ElementsAre(0u, 1u));
  EXPECT_THAT(record->ranks[1].writes, ElementsAre(0u, 1u));
}

// Two ranks: a replica on both, a shard on each and an object on rank 1;
// each rank's fingerprint is its rank + 1.
std::vector<std::string> ReplicaJob() {
  const Shape rep = {6};
  std::vector<LocalPlan> plans = {
      {Tensor("rep", rep, FullBox(rep), true),
       Tensor("w", {4}, FlatRange{0, 2})},
      {Tensor("rep", rep, FullBox(rep), true),
       Tensor("w", {4}, FlatRange{2, 2}), Object("rng.1", 8)}};
  std::vector<std::string> messages;
  for (int r = 0; r < 2; ++r) {
    RankPlan rp;
    rp.fingerprint[0] = static_cast<uint8_t>(r + 1);
    rp.plan = plans[r];
    messages.push_back(EncodeRankPlan(rp));
  }
  return messages;
}

// The plan PlanOnCoordinator makes for ReplicaJob: rank 0 writes the
// replica (rank 1 holds more bytes already).
format::PlanRecord ReplicaJobPlan() {
  format::PlanRecord rec;
  rec.ranks.resize(2);
  rec.ranks[0].fingerprint[0] = 1;
  rec.ranks[1].fingerprint[0] = 2;
  rec.ranks[0].writes = {0, 1};
  rec.ranks[1].writes = {1, 2};
  return rec;
}

TEST(SavePlanTest, CoordinatorPlansReplicaJobAsExpected) {
  auto planned = PlanOnCoordinator(ReplicaJob());
  ASSERT_THAT(planned, IsOk());
  EXPECT_EQ(planned->body, format::EncodePlanRecord(ReplicaJobPlan()));
}

TEST(SavePlanTest, CoordinatorReusesARecordedPlanThatWritesEveryPieceOnce) {
  // Another valid choice of the replica's writer: kept as recorded.
  format::PlanRecord rec = ReplicaJobPlan();
  rec.ranks[0].writes = {1};
  rec.ranks[1].writes = {0, 1, 2};
  const std::string body = format::EncodePlanRecord(rec);
  auto planned = PlanOnCoordinator(ReplicaJob(), body);
  ASSERT_THAT(planned, IsOk());
  EXPECT_TRUE(planned->reused);
  EXPECT_EQ(planned->body, body);
}

// A recorded plan offers writers, never decides what is saved: each of
// these is replanned (not reused, and the fresh plan is the one adopted).
TEST(SavePlanTest, CoordinatorReplansARecordedPlanThatDoesNotWriteEveryPiece) {
  std::vector<std::pair<std::string, format::PlanRecord>> tampered;
  format::PlanRecord rec = ReplicaJobPlan();
  rec.ranks[1].writes = {1};  // the object removed
  tampered.push_back({"object removed", rec});
  rec = ReplicaJobPlan();
  rec.ranks[0].writes = {1};  // the replica removed
  tampered.push_back({"replica removed", rec});
  rec = ReplicaJobPlan();
  rec.ranks[0].writes.clear();  // every position of a rank removed
  tampered.push_back({"rank's positions removed", rec});
  rec = ReplicaJobPlan();
  rec.ranks[1].writes = {0, 1, 2};  // the replica written twice
  tampered.push_back({"replica written twice", rec});
  rec = ReplicaJobPlan();
  rec.ranks[1].writes = {1, 2, 3};  // a position past the registrations
  tampered.push_back({"position out of range", rec});
  rec = ReplicaJobPlan();
  rec.ranks[1].fingerprint[0] = 9;  // recorded for another structure
  tampered.push_back({"other fingerprint", rec});
  rec = ReplicaJobPlan();
  rec.ranks.pop_back();  // another world size
  tampered.push_back({"other world size", rec});
  for (const auto& [what, r] : tampered) {
    auto planned = PlanOnCoordinator(ReplicaJob(), format::EncodePlanRecord(r));
    ASSERT_THAT(planned, IsOk()) << what;
    EXPECT_FALSE(planned->reused) << what;
    EXPECT_EQ(planned->body, format::EncodePlanRecord(ReplicaJobPlan()))
        << what;
  }
  auto garbage = PlanOnCoordinator(ReplicaJob(), "garbage");
  ASSERT_THAT(garbage, IsOk());
  EXPECT_FALSE(garbage->reused);
}

TEST(SavePlanTest, CoordinatorRefusesAnInvalidJobWhateverTheRecordedPlan) {
  // Two non-replica holders of one region: an error, even with a recorded
  // plan of matching fingerprints that writes it once.
  std::vector<std::string> messages;
  for (int r = 0; r < 2; ++r) {
    RankPlan rp;
    rp.plan = {Tensor("w", {4}, FullBox({4}))};
    messages.push_back(EncodeRankPlan(rp));
  }
  format::PlanRecord rec;
  rec.ranks.resize(2);
  rec.ranks[0].writes = {0};
  EXPECT_THAT(PlanOnCoordinator(messages, format::EncodePlanRecord(rec)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "none of them is marked as a replica"));
}

TEST(SavePlanTest, CoordinatorReportsAMalformedRankPlanAsInternal) {
  RankPlan rp;
  rp.plan = {Tensor("w", {4}, FullBox({4}))};
  std::string good = EncodeRankPlan(rp);
  std::string bad = good.substr(0, good.size() - 1);
  EXPECT_THAT(PlanOnCoordinator({good, bad}),
              StatusIs(absl::StatusCode::kInternal,
                       "malformed local plan from another rank"));
}

}  // namespace
}  // namespace ckpt::internal

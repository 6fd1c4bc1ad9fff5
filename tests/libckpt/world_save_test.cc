// internal::SaveWorld (libckpt/save/world_save.h): the checkpoint of N
// ranks written a few ranks at a time equals the one N Writer ranks save,
// and one named test per way it fails.
#include "save/world_save.h"

#include <filesystem>
#include <vector>

#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "testing/status_matchers.h"

namespace ckpt::internal {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;

constexpr int kWorld = 3;
const Shape kRows = {6, 2};  // split by rows: 2 rows per rank
const Shape kRep = {4};      // replicated on every rank

// The values of the whole tensors; rank r holds rows [2r, 2r+2) of "w".
std::vector<float> RowValues() {
  std::vector<float> v(12);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1.5f * i;
  return v;
}
const std::vector<float> kRowValues = RowValues();
const std::vector<float> kRepValues = {7, 8, 9, 10};

// Rank r's registrations, on a Writer or RankContents alike.
template <typename W>
absl::Status Register(W& w, int r) {
  TensorOptions replica;
  replica.replica = true;
  CKPT_RETURN_IF_ERROR(w.AddTensor("w", DType::kFloat32, kRows,
                                   Box{{2 * uint64_t(r), 0}, {2, 2}},
                                   kRowValues.data() + 4 * r));
  CKPT_RETURN_IF_ERROR(w.AddTensor("b", DType::kFloat32, kRep, FullBox(kRep),
                                   kRepValues.data(), replica));
  return w.SetObject("rng." + std::to_string(r), std::string(5 + r, 'a' + r));
}

WorldSaveOptions Options() {
  WorldSaveOptions o;
  o.parallel_ranks = 2;
  o.save.io_threads = 1;
  return o;
}

FillRank Fill() {
  return [](int r, RankContents& c, std::shared_ptr<void>&) {
    return Register(c, r);
  };
}

TEST(WorldSaveTest, WritesTheCheckpointThatWriterRanksWrite) {
  TempDir dir;
  const std::string a = dir.path() + "/batch", b = dir.path() + "/writer";
  auto saved = SaveWorld(a, 5, kWorld, Fill(), Options());
  ASSERT_THAT(saved, IsOk());
  EXPECT_EQ(saved->path, a + "/step-00000005");
  InProcessWorld world(kWorld);
  ASSERT_THAT(RunRanks(world,
                       [&](Communicator& comm) -> absl::Status {
                         Writer::Options wo;
                         wo.comm = &comm;
                         CKPT_ASSIGN_OR_RETURN(auto w, Writer::Create(wo));
                         CKPT_RETURN_IF_ERROR(Register(*w, comm.rank()));
                         SaveOptions so;
                         so.io_threads = 1;
                         return w->Save(b, 5, so).status();
                       }),
              IsOk());
  auto ra = Reader::Open(a), rb = Reader::Open(b);
  ASSERT_THAT(ra, IsOk());
  ASSERT_THAT(rb, IsOk());
  const format::Manifest& ma = (*ra)->manifest();
  const format::Manifest& mb = (*rb)->manifest();
  EXPECT_EQ(ma.info.world_size, 3u);
  EXPECT_EQ(ma.info.fingerprint, mb.info.fingerprint);
  EXPECT_EQ(ma.plan, mb.plan);
  ASSERT_EQ(ma.entries.size(), mb.entries.size());
  for (size_t i = 0; i < ma.entries.size(); ++i) {
    const auto& x = ma.entries[i];
    const auto& y = mb.entries[i];
    EXPECT_EQ(x.name, y.name);
    ASSERT_EQ(x.chunks.size(), y.chunks.size()) << x.name;
    for (size_t c = 0; c < x.chunks.size(); ++c) {
      EXPECT_EQ(x.chunks[c].region, y.chunks[c].region) << x.name;
      EXPECT_EQ(x.chunks[c].shard, y.chunks[c].shard) << x.name;
    }
  }
  std::vector<float> got(12);
  LoadRequest q;
  q.name = "w";
  q.dtype = DType::kFloat32;
  q.shape = kRows;
  q.region = FullBox(kRows);
  q.data = got.data();
  LoadOptions lo;
  lo.allow_unrequested = true;
  ASSERT_THAT((*ra)->Load({q}, lo).status(), IsOk());
  EXPECT_EQ(got, kRowValues);
}

TEST(WorldSaveTest, StructureChangedBetweenPassesFailsAndCommitsNothing) {
  TempDir dir;
  int calls = 0;
  FillRank fill = [&](int r, RankContents& c, std::shared_ptr<void>&) {
    CKPT_RETURN_IF_ERROR(Register(c, r));
    if (r == 1 && ++calls == 2) return c.SetObject("late", "x");
    return absl::OkStatus();
  };
  WorldSaveOptions o = Options();
  o.parallel_ranks = 1;
  EXPECT_THAT(SaveWorld(dir.path(), 5, kWorld, fill, o),
              StatusIs(absl::StatusCode::kInternal,
                       "rank 1: registered another structure"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/step-00000005"));
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().rfind(".tmp", 0), std::string::npos)
        << e.path();
  }
}

TEST(WorldSaveTest, FillErrorNamesTheRankAndCommitsNothing) {
  TempDir dir;
  FillRank fill = [](int r, RankContents& c, std::shared_ptr<void>&) {
    if (r == 2) return absl::NotFoundError("no such source");
    return Register(c, r);
  };
  EXPECT_THAT(SaveWorld(dir.path(), 5, kWorld, fill, Options()),
              StatusIs(absl::StatusCode::kNotFound, "rank 2: no such source"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/step-00000005"));
}

TEST(WorldSaveTest, OverlappingPiecesAreRejectedByThePlanner) {
  TempDir dir;
  FillRank fill = [](int r, RankContents& c, std::shared_ptr<void>&) {
    return c.AddTensor("w", DType::kFloat32, kRows, FullBox(kRows),
                       kRowValues.data());
  };
  EXPECT_THAT(SaveWorld(dir.path(), 5, 2, fill, Options()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "none of them is marked as a replica"));
}

TEST(WorldSaveTest, DuplicateNameIsAlreadyExists) {
  RankContents c;
  ASSERT_THAT(c.SetObject("x", "1"), IsOk());
  EXPECT_THAT(c.SetObject("x", "2"),
              StatusIs(absl::StatusCode::kAlreadyExists, "entry 'x'"));
}

TEST(WorldSaveTest, BadWorldIsInvalidArgument) {
  TempDir dir;
  EXPECT_THAT(SaveWorld(dir.path(), 5, 0, Fill(), Options()),
              StatusIs(absl::StatusCode::kInvalidArgument, "world >= 1"));
}

}  // namespace
}  // namespace ckpt::internal

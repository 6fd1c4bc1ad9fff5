// Locating a checkpoint (libckpt/storage/checkpoint_dir.h): a root or a
// checkpoint directory, `latest` and its failure modes (spec §4, §4.2).
#include "storage/checkpoint_dir.h"

#include <filesystem>
#include <fstream>

#include "ckpt/format/latest.h"
#include "ckpt/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "testing/status_matchers.h"

namespace ckpt::internal {
namespace {

using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::Pair;

class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto writer = Writer::Create({}).value();
    CKPT_ASSERT_OK(writer->SetObject("o", "x"));
    CKPT_ASSERT_OK(writer->Save(root_.path(), 5, {}).status());
  }
  void WriteFile(const std::string& name, const std::string& bytes) {
    std::ofstream(root_ / name, std::ios::binary) << bytes;
  }
  Storage* storage() { return DefaultStorage(); }
  TempDir root_;
};

TEST_F(CheckpointDirTest, ADirectoryWithAManifestIsACheckpoint) {
  EXPECT_EQ(IsCheckpointDir(storage(), root_ / "step-00000005").value(), true);
  EXPECT_EQ(IsCheckpointDir(storage(), root_.path()).value(), false);
  EXPECT_EQ(ResolveCheckpointDir(storage(), root_ / "step-00000005").value(),
            root_ / "step-00000005");
}

TEST_F(CheckpointDirTest, ARootIsResolvedThroughLatest) {
  EXPECT_EQ(ResolveCheckpointDir(storage(), root_.path()).value(),
            root_ / "step-00000005");
}

TEST_F(CheckpointDirTest, MissingPathAndFile) {
  EXPECT_THAT(IsCheckpointDir(storage(), root_ / "nope"),
              StatusIs(absl::StatusCode::kNotFound,
                       "no such checkpoint or checkpoint root"));
  EXPECT_THAT(IsCheckpointDir(storage(), root_ / "latest"),
              StatusIs(absl::StatusCode::kNotFound, "not a directory"));
}

TEST_F(CheckpointDirTest, NoLatestIsNotACheckpoint) {
  std::filesystem::remove(root_ / "latest");
  EXPECT_EQ(FollowLatest(storage(), root_.path()).value(), std::nullopt);
  EXPECT_THAT(ResolveCheckpointDir(storage(), root_.path()),
              StatusIs(absl::StatusCode::kNotFound,
                       "not a checkpoint (no MANIFEST) nor a checkpoint root "
                       "(no 'latest')"));
}

TEST_F(CheckpointDirTest, BrokenLatestIsDataLossNamingTheFile) {
  WriteFile("latest", "ckpt-latest v1 step-00000005 0000000000000000\n");
  EXPECT_THAT(FollowLatest(storage(), root_.path()),
              StatusIs(absl::StatusCode::kDataLoss, "broken pointer: "));
  EXPECT_THAT(ResolveCheckpointDir(storage(), root_.path()),
              StatusIs(absl::StatusCode::kDataLoss,
                       root_ / "latest: broken pointer: "));
}

TEST_F(CheckpointDirTest, LatestNamingANonCheckpoint) {
  WriteFile("latest", format::EncodeLatest("step-00000009"));
  EXPECT_THAT(
      ResolveCheckpointDir(storage(), root_.path()),
      StatusIs(absl::StatusCode::kNotFound,
               "latest: points to 'step-00000009', which is not a committed "
               "checkpoint"));
}

TEST_F(CheckpointDirTest, ListRootSeesLatestCommittedAndTemporaries) {
  std::filesystem::create_directory(root_ / ".tmp-step-00000006-ab");
  std::filesystem::create_directory(root_ / "step-00000007");  // no MANIFEST
  std::filesystem::create_directory(root_ / "other");
  auto l = ListRoot(storage(), root_.path());
  CKPT_ASSERT_OK(l);
  EXPECT_TRUE(l->has_latest);
  EXPECT_THAT(l->committed, ElementsAre(Pair(5u, "step-00000005")));
  EXPECT_THAT(l->temps, ElementsAre(".tmp-step-00000006-ab"));
}

TEST_F(CheckpointDirTest, ReadManifestNamesTheFileOfACorruptManifest) {
  const std::string dir = root_ / "step-00000005";
  auto m = ReadManifest(storage(), dir);
  CKPT_ASSERT_OK(m);
  EXPECT_EQ(m->info.step, 5u);
  std::ofstream(dir + "/MANIFEST", std::ios::binary | std::ios::trunc)
      << "garbage";
  EXPECT_THAT(ReadManifest(storage(), dir),
              StatusIs(absl::StatusCode::kDataLoss, dir + "/MANIFEST: "));
}

}  // namespace
}  // namespace ckpt::internal

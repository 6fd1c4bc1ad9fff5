// The directory-level steps of the commit protocol (libckpt/save/commit.h), on
// the in-memory power-loss model so that each test can also check what
// survives a power cut right after the step, and on POSIX for the locks.
#include "save/commit.h"

#include <string>
#include <vector>

#include "ckpt/format/format_constants.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/manifest.h"
#include "ckpt/testing/power_loss.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "testing/status_matchers.h"

namespace ckpt::internal {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::StartsWith;

constexpr char kRoot[] = "/ck";

// A root with a durable, empty checkpoint directory per step in `steps`.
void MakeRoot(PowerLossStorage& disk, const std::vector<uint64_t>& steps) {
  ASSERT_THAT(EnsureRoot(&disk, kRoot), IsOk());
  for (uint64_t s : steps) {
    const std::string dir = JoinPath(kRoot, format::StepDirName(s));
    ASSERT_THAT(disk.CreateDir(dir), IsOk());
    ASSERT_THAT(
        disk.WriteFileAndSync(JoinPath(dir, format::kManifestFileName), "m"),
        IsOk());
    ASSERT_THAT(disk.SyncDir(dir), IsOk());
  }
  ASSERT_THAT(disk.SyncDir(kRoot), IsOk());
}

std::string Latest(PowerLossStorage& disk) {
  auto bytes = disk.ReadFile(JoinPath(kRoot, format::kLatestFileName));
  if (!bytes.ok()) return bytes.status().ToString();
  auto dir = format::DecodeLatest(*bytes);
  return dir.ok() ? *dir : dir.status().ToString();
}

TEST(CommitTest, EnsureRootCreatesADurableRoot) {
  PowerLossStorage disk;
  ASSERT_THAT(EnsureRoot(&disk, kRoot), IsOk());
  ASSERT_THAT(EnsureRoot(&disk, kRoot), IsOk());  // exists: fine
  disk.PowerCut();
  auto st = disk.Stat(kRoot);
  ASSERT_THAT(st, IsOk());
  EXPECT_TRUE(st->is_dir);
}

TEST(CommitTest, EnsureRootOnAFileIsInvalidArgument) {
  PowerLossStorage disk;
  ASSERT_THAT(disk.WriteFileAndSync(kRoot, "x"), IsOk());
  EXPECT_THAT(EnsureRoot(&disk, kRoot),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "/ck: exists and is not a directory"));
}

TEST(CommitTest, TemporaryDirectoryIsHiddenInTheRoot) {
  PowerLossStorage disk;
  MakeRoot(disk, {});
  auto tmp = CreateTempDir(&disk, kRoot, 7);
  ASSERT_THAT(tmp, IsOk());
  EXPECT_THAT(*tmp, StartsWith("/ck/.tmp-step-00000007-"));
  EXPECT_TRUE(disk.Stat(*tmp)->is_dir);
}

TEST(CommitTest, CommitDirRenamesDurably) {
  PowerLossStorage disk;
  MakeRoot(disk, {});
  auto tmp = CreateTempDir(&disk, kRoot, 1);
  ASSERT_THAT(tmp, IsOk());
  ASSERT_THAT(CommitDir(&disk, kRoot, *tmp, "/ck/step-00000001", false),
              IsOk());
  disk.PowerCut();
  EXPECT_THAT(*disk.List(kRoot), ElementsAre("step-00000001"));
}

TEST(CommitTest, CommitDirRefusesAnExistingStepAndKeepsBoth) {
  PowerLossStorage disk;
  MakeRoot(disk, {1});
  auto tmp = CreateTempDir(&disk, kRoot, 1);
  ASSERT_THAT(tmp, IsOk());
  EXPECT_THAT(CommitDir(&disk, kRoot, *tmp, "/ck/step-00000001", false),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       "set overwrite to replace it"));
  EXPECT_THAT(disk.Stat(*tmp), IsOk());
  EXPECT_THAT(disk.Stat("/ck/step-00000001/MANIFEST"), IsOk());
}

TEST(CommitTest, CommitDirWithOverwriteReplacesAndRemovesTheOld) {
  PowerLossStorage disk;
  MakeRoot(disk, {1});
  auto tmp = CreateTempDir(&disk, kRoot, 1);
  ASSERT_THAT(tmp, IsOk());
  ASSERT_THAT(CommitDir(&disk, kRoot, *tmp, "/ck/step-00000001", true), IsOk());
  EXPECT_THAT(*disk.List(kRoot), ElementsAre("step-00000001"));
  EXPECT_THAT(disk.Stat("/ck/step-00000001/MANIFEST"),
              StatusIs(absl::StatusCode::kNotFound, ""));  // the new, empty one
}

TEST(CommitTest, UpdateLatestIsDurable) {
  PowerLossStorage disk;
  MakeRoot(disk, {3});
  ASSERT_THAT(UpdateLatest(&disk, kRoot, "step-00000003", 3), IsOk());
  disk.PowerCut();
  EXPECT_EQ(Latest(disk), "step-00000003");
  EXPECT_THAT(*disk.List(kRoot),
              ElementsAre("latest", "step-00000003"));  // no temporary
}

TEST(CommitTest, UpdateLatestNeverMovesBackToAnOlderStep) {
  PowerLossStorage disk;
  MakeRoot(disk, {2, 5});
  ASSERT_THAT(UpdateLatest(&disk, kRoot, "step-00000005", 5), IsOk());
  ASSERT_THAT(UpdateLatest(&disk, kRoot, "step-00000002", 2), IsOk());
  EXPECT_EQ(Latest(disk), "step-00000005");
}

TEST(CommitTest, UpdateLatestReplacesAPointerToAMissingNewerStep) {
  PowerLossStorage disk;
  MakeRoot(disk, {2});
  ASSERT_THAT(disk.WriteFileAndSync("/ck/latest",
                                    format::EncodeLatest("step-00000009")),
              IsOk());
  ASSERT_THAT(UpdateLatest(&disk, kRoot, "step-00000002", 2), IsOk());
  EXPECT_EQ(Latest(disk), "step-00000002");
}

TEST(CommitTest, PruneOldKeepsTheNewestAndWhatLatestNames) {
  PowerLossStorage disk;
  MakeRoot(disk, {1, 2, 3, 4});
  ASSERT_THAT(UpdateLatest(&disk, kRoot, "step-00000001", 1), IsOk());
  ASSERT_THAT(PruneOld(&disk, kRoot, 2), IsOk());
  disk.PowerCut();
  EXPECT_THAT(*disk.List(kRoot), ElementsAre("latest", "step-00000001",
                                             "step-00000003", "step-00000004"));
}

TEST(CommitTest, PruneOldZeroKeepsEverything) {
  PowerLossStorage disk;
  MakeRoot(disk, {1, 2});
  ASSERT_THAT(PruneOld(&disk, kRoot, 0), IsOk());
  EXPECT_EQ(disk.List(kRoot)->size(), 2u);
}

TEST(CommitTest, PruneOldFinishesAnInterruptedRemoval) {
  PowerLossStorage disk;
  MakeRoot(disk, {1, 2});
  ASSERT_THAT(disk.RemoveFile("/ck/step-00000001/MANIFEST"), IsOk());
  ASSERT_THAT(PruneOld(&disk, kRoot, 1), IsOk());
  EXPECT_THAT(*disk.List(kRoot), ElementsAre("step-00000002"));
}

ShardReport Report(uint64_t file_size, const std::string& name, uint32_t shard,
                   uint64_t start, uint64_t length) {
  format::EntryRecord e;
  e.name = name;
  e.dtype = DType::kFloat32;
  e.shape = {8};
  format::ChunkRecord c;
  c.region = FlatRange{start, length};
  c.shard = shard;
  c.stored_length = 4 * length;
  c.block_size = 4096;
  e.chunks.push_back(c);
  return ShardReport{file_size, {e}};
}

TEST(CommitTest, AssembleManifestMergesChunksInRankOrderAndSortsEntries) {
  format::CheckpointInfo info;
  info.step = 4;
  info.world_size = 2;
  std::vector<ShardReport> reports = {Report(100, "w", 0, 0, 5),
                                      Report(200, "w", 1, 5, 3)};
  reports[1].entries.push_back(Report(0, "a", 1, 0, 8).entries[0]);
  CommitSummary summary;
  format::Manifest m = AssembleManifest(info, {{"k", "v"}}, "plan",
                                        std::move(reports), &summary);
  EXPECT_EQ(m.info, info);
  EXPECT_EQ(m.plan, "plan");
  ASSERT_EQ(m.shards.size(), 2u);
  EXPECT_EQ(m.shards[1].file_name, "shard-00001.ckpt");
  EXPECT_EQ(m.shards[1].file_size, 200u);
  ASSERT_EQ(m.entries.size(), 2u);
  EXPECT_EQ(m.entries[0].name, "a");
  ASSERT_EQ(m.entries[1].chunks.size(), 2u);
  EXPECT_EQ(m.entries[1].chunks[0].shard, 0u);
  EXPECT_EQ(m.entries[1].chunks[1].shard, 1u);
  EXPECT_EQ(summary.stored_bytes, 4u * (5 + 3 + 8));
  EXPECT_EQ(summary.logical_bytes, 4u * (5 + 3 + 8));
}

TEST(CommitTest, CommitCheckpointSurvivesAPowerCutAsSoonAsItReturns) {
  PowerLossStorage disk;
  MakeRoot(disk, {});
  auto tmp = CreateTempDir(&disk, kRoot, 6);
  ASSERT_THAT(tmp, IsOk());
  format::Manifest m;
  m.info.step = 6;
  ASSERT_THAT(CommitCheckpoint(&disk, kRoot, *tmp, m, false, 0), IsOk());
  disk.PowerCut();
  EXPECT_EQ(Latest(disk), "step-00000006");
  auto bytes = disk.ReadFile("/ck/step-00000006/MANIFEST");
  ASSERT_THAT(bytes, IsOk());
  EXPECT_EQ(*bytes, format::EncodeManifest(m));
}

TEST(CommitTest, CommitCheckpointOfAnExistingStepLeavesTheTemporary) {
  PowerLossStorage disk;
  MakeRoot(disk, {6});
  auto tmp = CreateTempDir(&disk, kRoot, 6);
  ASSERT_THAT(tmp, IsOk());
  format::Manifest m;
  m.info.step = 6;
  EXPECT_THAT(CommitCheckpoint(&disk, kRoot, *tmp, m, false, 0),
              StatusIs(absl::StatusCode::kAlreadyExists, "step-00000006"));
  EXPECT_THAT(disk.Stat(JoinPath(*tmp, format::kManifestFileName)), IsOk());
}

TEST(CommitTest, SaveLockRemovesLeftoversOnlyWhenAlone) {
  TempDir root;
  Storage* fs = DefaultStorage();
  ASSERT_THAT(fs->CreateDir(root / ".tmp-step-00000001-dead"), IsOk());
  std::vector<std::string> removed;
  auto first = LockRootForSave(fs, root.path(), &removed);
  ASSERT_THAT(first, IsOk());
  EXPECT_THAT(removed, ElementsAre(".tmp-step-00000001-dead"));
  // A second save while the first holds the lock shares it and keeps the
  // first one's (live) temporaries.
  ASSERT_THAT(fs->CreateDir(root / ".tmp-step-00000002-live"), IsOk());
  removed.clear();
  auto second = LockRootForSave(fs, root.path(), &removed);
  ASSERT_THAT(second, IsOk());
  EXPECT_TRUE(removed.empty());
  EXPECT_THAT(fs->Stat(root / ".tmp-step-00000002-live"), IsOk());
}

TEST(CommitTest, StorageWithoutLocksGetsNoLock) {
  PowerLossStorage disk;
  MakeRoot(disk, {});
  auto lock = LockRootForSave(&disk, kRoot, nullptr);
  ASSERT_THAT(lock, IsOk());
  EXPECT_EQ(*lock, nullptr);
  auto commit = LockRootForCommit(&disk, kRoot);
  ASSERT_THAT(commit, IsOk());
  EXPECT_EQ(*commit, nullptr);
}

}  // namespace
}  // namespace ckpt::internal

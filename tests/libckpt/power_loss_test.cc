// PowerLossStorage: the page-cache model that the power-loss tests of the
// writer rely on (tests/reliability/power_loss_test.cc).
#include "ckpt/testing/power_loss.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;

// Writes `data` into a new file; syncs the file when `sync`.
void Write(PowerLossStorage& disk, const std::string& path,
           const std::string& data, bool sync) {
  auto f = disk.Open(path, OpenMode::kCreateNew);
  ASSERT_THAT(f, IsOk());
  ASSERT_THAT((*f)->PWrite(0, data), IsOk());
  if (sync) {
    ASSERT_THAT((*f)->Sync(), IsOk());
  }
  ASSERT_THAT((*f)->Close(), IsOk());
}

// A durable directory /d.
void MakeDir(PowerLossStorage& disk) {
  ASSERT_THAT(disk.CreateDir("/d"), IsOk());
  ASSERT_THAT(disk.SyncDir("/"), IsOk());
}

TEST(PowerLossStorageTest, SyncedFileInSyncedDirectorySurvives) {
  PowerLossStorage disk;
  MakeDir(disk);
  Write(disk, "/d/f", "hello", true);
  ASSERT_THAT(disk.SyncDir("/d"), IsOk());
  disk.PowerCut();
  auto got = disk.ReadFile("/d/f");
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(*got, "hello");
}

TEST(PowerLossStorageTest, UnsyncedBytesAreLost) {
  PowerLossStorage disk;
  MakeDir(disk);
  Write(disk, "/d/f", "hello", true);
  ASSERT_THAT(disk.SyncDir("/d"), IsOk());
  auto f = disk.Open("/d/f", OpenMode::kReadWrite);
  ASSERT_THAT(f, IsOk());
  ASSERT_THAT((*f)->PWrite(5, " world"), IsOk());
  EXPECT_EQ(*disk.ReadFile("/d/f"), "hello world");  // the page cache
  disk.PowerCut();
  EXPECT_EQ(*disk.ReadFile("/d/f"), "hello");
}

TEST(PowerLossStorageTest, NewFileWithoutDirectorySyncIsLost) {
  PowerLossStorage disk;
  MakeDir(disk);
  Write(disk, "/d/f", "hello", true);  // the file's bytes, not its name
  disk.PowerCut();
  EXPECT_THAT(disk.Stat("/d/f"), StatusIs(absl::StatusCode::kNotFound, ""));
}

TEST(PowerLossStorageTest, NameWithoutFileSyncSurvivesEmpty) {
  PowerLossStorage disk;
  MakeDir(disk);
  Write(disk, "/d/f", "hello", false);
  ASSERT_THAT(disk.SyncDir("/d"), IsOk());
  disk.PowerCut();
  auto got = disk.ReadFile("/d/f");
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(*got, "");
}

TEST(PowerLossStorageTest, NewDirectoryNeedsItsParentSynced) {
  PowerLossStorage disk;
  ASSERT_THAT(disk.CreateDir("/d"), IsOk());
  Write(disk, "/d/f", "x", true);
  ASSERT_THAT(disk.SyncDir("/d"), IsOk());  // not "/"
  disk.PowerCut();
  EXPECT_THAT(disk.Stat("/d"), StatusIs(absl::StatusCode::kNotFound, ""));
}

TEST(PowerLossStorageTest, RenameWithoutDirectorySyncIsUndone) {
  PowerLossStorage disk;
  MakeDir(disk);
  Write(disk, "/d/old", "old", true);
  Write(disk, "/d/tmp", "new", true);
  ASSERT_THAT(disk.SyncDir("/d"), IsOk());
  ASSERT_THAT(disk.Rename("/d/tmp", "/d/old"), IsOk());
  EXPECT_EQ(*disk.ReadFile("/d/old"), "new");
  disk.PowerCut();
  EXPECT_EQ(*disk.ReadFile("/d/old"), "old");
  EXPECT_EQ(*disk.ReadFile("/d/tmp"), "new");
}

TEST(PowerLossStorageTest, RenameThenDirectorySyncIsDurable) {
  PowerLossStorage disk;
  MakeDir(disk);
  Write(disk, "/d/tmp", "new", true);
  ASSERT_THAT(disk.Rename("/d/tmp", "/d/f"), IsOk());
  ASSERT_THAT(disk.SyncDir("/d"), IsOk());
  disk.PowerCut();
  EXPECT_THAT(*disk.List("/d"), ElementsAre("f"));
  EXPECT_EQ(*disk.ReadFile("/d/f"), "new");
}

TEST(PowerLossStorageTest, RemovalWithoutDirectorySyncIsUndone) {
  PowerLossStorage disk;
  MakeDir(disk);
  ASSERT_THAT(disk.CreateDir("/d/sub"), IsOk());
  Write(disk, "/d/sub/f", "x", true);
  ASSERT_THAT(disk.SyncDir("/d/sub"), IsOk());
  ASSERT_THAT(disk.SyncDir("/d"), IsOk());
  ASSERT_THAT(disk.RemoveAll("/d/sub"), IsOk());
  EXPECT_EQ(disk.pending_dir_ops(), 2u);  // unlink f, rmdir sub
  disk.PowerCut();
  EXPECT_EQ(*disk.ReadFile("/d/sub/f"), "x");
}

TEST(PowerLossStorageTest, PrefixOfPendingOperationsSurvives) {
  PowerLossStorage disk;
  MakeDir(disk);
  Write(disk, "/d/a", "a", true);
  Write(disk, "/d/b", "b", true);
  Write(disk, "/d/c", "c", true);
  ASSERT_EQ(disk.pending_dir_ops(), 3u);
  disk.PowerCut(2);
  EXPECT_THAT(*disk.List("/d"), ElementsAre("a", "b"));
}

TEST(PowerLossStorageTest, AnySinglePendingOperationMaySurviveAlone) {
  PowerLossStorage disk;
  MakeDir(disk);
  Write(disk, "/d/a", "a", true);
  Write(disk, "/d/b", "b", true);
  disk.PowerCutKeepingOnly(1);
  EXPECT_THAT(*disk.List("/d"), ElementsAre("b"));
}

TEST(PowerLossStorageTest, DirectorySyncRetiresOnlyItsOwnOperations) {
  PowerLossStorage disk;
  MakeDir(disk);
  ASSERT_THAT(disk.CreateDir("/e"), IsOk());
  Write(disk, "/d/a", "a", true);
  ASSERT_EQ(disk.pending_dir_ops(), 2u);
  ASSERT_THAT(disk.SyncDir("/d"), IsOk());
  EXPECT_EQ(disk.pending_dir_ops(), 1u);  // mkdir /e
}

TEST(PowerLossStorageTest, HaltFailsThatCallAndEveryLaterOneWithoutEffect) {
  PowerLossStorage disk;
  MakeDir(disk);
  disk.HaltAtCall(2);
  EXPECT_THAT(disk.CreateDir("/d/one"), IsOk());
  EXPECT_THAT(disk.CreateDir("/d/two"), StatusIs(absl::StatusCode::kUnavailable,
                                                 "mkdir /d/two: power lost"));
  EXPECT_THAT(disk.Stat("/d/one"),
              StatusIs(absl::StatusCode::kUnavailable, ""));
  disk.PowerCut(1);
  EXPECT_THAT(*disk.List("/d"), ElementsAre("one"));
}

TEST(PowerLossStorageTest, FileOpenedBeforeThePowerCutIsStale) {
  PowerLossStorage disk;
  MakeDir(disk);
  Write(disk, "/d/f", "x", true);
  ASSERT_THAT(disk.SyncDir("/d"), IsOk());
  auto f = disk.Open("/d/f", OpenMode::kReadWrite);
  ASSERT_THAT(f, IsOk());
  disk.PowerCut();
  EXPECT_THAT((*f)->PWrite(0, "y"), StatusIs(absl::StatusCode::kUnavailable,
                                             "opened before a power loss"));
}

TEST(PowerLossStorageTest, ForkIsIndependentAndKeepsPendingOperations) {
  PowerLossStorage disk;
  MakeDir(disk);
  Write(disk, "/d/a", "a", true);
  auto fork = disk.Fork();
  EXPECT_EQ(fork->calls(), 0);
  EXPECT_EQ(fork->pending_dir_ops(), 1u);
  Write(*fork, "/d/b", "b", true);
  EXPECT_THAT(disk.Stat("/d/b"), StatusIs(absl::StatusCode::kNotFound, ""));
  fork->PowerCut(1);
  EXPECT_THAT(*fork->List("/d"), ElementsAre("a"));
  EXPECT_THAT(*disk.List("/d"), ElementsAre("a"));  // untouched
}

TEST(PowerLossStorageTest, ErrorsNameOperationAndPath) {
  PowerLossStorage disk;
  MakeDir(disk);
  EXPECT_THAT(disk.Open("/d/none", OpenMode::kRead),
              StatusIs(absl::StatusCode::kNotFound, "open /d/none"));
  Write(disk, "/d/f", "x", false);
  EXPECT_THAT(disk.Open("/d/f", OpenMode::kCreateNew),
              StatusIs(absl::StatusCode::kAlreadyExists, "open /d/f"));
  Write(disk, "/d/g", "y", false);
  EXPECT_THAT(
      disk.RenameNoReplace("/d/f", "/d/g"),
      StatusIs(absl::StatusCode::kAlreadyExists, "rename /d/f to /d/g"));
  EXPECT_THAT(disk.RemoveFile("/d/none"),
              StatusIs(absl::StatusCode::kNotFound, "unlink /d/none"));
  EXPECT_THAT(disk.RemoveAll("/d/none"), IsOk());
}

}  // namespace
}  // namespace ckpt

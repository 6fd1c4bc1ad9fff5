#include "ckpt/testing/fault_injection.h"

#include <stdlib.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/storage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
constexpr auto kInternal = absl::StatusCode::kInternal;
constexpr auto kUnavailable = absl::StatusCode::kUnavailable;
constexpr auto kNotFound = absl::StatusCode::kNotFound;

absl::Status Boom() { return absl::InternalError("boom"); }

class FaultInjectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = JoinPath(::testing::TempDir(), "ckpt-fault-test-XXXXXX");
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    ASSERT_NE(::mkdtemp(buf.data()), nullptr) << std::strerror(errno);
    dir_ = buf.data();
  }
  void TearDown() override {
    if (!dir_.empty()) {
      CKPT_EXPECT_OK(base_->RemoveAll(dir_));
    }
  }
  std::string Path(absl::string_view name) const {
    return JoinPath(dir_, name);
  }
  // Bypasses the fault injection.
  std::string ReadBase(const std::string& path) {
    absl::StatusOr<std::string> s = base_->ReadFile(path);
    return s.ok() ? *s : "<" + s.status().ToString() + ">";
  }
  bool Exists(const std::string& path) { return base_->Stat(path).ok(); }

  Storage* const base_ = DefaultStorage();
  FaultInjectingStorage fs_{base_};
  std::string dir_;
};

TEST_F(FaultInjectionTest, ForwardsWithoutRules) {
  CKPT_ASSERT_OK(fs_.WriteFileAndSync(Path("f"), "data"));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs_.ReadFile(Path("f")));
  EXPECT_EQ(back, "data");
  EXPECT_EQ(fs_.injected(), 0);
}

TEST_F(FaultInjectionTest, FailAtOpenDoesNotCreate) {
  fs_.FailAt(StorageOp::kOpen, 1, Boom());
  EXPECT_THAT(
      fs_.Open(Path("f"), OpenMode::kCreateNew),
      StatusIs(kInternal, "injected fault: open " + Path("f") + ": boom"));
  EXPECT_FALSE(Exists(Path("f")));
  CKPT_EXPECT_OK(fs_.Open(Path("f"), OpenMode::kCreateNew).status());
  EXPECT_EQ(fs_.injected(), 1);
}

TEST_F(FaultInjectionTest, FailAtReadAndWriteAndSyncAndClose) {
  fs_.FailAt(StorageOp::kWrite, 1, Boom());
  fs_.FailAt(StorageOp::kSync, 1, Boom());
  fs_.FailAt(StorageOp::kRead, 1, Boom());
  fs_.FailAt(StorageOp::kClose, 1, Boom());
  const std::string path = Path("f");
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs_.Open(path, OpenMode::kCreateNew));
  EXPECT_THAT(f->PWrite(0, "abc"),
              StatusIs(kInternal, "injected fault: pwrite " + path + ": boom"));
  EXPECT_EQ(ReadBase(path), "");  // the failed write wrote nothing
  CKPT_ASSERT_OK(f->PWrite(0, "abc"));
  EXPECT_THAT(f->Sync(), StatusIs(kInternal, "injected fault: fsync " + path));
  CKPT_ASSERT_OK(f->Sync());
  char buf[3];
  EXPECT_THAT(f->PRead(0, 3, buf),
              StatusIs(kInternal, "injected fault: pread " + path));
  CKPT_ASSERT_OK_AND_ASSIGN(size_t n, f->PRead(0, 3, buf));
  EXPECT_EQ(std::string(buf, n), "abc");
  EXPECT_THAT(f->Close(), StatusIs(kInternal, "injected fault: close " + path));
  CKPT_ASSERT_OK(f->Close());
  EXPECT_EQ(fs_.injected(), 4);
}

TEST_F(FaultInjectionTest, FailAtStatCoversFileSize) {
  CKPT_ASSERT_OK(base_->WriteFileAndSync(Path("f"), "abc"));
  fs_.FailAt(StorageOp::kStat, 1, Boom());
  fs_.FailAt(StorageOp::kStat, 2, Boom());
  EXPECT_THAT(fs_.Stat(Path("f")),
              StatusIs(kInternal, "injected fault: stat " + Path("f")));
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs_.Open(Path("f"), OpenMode::kRead));
  EXPECT_THAT(f->Size(),
              StatusIs(kInternal, "injected fault: fstat " + Path("f")));
  CKPT_ASSERT_OK_AND_ASSIGN(uint64_t size, f->Size());
  EXPECT_EQ(size, 3u);
}

TEST_F(FaultInjectionTest, FailAtCreateDirDoesNotCreate) {
  fs_.FailAt(StorageOp::kCreateDir, 1, Boom());
  EXPECT_THAT(fs_.CreateDir(Path("d")),
              StatusIs(kInternal, "injected fault: mkdir " + Path("d")));
  EXPECT_FALSE(Exists(Path("d")));
}

TEST_F(FaultInjectionTest, FailAtSyncDir) {
  fs_.FailAt(StorageOp::kSyncDir, 1, Boom());
  EXPECT_THAT(fs_.SyncDir(dir_),
              StatusIs(kInternal, "injected fault: fsync " + dir_));
  CKPT_EXPECT_OK(fs_.SyncDir(dir_));
}

TEST_F(FaultInjectionTest, FailAtRenameDoesNotRename) {
  CKPT_ASSERT_OK(base_->WriteFileAndSync(Path("a"), "a"));
  fs_.FailAt(StorageOp::kRename, 1, Boom());
  fs_.FailAt(StorageOp::kRename, 2, Boom());
  EXPECT_THAT(fs_.Rename(Path("a"), Path("b")),
              StatusIs(kInternal, "injected fault: rename " + Path("a") +
                                      " to " + Path("b") + ": boom"));
  EXPECT_THAT(fs_.RenameNoReplace(Path("a"), Path("b")),
              StatusIs(kInternal, "injected fault: rename"));
  EXPECT_TRUE(Exists(Path("a")));
  EXPECT_FALSE(Exists(Path("b")));
  CKPT_ASSERT_OK(fs_.RenameNoReplace(Path("a"), Path("b")));
  EXPECT_EQ(fs_.count(StorageOp::kRename), 3);
}

TEST_F(FaultInjectionTest, FailAtList) {
  fs_.FailAt(StorageOp::kList, 1, Boom());
  EXPECT_THAT(fs_.List(dir_),
              StatusIs(kInternal, "injected fault: opendir " + dir_));
  CKPT_EXPECT_OK(fs_.List(dir_).status());
}

TEST_F(FaultInjectionTest, FailAtRemoveKeepsFiles) {
  CKPT_ASSERT_OK(base_->CreateDir(Path("d")));
  CKPT_ASSERT_OK(base_->WriteFileAndSync(Path("d/f"), "f"));
  fs_.FailAt(StorageOp::kRemove, 1, Boom());
  fs_.FailAt(StorageOp::kRemove, 2, Boom());
  EXPECT_THAT(fs_.RemoveFile(Path("d/f")),
              StatusIs(kInternal, "injected fault: unlink " + Path("d/f")));
  EXPECT_THAT(fs_.RemoveAll(Path("d")),
              StatusIs(kInternal, "injected fault: remove_all " + Path("d")));
  EXPECT_TRUE(Exists(Path("d/f")));
  CKPT_ASSERT_OK(fs_.RemoveAll(Path("d")));
  EXPECT_FALSE(Exists(Path("d")));
}

TEST_F(FaultInjectionTest, FailAtCountsTheNthCall) {
  fs_.FailAt(StorageOp::kWrite, 3, Boom());
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs_.Open(Path("f"), OpenMode::kCreateNew));
  CKPT_EXPECT_OK(f->PWrite(0, "1"));
  CKPT_EXPECT_OK(f->PWrite(1, "2"));
  EXPECT_THAT(f->PWrite(2, "3"), StatusIs(kInternal, "boom"));
  CKPT_EXPECT_OK(f->PWrite(3, "4"));
  EXPECT_EQ(ReadBase(Path("f")), std::string("12\0"
                                             "4",
                                             4));
  EXPECT_EQ(fs_.count(StorageOp::kWrite), 4);
  EXPECT_EQ(fs_.injected(), 1);
}

TEST_F(FaultInjectionTest, InjectedErrorKeepsCode) {
  fs_.FailAt(StorageOp::kWrite, 1, absl::ResourceExhaustedError("disk full"));
  const std::string path = Path("shard-00000.ckpt");
  EXPECT_THAT(fs_.WriteFileAndSync(path, "x"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "injected fault: pwrite " + path + ": disk full"));
}

TEST_F(FaultInjectionTest, OkErrorBecomesInternal) {
  fs_.FailAt(StorageOp::kSyncDir, 1, absl::OkStatus());
  EXPECT_THAT(fs_.SyncDir(dir_), StatusIs(kInternal, "injected fault"));
}

TEST_F(FaultInjectionTest, ShortWriteLeavesExactlyThePrefix) {
  fs_.ShortWriteAt(2, 4, absl::ResourceExhaustedError("disk full"));
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs_.Open(Path("f"), OpenMode::kCreateNew));
  CKPT_ASSERT_OK(f->PWrite(0, "head:"));
  EXPECT_THAT(f->PWrite(5, "0123456789"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "injected fault: pwrite " + Path("f") + ": disk full"));
  EXPECT_EQ(ReadBase(Path("f")), "head:0123");
  EXPECT_EQ(fs_.injected(), 1);
}

TEST_F(FaultInjectionTest, ShortWriteLongerThanDataWritesAllThenFails) {
  fs_.ShortWriteAt(1, 100, Boom());
  EXPECT_THAT(fs_.WriteFileAndSync(Path("f"), "abc"),
              StatusIs(kInternal, "boom"));
  EXPECT_EQ(ReadBase(Path("f")), "abc");
}

TEST_F(FaultInjectionTest, ShortWriteOfZeroBytesWritesNothing) {
  fs_.ShortWriteAt(1, 0, Boom());
  EXPECT_THAT(fs_.WriteFileAndSync(Path("f"), "abc"),
              StatusIs(kInternal, "boom"));
  EXPECT_EQ(ReadBase(Path("f")), "");
}

TEST_F(FaultInjectionTest, ShortReadReturnsFewerBytesWithoutAnError) {
  CKPT_ASSERT_OK(base_->WriteFileAndSync(Path("f"), "0123456789"));
  fs_.ShortReadAt(2, 3);
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs_.Open(Path("f"), OpenMode::kRead));
  char buf[10];
  CKPT_ASSERT_OK_AND_ASSIGN(size_t n, f->PRead(0, 10, buf));
  EXPECT_EQ(std::string(buf, n), "0123456789");
  CKPT_ASSERT_OK_AND_ASSIGN(n, f->PRead(2, 8, buf));  // the 2nd read
  EXPECT_EQ(std::string(buf, n), "234");
  CKPT_ASSERT_OK_AND_ASSIGN(n, f->PRead(2, 8, buf));
  EXPECT_EQ(std::string(buf, n), "23456789");
  EXPECT_EQ(fs_.injected(), 1);
}

TEST_F(FaultInjectionTest, CorruptReadFlipsOneBitOfWhatWasRead) {
  CKPT_ASSERT_OK(base_->WriteFileAndSync(Path("f"), "0123456789"));
  fs_.CorruptReadAt(1, /*byte=*/15, /*bit=*/2);  // byte 15 % 4 = 3 of the read
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs_.Open(Path("f"), OpenMode::kRead));
  char buf[4];
  CKPT_ASSERT_OK_AND_ASSIGN(size_t n, f->PRead(4, 4, buf));
  EXPECT_EQ(std::string(buf, n),
            std::string("456") + static_cast<char>('7' ^ 4));
  CKPT_ASSERT_OK_AND_ASSIGN(n, f->PRead(4, 4, buf));
  EXPECT_EQ(std::string(buf, n), "4567");
  EXPECT_EQ(ReadBase(Path("f")), "0123456789");  // the file is untouched
  EXPECT_EQ(fs_.injected(), 1);
}

TEST_F(FaultInjectionTest, CrashAtFailsEveryLaterOp) {
  fs_.CrashAt(StorageOp::kSync, 1);
  const std::string path = Path("f");
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs_.Open(path, OpenMode::kCreateNew));
  CKPT_ASSERT_OK(f->PWrite(0, "before"));
  EXPECT_THAT(f->Sync(), StatusIs(kUnavailable, "injected fault: fsync " +
                                                    path + ": injected crash"));
  EXPECT_THAT(f->PWrite(6, "after"), StatusIs(kUnavailable, "injected crash"));
  char c;
  EXPECT_THAT(f->PRead(0, 1, &c), StatusIs(kUnavailable, "injected crash"));
  EXPECT_THAT(f->Close(), StatusIs(kUnavailable, "injected crash"));
  EXPECT_THAT(fs_.Open(path, OpenMode::kRead), StatusIs(kUnavailable, "crash"));
  EXPECT_THAT(fs_.CreateDir(Path("d")), StatusIs(kUnavailable, "crash"));
  EXPECT_THAT(fs_.SyncDir(dir_), StatusIs(kUnavailable, "crash"));
  EXPECT_THAT(fs_.Rename(path, Path("g")), StatusIs(kUnavailable, "crash"));
  EXPECT_THAT(fs_.List(dir_), StatusIs(kUnavailable, "crash"));
  EXPECT_THAT(fs_.Stat(path), StatusIs(kUnavailable, "crash"));
  EXPECT_THAT(fs_.RemoveAll(dir_), StatusIs(kUnavailable, "crash"));
  EXPECT_EQ(fs_.injected(), 11);
  // What reached the disk before the crash stays; nothing after it.
  EXPECT_EQ(ReadBase(path), "before");
  EXPECT_FALSE(Exists(Path("d")));

  fs_.Reset();
  CKPT_EXPECT_OK(fs_.Stat(path).status());
  EXPECT_EQ(fs_.injected(), 0);
}

TEST_F(FaultInjectionTest, FailAllAfterFailsLaterMutatingOpsOnly) {
  const auto kFull = absl::StatusCode::kResourceExhausted;
  CKPT_ASSERT_OK(base_->WriteFileAndSync(Path("old"), "old"));
  fs_.FailAllAfter(StorageOp::kWrite, 2, absl::ResourceExhaustedError("full"));
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs_.Open(Path("f"), OpenMode::kCreateNew));
  CKPT_ASSERT_OK(f->PWrite(0, "1"));
  EXPECT_THAT(f->PWrite(1, "2"),
              StatusIs(kFull, "pwrite " + Path("f") + ": full"));
  EXPECT_THAT(f->PWrite(1, "2"), StatusIs(kFull, "full"));
  EXPECT_THAT(f->Sync(), StatusIs(kFull, "injected fault: fsync " + Path("f")));
  EXPECT_THAT(fs_.CreateDir(Path("d")), StatusIs(kFull, "mkdir"));
  EXPECT_THAT(fs_.SyncDir(dir_), StatusIs(kFull, "fsync"));
  EXPECT_THAT(fs_.Open(Path("g"), OpenMode::kCreateNew),
              StatusIs(kFull, "open"));
  EXPECT_THAT(fs_.Open(Path("old"), OpenMode::kReadWrite),
              StatusIs(kFull, "open"));
  EXPECT_THAT(fs_.Rename(Path("old"), Path("new")), StatusIs(kFull, "rename"));
  EXPECT_THAT(fs_.RemoveFile(Path("old")), StatusIs(kFull, "unlink"));
  // Looking still works.
  CKPT_EXPECT_OK(f->Close());
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs_.ReadFile(Path("f")));
  EXPECT_EQ(back, "1");
  CKPT_EXPECT_OK(fs_.List(dir_).status());
  CKPT_EXPECT_OK(fs_.Stat(Path("old")).status());
  EXPECT_EQ(fs_.injected(), 9);
}

TEST_F(FaultInjectionTest, PathFilterCountsOnlyMatchingCalls) {
  fs_.OnlyPathsContaining("shard-00001");
  fs_.FailAt(StorageOp::kWrite, 2, Boom());
  CKPT_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<File> a,
      fs_.Open(Path("shard-00000"), OpenMode::kCreateNew));
  CKPT_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<File> b,
      fs_.Open(Path("shard-00001"), OpenMode::kCreateNew));
  CKPT_EXPECT_OK(a->PWrite(0, "a"));
  CKPT_EXPECT_OK(b->PWrite(0, "b"));
  CKPT_EXPECT_OK(a->PWrite(1, "a"));
  CKPT_EXPECT_OK(a->PWrite(2, "a"));
  EXPECT_THAT(b->PWrite(1, "b"),
              StatusIs(kInternal, "pwrite " + Path("shard-00001")));
  CKPT_EXPECT_OK(a->PWrite(3, "a"));
  EXPECT_EQ(fs_.count(StorageOp::kWrite), 6);
  EXPECT_EQ(fs_.injected(), 1);
}

TEST_F(FaultInjectionTest, PathFilterMatchesEitherRenamePath) {
  CKPT_ASSERT_OK(base_->CreateDir(Path("tmp")));
  CKPT_ASSERT_OK(base_->WriteFileAndSync(Path("x"), "x"));
  fs_.OnlyPathsContaining("step-");
  fs_.FailAt(StorageOp::kRename, 1, Boom());
  CKPT_EXPECT_OK(fs_.Rename(Path("x"), Path("y")));
  EXPECT_THAT(fs_.RenameNoReplace(Path("tmp"), Path("step-00000100")),
              StatusIs(kInternal, "step-00000100"));
}

TEST_F(FaultInjectionTest, CrashOnFilteredPathStopsAllPaths) {
  fs_.OnlyPathsContaining("manifest");
  fs_.CrashAt(StorageOp::kOpen, 1);
  CKPT_EXPECT_OK(fs_.WriteFileAndSync(Path("shard"), "s"));
  EXPECT_THAT(fs_.WriteFileAndSync(Path("manifest"), "m"),
              StatusIs(kUnavailable, "open " + Path("manifest")));
  EXPECT_THAT(fs_.Stat(Path("shard")), StatusIs(kUnavailable, "crash"));
}

TEST_F(FaultInjectionTest, CountsEveryCall) {
  CKPT_ASSERT_OK(fs_.CreateDir(Path("d")));
  CKPT_ASSERT_OK(
      fs_.WriteFileAndSync(Path("d/f"), "abc"));       // open write sync close
  CKPT_ASSERT_OK(fs_.ReadFile(Path("d/f")).status());  // open stat read close
  CKPT_ASSERT_OK(fs_.SyncDir(Path("d")));
  CKPT_ASSERT_OK(fs_.Rename(Path("d/f"), Path("d/g")));
  CKPT_ASSERT_OK(fs_.RenameNoReplace(Path("d/g"), Path("d/h")));
  CKPT_ASSERT_OK(fs_.List(Path("d")).status());
  CKPT_ASSERT_OK(fs_.Stat(Path("d/h")).status());
  CKPT_ASSERT_OK(fs_.RemoveFile(Path("d/h")));
  CKPT_ASSERT_OK(fs_.RemoveAll(Path("d")));
  EXPECT_THAT(fs_.Stat(Path("d")), StatusIs(kNotFound, Path("d")));

  EXPECT_EQ(fs_.count(StorageOp::kOpen), 2);
  EXPECT_EQ(fs_.count(StorageOp::kRead), 1);
  EXPECT_EQ(fs_.count(StorageOp::kWrite), 1);
  EXPECT_EQ(fs_.count(StorageOp::kSync), 1);
  EXPECT_EQ(fs_.count(StorageOp::kClose), 2);
  EXPECT_EQ(fs_.count(StorageOp::kCreateDir), 1);
  EXPECT_EQ(fs_.count(StorageOp::kSyncDir), 1);
  EXPECT_EQ(fs_.count(StorageOp::kRename), 2);
  EXPECT_EQ(fs_.count(StorageOp::kList), 1);
  EXPECT_EQ(fs_.count(StorageOp::kStat), 3);
  EXPECT_EQ(fs_.count(StorageOp::kRemove), 2);
  EXPECT_EQ(fs_.injected(), 0);
}

TEST_F(FaultInjectionTest, ResetClearsCountsRulesAndFilter) {
  fs_.OnlyPathsContaining("nothing-matches");
  fs_.FailAt(StorageOp::kStat, 1, Boom());
  fs_.FailAt(StorageOp::kList, 1, Boom());
  CKPT_EXPECT_OK(fs_.Stat(dir_).status());
  EXPECT_EQ(fs_.count(StorageOp::kStat), 1);
  fs_.Reset();
  EXPECT_EQ(fs_.count(StorageOp::kStat), 0);
  CKPT_EXPECT_OK(fs_.List(dir_).status());  // the rule is gone
  fs_.FailAt(StorageOp::kStat, 1, Boom());  // no filter any more
  EXPECT_THAT(fs_.Stat(dir_), StatusIs(kInternal, "boom"));
  EXPECT_EQ(fs_.injected(), 1);
}

TEST_F(FaultInjectionTest, StorageOpNames) {
  EXPECT_STREQ(StorageOpName(StorageOp::kWrite), "write");
  EXPECT_STREQ(StorageOpName(StorageOp::kRemove), "remove");
  std::ostringstream os;
  os << StorageOp::kSyncDir;
  EXPECT_EQ(os.str(), "sync_dir");
}

// Several threads write disjoint ranges of one file through one
// FaultInjectingStorage: every call is numbered exactly once, so exactly one
// write hits the rule and leaves a hole.
TEST_F(FaultInjectionTest, ConcurrentWritesFailExactlyTheNthCall) {
  constexpr int kThreads = 8;
  constexpr int kWritesPerThread = 50;
  constexpr size_t kChunk = 16;
  fs_.FailAt(StorageOp::kWrite, 137, Boom());
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs_.Open(Path("f"), OpenMode::kCreateNew));
  // One extra chunk at the end so the file's size does not depend on
  // which write failed.
  const int kTotal = kThreads * kWritesPerThread;
  CKPT_ASSERT_OK(f->PWrite(kTotal * kChunk, std::string(kChunk, 'E')));

  std::atomic<int> failed_index{-1};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kWritesPerThread; ++i) {
        const int index = t * kWritesPerThread + i;
        absl::Status s =
            f->PWrite(index * kChunk, std::string(kChunk, 'a' + index % 26));
        if (!s.ok()) {
          failures.fetch_add(1);
          failed_index.store(index);
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CKPT_ASSERT_OK(f->Close());

  EXPECT_EQ(failures.load(), 1);
  EXPECT_EQ(fs_.injected(), 1);
  EXPECT_EQ(fs_.count(StorageOp::kWrite), kTotal + 1);
  std::string expected;
  for (int index = 0; index < kTotal; ++index) {
    expected += index == failed_index.load()
                    ? std::string(kChunk, '\0')
                    : std::string(kChunk, 'a' + index % 26);
  }
  expected += std::string(kChunk, 'E');
  EXPECT_EQ(ReadBase(Path("f")), expected);
}

TEST_F(FaultInjectionTest, ConcurrentCrashLetsExactlyTheEarlierCallsThrough) {
  constexpr int kThreads = 8;
  constexpr int kWritesPerThread = 50;
  fs_.CrashAt(StorageOp::kWrite, 100);
  std::atomic<int> ok{0};
  std::atomic<int> crashed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      absl::StatusOr<std::unique_ptr<File>> f =
          fs_.Open(Path(absl::StrCat("shard-", t)), OpenMode::kCreateNew);
      for (int i = 0; i < kWritesPerThread; ++i) {
        if (!f.ok()) {
          if (absl::IsUnavailable(f.status())) crashed.fetch_add(1);
          continue;
        }
        absl::Status s = (*f)->PWrite(i, "x");
        if (s.ok()) {
          ok.fetch_add(1);
        } else if (absl::IsUnavailable(s)) {
          crashed.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(ok.load(), 99);
  EXPECT_EQ(crashed.load(), kThreads * kWritesPerThread - 99);
}

}  // namespace
}  // namespace ckpt

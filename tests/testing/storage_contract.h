// The contract every ckpt::Storage keeps (ckpt/storage.h), as one
// value-parameterized suite: a test binary instantiates it for the storage
// it tests (tests/libckpt/storage_contract_test.cc for POSIX,
// tests/libckpt/s3/s3_storage_test.cc for S3). What a storage may lack by
// its traits (renames, directories of their own) is skipped by trait, with
// the reason; everything else is the same for every storage. Messages are
// checked for the code and the path, not for the wording of one storage.
#ifndef CKPT_TESTS_TESTING_STORAGE_CONTRACT_H_
#define CKPT_TESTS_TESTING_STORAGE_CONTRACT_H_

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/storage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::testing {

// One storage under test with a fresh, empty directory, made for one test
// and destroyed after it (removing what the test left).
class StorageUnderTest {
 public:
  virtual ~StorageUnderTest() = default;
  virtual Storage* storage() = 0;
  virtual const std::string& root() const = 0;
};

struct StorageContractParam {
  std::string name;  // the instantiation's test-name suffix
  // Null when the storage is not available here, with *why set: the test
  // is skipped (a `make` that must not skip, under CI, fails instead).
  std::function<std::unique_ptr<StorageUnderTest>(std::string* why)> make;
};

inline std::string StorageContractName(
    const ::testing::TestParamInfo<StorageContractParam>& info) {
  return info.param.name;
}

class StorageContractTest
    : public ::testing::TestWithParam<StorageContractParam> {
 protected:
  void SetUp() override {
    std::string why;
    env_ = GetParam().make(&why);
    if (env_ == nullptr) GTEST_SKIP() << why;
  }
  Storage* fs() { return env_->storage(); }
  std::string Path(absl::string_view name) const {
    return JoinPath(env_->root(), name);
  }
  StorageTraits traits() { return fs()->traits(env_->root()); }

  std::unique_ptr<StorageUnderTest> env_;
};

inline std::string ContractBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

TEST_P(StorageContractTest, WriteCloseThenReadRoundTrip) {
  const std::string path = Path("f");
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs()->Open(path, OpenMode::kCreateNew));
  EXPECT_EQ(f->path(), path);
  CKPT_ASSERT_OK(f->PWrite(5, " world"));  // out of order
  CKPT_ASSERT_OK(f->PWrite(0, "hello"));
  CKPT_ASSERT_OK(f->Sync());
  CKPT_ASSERT_OK_AND_ASSIGN(uint64_t size, f->Size());
  EXPECT_EQ(size, 11u);
  CKPT_ASSERT_OK(f->Close());
  CKPT_EXPECT_OK(f->Close());  // a second Close is a no-op

  CKPT_ASSERT_OK_AND_ASSIGN(FileInfo info, fs()->Stat(path));
  EXPECT_FALSE(info.is_dir);
  EXPECT_EQ(info.size, 11u);
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> r,
                            fs()->Open(path, OpenMode::kRead));
  CKPT_ASSERT_OK_AND_ASSIGN(size, r->Size());
  EXPECT_EQ(size, 11u);
  std::string buf(11, '\0');
  CKPT_ASSERT_OK_AND_ASSIGN(size_t n, r->PRead(0, buf.size(), buf.data()));
  EXPECT_EQ(n, 11u);
  EXPECT_EQ(buf, "hello world");
  // Short only at the end of the file.
  std::string tail(100, '\0');
  CKPT_ASSERT_OK_AND_ASSIGN(n, r->PRead(6, tail.size(), tail.data()));
  EXPECT_EQ(tail.substr(0, n), "world");
  CKPT_ASSERT_OK_AND_ASSIGN(n, r->PRead(11, tail.size(), tail.data()));
  EXPECT_EQ(n, 0u);
  CKPT_ASSERT_OK_AND_ASSIGN(n, r->PRead(1000, tail.size(), tail.data()));
  EXPECT_EQ(n, 0u);
  CKPT_ASSERT_OK(r->Close());
}

TEST_P(StorageContractTest, ParallelWritesOfALargeFileInAnyOrder) {
  // Large enough for several parts of an object store's multipart upload.
  const std::string data = ContractBytes(12 << 20, 7);
  const size_t kPiece = 256 << 10;
  std::vector<size_t> order;
  for (size_t off = 0; off < data.size(); off += kPiece) order.push_back(off);
  std::shuffle(order.begin(), order.end(), std::mt19937(3));
  const std::string path = Path("large");
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs()->Open(path, OpenMode::kCreateNew));
  std::atomic<size_t> next{0};
  std::vector<absl::Status> errors(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i; (i = next++) < order.size();) {
        const size_t off = order[i];
        absl::Status s =
            f->PWrite(off, absl::string_view(data).substr(off, kPiece));
        if (!s.ok()) errors[t] = s;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : errors) CKPT_ASSERT_OK(s);
  CKPT_ASSERT_OK(f->Sync());
  CKPT_ASSERT_OK(f->Close());
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs()->ReadFile(path));
  EXPECT_TRUE(back == data) << "size " << back.size();
  // A read across pieces is exact.
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> r,
                            fs()->Open(path, OpenMode::kRead));
  std::string mid(3 << 20, '\0');
  CKPT_ASSERT_OK_AND_ASSIGN(size_t n,
                            r->PRead(5000000, mid.size(), mid.data()));
  EXPECT_EQ(n, mid.size());
  EXPECT_TRUE(mid == data.substr(5000000, mid.size()));
}

TEST_P(StorageContractTest, UseAfterCloseIsFailedPrecondition) {
  const std::string path = Path("f");
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs()->Open(path, OpenMode::kCreateNew));
  CKPT_ASSERT_OK(f->Close());
  EXPECT_THAT(f->PWrite(0, "x"),
              StatusIs(absl::StatusCode::kFailedPrecondition, path));
  EXPECT_THAT(f->Sync(), StatusIs(absl::StatusCode::kFailedPrecondition, path));
  EXPECT_THAT(f->Size(), StatusIs(absl::StatusCode::kFailedPrecondition, path));
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> r,
                            fs()->Open(path, OpenMode::kRead));
  CKPT_ASSERT_OK(r->Close());
  char c;
  EXPECT_THAT(r->PRead(0, 1, &c),
              StatusIs(absl::StatusCode::kFailedPrecondition, path));
}

TEST_P(StorageContractTest, WriteFileAndSyncThenReadFile) {
  const std::string path = Path("f");
  const std::string data = ContractBytes(100000, 1);
  CKPT_ASSERT_OK(fs()->WriteFileAndSync(path, data));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs()->ReadFile(path));
  EXPECT_EQ(back, data);
  EXPECT_THAT(fs()->WriteFileAndSync(path, "again"),
              StatusIs(absl::StatusCode::kAlreadyExists, path));
  CKPT_ASSERT_OK(fs()->WriteFileAndSync(Path("empty"), ""));
  CKPT_ASSERT_OK_AND_ASSIGN(back, fs()->ReadFile(Path("empty")));
  EXPECT_EQ(back, "");
}

TEST_P(StorageContractTest, CreateNewOnExistingFileIsAlreadyExists) {
  const std::string path = Path("f");
  CKPT_ASSERT_OK(fs()->WriteFileAndSync(path, "keep"));
  EXPECT_THAT(fs()->Open(path, OpenMode::kCreateNew),
              StatusIs(absl::StatusCode::kAlreadyExists, "open " + path));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs()->ReadFile(path));
  EXPECT_EQ(back, "keep");
}

TEST_P(StorageContractTest, MissingFileIsNotFoundNamingIt) {
  const std::string path = Path("missing");
  EXPECT_THAT(fs()->Open(path, OpenMode::kRead),
              StatusIs(absl::StatusCode::kNotFound, "open " + path));
  EXPECT_THAT(fs()->ReadFile(path),
              StatusIs(absl::StatusCode::kNotFound, path));
  EXPECT_THAT(fs()->Stat(path), StatusIs(absl::StatusCode::kNotFound, path));
  EXPECT_THAT(fs()->RemoveFile(path),
              StatusIs(absl::StatusCode::kNotFound, path));
  EXPECT_THAT(fs()->List(path), StatusIs(absl::StatusCode::kNotFound, path));
  CKPT_EXPECT_OK(fs()->RemoveAll(path));  // OK if it does not exist
}

TEST_P(StorageContractTest, ListIsSortedWithSubdirectories) {
  const std::string sub = Path("sub");
  CKPT_ASSERT_OK(fs()->CreateDir(sub));
  CKPT_ASSERT_OK(fs()->WriteFileAndSync(JoinPath(sub, "inner"), "i"));
  for (const char* n : {"c", "a", "b-2", "b"}) {
    CKPT_ASSERT_OK(fs()->WriteFileAndSync(Path(n), n));
  }
  CKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names,
                            fs()->List(env_->root()));
  EXPECT_THAT(names, ::testing::ElementsAre("a", "b", "b-2", "c", "sub"));
  CKPT_ASSERT_OK_AND_ASSIGN(names, fs()->List(sub));
  EXPECT_THAT(names, ::testing::ElementsAre("inner"));
  CKPT_ASSERT_OK_AND_ASSIGN(FileInfo info, fs()->Stat(sub));
  EXPECT_TRUE(info.is_dir);
}

TEST_P(StorageContractTest, CreateDirOfExistingDirectoryIsAlreadyExists) {
  const std::string d = Path("d");
  CKPT_ASSERT_OK(fs()->CreateDir(d));
  CKPT_ASSERT_OK(fs()->WriteFileAndSync(JoinPath(d, "f"), "x"));
  EXPECT_THAT(fs()->CreateDir(d),
              StatusIs(absl::StatusCode::kAlreadyExists, d));
  CKPT_EXPECT_OK(fs()->SyncDir(d));
}

TEST_P(StorageContractTest, EmptyDirectoryExistsAfterCreateDir) {
  if (!traits().directories) {
    GTEST_SKIP() << "directories are prefixes here (traits().directories): "
                    "an empty one does not exist";
  }
  const std::string d = Path("empty");
  CKPT_ASSERT_OK(fs()->CreateDir(d));
  CKPT_ASSERT_OK_AND_ASSIGN(FileInfo info, fs()->Stat(d));
  EXPECT_TRUE(info.is_dir);
  CKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, fs()->List(d));
  EXPECT_TRUE(names.empty());
  EXPECT_THAT(fs()->CreateDir(d),
              StatusIs(absl::StatusCode::kAlreadyExists, d));
}

TEST_P(StorageContractTest, RemoveFileThenItIsGone) {
  const std::string path = Path("f");
  CKPT_ASSERT_OK(fs()->WriteFileAndSync(path, "x"));
  CKPT_ASSERT_OK(fs()->RemoveFile(path));
  EXPECT_THAT(fs()->Stat(path), StatusIs(absl::StatusCode::kNotFound, ""));
  EXPECT_THAT(fs()->RemoveFile(path),
              StatusIs(absl::StatusCode::kNotFound, ""));
}

TEST_P(StorageContractTest, RemoveAllRemovesATreeAndNothingBeside) {
  const std::string d = Path("d");
  CKPT_ASSERT_OK(fs()->CreateDir(d));
  CKPT_ASSERT_OK(fs()->CreateDir(JoinPath(d, "e")));
  CKPT_ASSERT_OK(fs()->WriteFileAndSync(JoinPath(d, "f"), "1"));
  CKPT_ASSERT_OK(fs()->WriteFileAndSync(JoinPath(JoinPath(d, "e"), "g"), "2"));
  // A sibling whose name starts with the directory's stays.
  CKPT_ASSERT_OK(fs()->WriteFileAndSync(Path("d2"), "3"));
  CKPT_ASSERT_OK(fs()->RemoveAll(d));
  EXPECT_THAT(fs()->Stat(d), StatusIs(absl::StatusCode::kNotFound, ""));
  EXPECT_THAT(fs()->Stat(JoinPath(d, "f")),
              StatusIs(absl::StatusCode::kNotFound, ""));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs()->ReadFile(Path("d2")));
  EXPECT_EQ(back, "3");
}

TEST_P(StorageContractTest, CreateExclusiveCreatesOnce) {
  const std::string path = Path("MANIFEST");
  CKPT_ASSERT_OK(fs()->CreateExclusive(path, "first"));
  EXPECT_THAT(fs()->CreateExclusive(path, "second"),
              StatusIs(absl::StatusCode::kAlreadyExists, path));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs()->ReadFile(path));
  EXPECT_EQ(back, "first");
  CKPT_ASSERT_OK(fs()->CreateExclusive(Path("empty"), ""));
  CKPT_ASSERT_OK_AND_ASSIGN(back, fs()->ReadFile(Path("empty")));
  EXPECT_EQ(back, "");
}

TEST_P(StorageContractTest, CreateExclusiveRaceHasOneWinner) {
  if (!traits().conditional_create) {
    GTEST_SKIP() << "CreateExclusive is emulated here "
                    "(traits().conditional_create): it detects a race, it "
                    "does not exclude one";
  }
  const std::string path = Path("MANIFEST");
  constexpr int kWriters = 6;
  std::vector<absl::Status> results(kWriters);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWriters; ++i) {
    threads.emplace_back([&, i] {
      results[i] = fs()->CreateExclusive(path, absl::StrCat("writer ", i));
    });
  }
  for (std::thread& t : threads) t.join();
  int winner = -1;
  for (int i = 0; i < kWriters; ++i) {
    if (results[i].ok()) {
      EXPECT_EQ(winner, -1) << "two writers created " << path;
      winner = i;
    } else {
      EXPECT_THAT(results[i], StatusIs(absl::StatusCode::kAlreadyExists, path));
    }
  }
  ASSERT_NE(winner, -1);
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs()->ReadFile(path));
  EXPECT_EQ(back, absl::StrCat("writer ", winner));
}

TEST_P(StorageContractTest, ReplaceFileCreatesThenReplacesWhole) {
  const std::string path = Path("latest");
  CKPT_ASSERT_OK(fs()->ReplaceFile(path, "a long first version"));
  CKPT_ASSERT_OK(fs()->ReplaceFile(path, "short"));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs()->ReadFile(path));
  EXPECT_EQ(back, "short");
  CKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names,
                            fs()->List(env_->root()));
  EXPECT_THAT(names, ::testing::ElementsAre("latest"));  // no temporary left
}

TEST_P(StorageContractTest, RenameReplacesAndRenameNoReplaceRefuses) {
  if (!traits().atomic_rename) {
    GTEST_SKIP() << "no rename here (traits().atomic_rename): writers commit "
                    "by CreateExclusive (spec/FORMAT.md §4.3)";
  }
  CKPT_ASSERT_OK(fs()->WriteFileAndSync(Path("a"), "A"));
  CKPT_ASSERT_OK(fs()->WriteFileAndSync(Path("b"), "B"));
  EXPECT_THAT(fs()->RenameNoReplace(Path("a"), Path("b")),
              StatusIs(absl::StatusCode::kAlreadyExists, ""));
  CKPT_ASSERT_OK(fs()->Rename(Path("a"), Path("b")));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs()->ReadFile(Path("b")));
  EXPECT_EQ(back, "A");
  EXPECT_THAT(fs()->Stat(Path("a")), StatusIs(absl::StatusCode::kNotFound, ""));
}

TEST_P(StorageContractTest, LockWorksOrIsUnimplemented) {
  auto lock = fs()->Lock(Path(".lock"), LockMode::kExclusive, false);
  if (absl::IsUnimplemented(lock.status())) {
    GTEST_SKIP() << "no locks here: " << lock.status();
  }
  CKPT_ASSERT_OK(lock.status());
  EXPECT_THAT(fs()->Lock(Path(".lock"), LockMode::kShared, false),
              StatusIs(absl::StatusCode::kUnavailable, ""));
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_STORAGE_CONTRACT_H_

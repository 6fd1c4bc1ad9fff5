#include "ckpt/storage.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/posix_storage.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A fresh directory under `parent`, or "" if it cannot be made.
std::string MakeTempDir(const std::string& parent) {
  std::string tmpl = JoinPath(parent, "ckpt-storage-test-XXXXXX");
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) return "";
  return std::string(buf.data());
}

class StorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir(::testing::TempDir());
    ASSERT_FALSE(dir_.empty()) << std::strerror(errno);
  }
  void TearDown() override {
    if (!dir_.empty()) {
      CKPT_EXPECT_OK(fs_->RemoveAll(dir_));
    }
  }
  std::string Path(absl::string_view name) const {
    return JoinPath(dir_, name);
  }

  Storage* const fs_ = DefaultStorage();
  std::string dir_;
};

TEST_F(StorageTest, WriteReadSizeRoundTrip) {
  const std::string path = Path("f");
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs_->Open(path, OpenMode::kCreateNew));
  EXPECT_EQ(f->path(), path);
  CKPT_ASSERT_OK(f->PWrite(0, "hello"));
  CKPT_ASSERT_OK(f->PWrite(5, " world"));
  CKPT_ASSERT_OK(f->Sync());
  CKPT_ASSERT_OK_AND_ASSIGN(uint64_t size, f->Size());
  EXPECT_EQ(size, 11u);

  std::string buf(11, '\0');
  CKPT_ASSERT_OK_AND_ASSIGN(size_t n, f->PRead(0, buf.size(), buf.data()));
  EXPECT_EQ(n, 11u);
  EXPECT_EQ(buf, "hello world");
  // A read past the end is short, not an error.
  std::string tail(100, '\0');
  CKPT_ASSERT_OK_AND_ASSIGN(n, f->PRead(6, tail.size(), tail.data()));
  EXPECT_EQ(tail.substr(0, n), "world");
  CKPT_ASSERT_OK_AND_ASSIGN(n, f->PRead(1000, tail.size(), tail.data()));
  EXPECT_EQ(n, 0u);
  CKPT_ASSERT_OK(f->Close());
  CKPT_EXPECT_OK(f->Close());  // a second Close is a no-op

  CKPT_ASSERT_OK_AND_ASSIGN(FileInfo info, fs_->Stat(path));
  EXPECT_FALSE(info.is_dir);
  EXPECT_EQ(info.size, 11u);
  CKPT_ASSERT_OK_AND_ASSIGN(std::string contents, fs_->ReadFile(path));
  EXPECT_EQ(contents, "hello world");
}

TEST_F(StorageTest, UseAfterCloseIsFailedPrecondition) {
  const std::string path = Path("f");
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs_->Open(path, OpenMode::kCreateNew));
  CKPT_ASSERT_OK(f->Close());
  EXPECT_THAT(f->PWrite(0, "x"), StatusIs(absl::StatusCode::kFailedPrecondition,
                                          "pwrite " + path));
  char c;
  EXPECT_THAT(f->PRead(0, 1, &c),
              StatusIs(absl::StatusCode::kFailedPrecondition, "pread " + path));
  EXPECT_THAT(f->Sync(), StatusIs(absl::StatusCode::kFailedPrecondition, path));
  EXPECT_THAT(f->Size(), StatusIs(absl::StatusCode::kFailedPrecondition, path));
}

TEST_F(StorageTest, WriteFileAndSyncThenReadFile) {
  const std::string path = Path("f");
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(path, data));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs_->ReadFile(path));
  EXPECT_EQ(back, data);
  EXPECT_THAT(fs_->WriteFileAndSync(path, "again"),
              StatusIs(absl::StatusCode::kAlreadyExists, path));
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(Path("empty"), ""));
  CKPT_ASSERT_OK_AND_ASSIGN(back, fs_->ReadFile(Path("empty")));
  EXPECT_EQ(back, "");
}

TEST_F(StorageTest, CreateNewOnExistingFileIsAlreadyExists) {
  const std::string path = Path("f");
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(path, "keep"));
  EXPECT_THAT(fs_->Open(path, OpenMode::kCreateNew),
              StatusIs(absl::StatusCode::kAlreadyExists, "open " + path + ":"));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs_->ReadFile(path));
  EXPECT_EQ(back, "keep");
}

TEST_F(StorageTest, OpenMissingIsNotFoundWithPath) {
  const std::string path = Path("missing");
  EXPECT_THAT(fs_->Open(path, OpenMode::kRead),
              StatusIs(absl::StatusCode::kNotFound,
                       "open " + path + ": No such file or directory"));
  EXPECT_THAT(fs_->Open(path, OpenMode::kReadWrite),
              StatusIs(absl::StatusCode::kNotFound, path));
  EXPECT_THAT(fs_->ReadFile(path), StatusIs(absl::StatusCode::kNotFound, path));
}

TEST_F(StorageTest, ReadWriteModeUpdatesExistingFile) {
  const std::string path = Path("f");
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(path, "abcdef"));
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs_->Open(path, OpenMode::kReadWrite));
  CKPT_ASSERT_OK(f->PWrite(2, "XY"));
  CKPT_ASSERT_OK(f->Close());
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs_->ReadFile(path));
  EXPECT_EQ(back, "abXYef");
}

TEST_F(StorageTest, WriteToReadOnlyFileFailsWithOffset) {
  const std::string path = Path("f");
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(path, "abc"));
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs_->Open(path, OpenMode::kRead));
  EXPECT_THAT(f->PWrite(4096, "x"),
              StatusIs(absl::StatusCode::kInternal,
                       "pwrite " + path + " at offset 4096 (1 bytes): "));
}

TEST_F(StorageTest, CreateDirTwiceIsAlreadyExists) {
  const std::string path = Path("d");
  CKPT_ASSERT_OK(fs_->CreateDir(path));
  CKPT_ASSERT_OK_AND_ASSIGN(FileInfo info, fs_->Stat(path));
  EXPECT_TRUE(info.is_dir);
  EXPECT_THAT(fs_->CreateDir(path),
              StatusIs(absl::StatusCode::kAlreadyExists, "mkdir " + path));
  EXPECT_THAT(fs_->CreateDir(Path("no/such/parent")),
              StatusIs(absl::StatusCode::kNotFound, "no/such/parent"));
}

TEST_F(StorageTest, SyncDir) {
  CKPT_EXPECT_OK(fs_->SyncDir(dir_));
  EXPECT_THAT(fs_->SyncDir(Path("missing")),
              StatusIs(absl::StatusCode::kNotFound, Path("missing")));
}

TEST_F(StorageTest, RenameReplacesExistingFile) {
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(Path("a"), "new"));
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(Path("b"), "old"));
  CKPT_ASSERT_OK(fs_->Rename(Path("a"), Path("b")));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs_->ReadFile(Path("b")));
  EXPECT_EQ(back, "new");
  EXPECT_THAT(fs_->Stat(Path("a")), StatusIs(absl::StatusCode::kNotFound, ""));
  EXPECT_THAT(fs_->Rename(Path("a"), Path("c")),
              StatusIs(absl::StatusCode::kNotFound,
                       "rename " + Path("a") + " to " + Path("c")));
}

TEST_F(StorageTest, RenameNoReplaceRefusesExistingTarget) {
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(Path("a"), "new"));
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(Path("b"), "old"));
  EXPECT_THAT(fs_->RenameNoReplace(Path("a"), Path("b")),
              StatusIs(absl::StatusCode::kAlreadyExists, Path("b")));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs_->ReadFile(Path("b")));
  EXPECT_EQ(back, "old");
  CKPT_ASSERT_OK_AND_ASSIGN(back, fs_->ReadFile(Path("a")));
  EXPECT_EQ(back, "new");

  // The commit case: an empty directory is a target too (rename(2) would
  // replace it).
  CKPT_ASSERT_OK(fs_->CreateDir(Path("tmp")));
  CKPT_ASSERT_OK(fs_->CreateDir(Path("step")));
  EXPECT_THAT(fs_->RenameNoReplace(Path("tmp"), Path("step")),
              StatusIs(absl::StatusCode::kAlreadyExists, Path("step")));
}

TEST_F(StorageTest, RenameNoReplaceMovesDirectory) {
  CKPT_ASSERT_OK(fs_->CreateDir(Path("tmp")));
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(Path("tmp/x"), "x"));
  CKPT_ASSERT_OK(fs_->RenameNoReplace(Path("tmp"), Path("step")));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs_->ReadFile(Path("step/x")));
  EXPECT_EQ(back, "x");
  EXPECT_THAT(fs_->Stat(Path("tmp")),
              StatusIs(absl::StatusCode::kNotFound, ""));
}

TEST_F(StorageTest, RenameNoReplaceFallbackWithoutRenameat2) {
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(Path("a"), "new"));
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(Path("b"), "old"));
  EXPECT_THAT(internal::RenameNoReplaceWithoutRenameat2(Path("a"), Path("b")),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       "rename " + Path("a") + " to " + Path("b")));
  CKPT_ASSERT_OK(
      internal::RenameNoReplaceWithoutRenameat2(Path("a"), Path("c")));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs_->ReadFile(Path("c")));
  EXPECT_EQ(back, "new");
  EXPECT_THAT(internal::RenameNoReplaceWithoutRenameat2(Path("a"), Path("d")),
              StatusIs(absl::StatusCode::kNotFound, Path("a")));
}

TEST_F(StorageTest, ListIsSorted) {
  for (const char* name : {"b", "a", "c10", "c9"}) {
    CKPT_ASSERT_OK(fs_->WriteFileAndSync(Path(name), name));
  }
  CKPT_ASSERT_OK(fs_->CreateDir(Path("d")));
  CKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, fs_->List(dir_));
  EXPECT_THAT(names, ElementsAre("a", "b", "c10", "c9", "d"));
  CKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> empty,
                            fs_->List(Path("d")));
  EXPECT_TRUE(empty.empty());
  EXPECT_THAT(fs_->List(Path("missing")),
              StatusIs(absl::StatusCode::kNotFound, Path("missing")));
}

TEST_F(StorageTest, StatMissingIsNotFound) {
  EXPECT_THAT(fs_->Stat(Path("missing")),
              StatusIs(absl::StatusCode::kNotFound, "stat " + Path("missing")));
}

TEST_F(StorageTest, RemoveFile) {
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(Path("f"), "x"));
  CKPT_ASSERT_OK(fs_->RemoveFile(Path("f")));
  EXPECT_THAT(fs_->Stat(Path("f")), StatusIs(absl::StatusCode::kNotFound, ""));
  EXPECT_THAT(fs_->RemoveFile(Path("f")),
              StatusIs(absl::StatusCode::kNotFound, "unlink " + Path("f")));
}

TEST_F(StorageTest, RemoveAllRemovesTreeButNotSymlinkTargets) {
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(Path("outside"), "keep"));
  CKPT_ASSERT_OK(fs_->CreateDir(Path("t")));
  CKPT_ASSERT_OK(fs_->CreateDir(Path("t/a")));
  CKPT_ASSERT_OK(fs_->CreateDir(Path("t/a/b")));
  CKPT_ASSERT_OK(fs_->CreateDir(Path("t/empty")));
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(Path("t/f"), "1"));
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(Path("t/a/b/g"), "2"));
  ASSERT_EQ(::symlink(Path("outside").c_str(), Path("t/link").c_str()), 0);
  ASSERT_EQ(::symlink(dir_.c_str(), Path("t/a/dirlink").c_str()), 0);

  CKPT_ASSERT_OK(fs_->RemoveAll(Path("t")));
  EXPECT_THAT(fs_->Stat(Path("t")), StatusIs(absl::StatusCode::kNotFound, ""));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs_->ReadFile(Path("outside")));
  EXPECT_EQ(back, "keep");
  // Missing is fine; so is a plain file.
  CKPT_EXPECT_OK(fs_->RemoveAll(Path("t")));
  CKPT_EXPECT_OK(fs_->RemoveAll(Path("outside")));
  CKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, fs_->List(dir_));
  EXPECT_THAT(names, ::testing::IsEmpty());
}

TEST_F(StorageTest, PermissionDeniedNamesPath) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "running as root: permission bits are not enforced, so "
                    "EACCES cannot be provoked";
  }
  const std::string locked = Path("locked");
  CKPT_ASSERT_OK(fs_->CreateDir(locked));
  ASSERT_EQ(::chmod(locked.c_str(), 0), 0);
  const std::string path = JoinPath(locked, "f");
  EXPECT_THAT(fs_->Open(path, OpenMode::kCreateNew),
              StatusIs(absl::StatusCode::kPermissionDenied, "open " + path));
  EXPECT_THAT(fs_->List(locked),
              StatusIs(absl::StatusCode::kPermissionDenied, locked));
  ASSERT_EQ(::chmod(locked.c_str(), 0755), 0);
}

// Runs in a child process because it lowers RLIMIT_FSIZE and ignores
// SIGXFSZ (without which the process would be killed: the library installs
// no signal handlers). The child reports "<code> <message>" through a pipe.
TEST_F(StorageTest, FileTooLargeIsResourceExhausted) {
  const std::string path = Path("big");
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl;
    ::getrlimit(RLIMIT_FSIZE, &rl);
    rl.rlim_cur = 4096;
    if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) ::_exit(2);
    absl::Status s;
    auto f = DefaultStorage()->Open(path, OpenMode::kCreateNew);
    if (!f.ok()) {
      s = f.status();
    } else {
      s = (*f)->PWrite(0, std::string(8192, 'x'));
    }
    std::string report =
        absl::StrCat(static_cast<int>(s.code()), " ", s.message());
    if (::write(fds[1], report.data(), report.size()) < 0) ::_exit(3);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string report;
  char buf[512];
  ssize_t r;
  while ((r = ::read(fds[0], buf, sizeof(buf))) > 0) report.append(buf, r);
  ::close(fds[0]);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus))
      << "child killed by signal " << WTERMSIG(wstatus);
  ASSERT_EQ(WEXITSTATUS(wstatus), 0);

  std::istringstream in(report);
  int code = -1;
  in >> code;
  std::string message;
  std::getline(in, message);
  EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kResourceExhausted))
      << report;
  EXPECT_THAT(message,
              HasSubstr("pwrite " + path + " at offset 0 (8192 bytes)"));
  EXPECT_THAT(message, HasSubstr(std::strerror(EFBIG)));
  // The write stopped at the limit.
  CKPT_ASSERT_OK_AND_ASSIGN(FileInfo info, fs_->Stat(path));
  EXPECT_EQ(info.size, 4096u);
}

TEST(StorageErrnoTest, MapsCodes) {
  using C = absl::StatusCode;
  const std::vector<std::pair<int, C>> cases = {
      {ENOENT, C::kNotFound},
      {EEXIST, C::kAlreadyExists},
      {ENOTEMPTY, C::kAlreadyExists},
      {EACCES, C::kPermissionDenied},
      {EPERM, C::kPermissionDenied},
      {ENOSPC, C::kResourceExhausted},
      {EDQUOT, C::kResourceExhausted},
      {EFBIG, C::kResourceExhausted},
      {EIO, C::kInternal},
      {EBADF, C::kInternal},
  };
  for (const auto& [err, code] : cases) {
    EXPECT_THAT(internal::ErrnoToStatus(err, "op /p"),
                StatusIs(code, absl::StrCat("op /p: ", std::strerror(err))))
        << err;
  }
}

TEST(StorageJoinPathTest, Joins) {
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("/a/", "b"), "/a/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
  EXPECT_EQ(JoinPath("a", ""), "a/");
  EXPECT_EQ(JoinPath("a/..", "./b"), "a/.././b");  // no normalisation
}

TEST(DefaultStorageTest, IsOneObject) {
  EXPECT_NE(DefaultStorage(), nullptr);
  EXPECT_EQ(DefaultStorage(), DefaultStorage());
}

// Direct I/O on a disk file system (/tmp) and on tmpfs (/dev/shm, where
// older kernels have no O_DIRECT and Open must fall back silently).
class StorageDirectIoTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    struct stat st;
    if (::stat(GetParam(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      GTEST_SKIP() << GetParam() << " does not exist";
    }
    dir_ = MakeTempDir(GetParam());
    ASSERT_FALSE(dir_.empty()) << std::strerror(errno);
  }
  void TearDown() override {
    if (!dir_.empty()) {
      CKPT_EXPECT_OK(fs_->RemoveAll(dir_));
    }
  }

  Storage* const fs_ = DefaultStorage();
  std::string dir_;
};

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};
std::unique_ptr<char, FreeDeleter> AlignedBuffer(size_t n) {
  void* p = nullptr;
  if (::posix_memalign(&p, 4096, n) != 0) return nullptr;
  return std::unique_ptr<char, FreeDeleter>(static_cast<char*>(p));
}

// Whether this process holds a descriptor for `path` opened with O_DIRECT.
bool HasDirectDescriptor(const std::string& path) {
  for (int fd = 0; fd < 1024; ++fd) {
    char target[4096];
    std::string link = absl::StrCat("/proc/self/fd/", fd);
    ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
    if (n < 0 || std::string(target, n) != path) continue;
    std::ifstream info(absl::StrCat("/proc/self/fdinfo/", fd));
    std::string key;
    while (info >> key) {
      if (key == "flags:") {
        std::string octal;
        info >> octal;
        if (std::strtol(octal.c_str(), nullptr, 8) & O_DIRECT) return true;
      }
    }
  }
  return false;
}

TEST_P(StorageDirectIoTest, AlignedAndUnalignedWritesRoundTrip) {
  const std::string path = JoinPath(dir_, "f");
  OpenOptions options;
  options.direct = true;
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs_->Open(path, OpenMode::kCreateNew, options));

  // O_DIRECT is used whenever the file system takes it.
  int probe = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (probe >= 0) {
    ::close(probe);
    EXPECT_TRUE(HasDirectDescriptor(path));
  }

  constexpr size_t kSize = 3 * 4096;
  auto buf = AlignedBuffer(kSize + 4096);
  ASSERT_NE(buf, nullptr);
  std::string expected(kSize, '\0');
  for (size_t i = 0; i < kSize; ++i) expected[i] = static_cast<char>(i % 251);
  std::memcpy(buf.get(), expected.data(), kSize);

  // Aligned: offset, length and address.
  CKPT_ASSERT_OK(f->PWrite(0, absl::string_view(buf.get(), kSize)));
  // Unaligned offset and length, from an unaligned address.
  std::string patch(1000, 'p');
  std::memcpy(buf.get() + 4096 + 1, patch.data(), patch.size());
  CKPT_ASSERT_OK(f->PWrite(100, absl::string_view(buf.get() + 4096 + 1, 1000)));
  expected.replace(100, 1000, patch);
  // Aligned offset and length but an unaligned address.
  std::string page(4096, 'q');
  std::string unaligned = "?" + page;
  CKPT_ASSERT_OK(f->PWrite(4096, absl::string_view(unaligned).substr(1)));
  expected.replace(4096, 4096, page);
  // An unaligned tail makes the size unaligned.
  CKPT_ASSERT_OK(f->PWrite(kSize, "tail"));
  expected += "tail";
  CKPT_ASSERT_OK(f->Sync());

  // Aligned read that runs past the end: the direct read stops at EOF and
  // the unaligned rest is read through the buffered descriptor.
  auto rbuf = AlignedBuffer(kSize + 4096);
  ASSERT_NE(rbuf, nullptr);
  CKPT_ASSERT_OK_AND_ASSIGN(size_t n, f->PRead(0, kSize + 4096, rbuf.get()));
  ASSERT_EQ(n, expected.size());
  EXPECT_EQ(std::string(rbuf.get(), n), expected);
  // Unaligned read.
  std::string some(777, '\0');
  CKPT_ASSERT_OK_AND_ASSIGN(n, f->PRead(33, some.size(), some.data()));
  ASSERT_EQ(n, some.size());
  EXPECT_EQ(some, expected.substr(33, 777));
  CKPT_ASSERT_OK(f->Close());

  CKPT_ASSERT_OK_AND_ASSIGN(std::string back, fs_->ReadFile(path));
  EXPECT_EQ(back, expected);
}

TEST_P(StorageDirectIoTest, DirectReadOfExistingFile) {
  const std::string path = JoinPath(dir_, "f");
  std::string data(8192 + 10, 'd');
  CKPT_ASSERT_OK(fs_->WriteFileAndSync(path, data));
  OpenOptions options;
  options.direct = true;
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs_->Open(path, OpenMode::kRead, options));
  auto buf = AlignedBuffer(16384);
  ASSERT_NE(buf, nullptr);
  CKPT_ASSERT_OK_AND_ASSIGN(size_t n, f->PRead(4096, 8192, buf.get()));
  ASSERT_EQ(n, 4106u);
  EXPECT_EQ(std::string(buf.get(), n), data.substr(4096));
}

INSTANTIATE_TEST_SUITE_P(FileSystems, StorageDirectIoTest,
                         ::testing::Values("/tmp", "/dev/shm"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.param) == "/tmp" ? "Tmp"
                                                                 : "DevShm";
                         });

}  // namespace
}  // namespace ckpt

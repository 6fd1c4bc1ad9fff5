// Untrusted checkpoints (SECURITY.md): files of the wrong kind where a
// checkpoint has its files. Each load runs in a forked child with a time
// limit, so that a load that blocks fails the test instead of hanging it.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "reliability/model.h"
#include "testing/status_matchers.h"

namespace ckpt::reliability {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::TempDir;

constexpr int kScale = 1;

// Exit codes of the child.
constexpr int kLoadedExactly = 0;
constexpr int kCleanError = 1;
constexpr int kWrongData = 2;

// Runs VerifyCheckpoint(path) in a child process; returns its exit code,
// or -1 if it did not finish within `limit`.
int VerifyInChild(const std::string& path, std::chrono::milliseconds limit) {
  const pid_t pid = fork();
  if (pid == 0) {
    auto got = VerifyCheckpoint(path, kScale);
    _exit(got.ok()                    ? kLoadedExactly
          : IsWrongData(got.status()) ? kWrongData
                                      : kCleanError);
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -2;
}

class ReliabilitySecurity : public ::testing::Test {
 protected:
  void SetUp() override {
    SaveConfig c;
    c.scale = kScale;
    CKPT_ASSERT_OK_AND_ASSIGN(auto state, RankState::Create(nullptr, kScale));
    ASSERT_THAT(state->Save(root_, 1, c), IsOk());
    ASSERT_EQ(VerifyInChild(root_, std::chrono::seconds(20)), kLoadedExactly);
  }
  // Replaces `name` in the checkpoint directory by a FIFO.
  void MakeFifo(const std::string& name) {
    const std::string p =
        JoinPath(JoinPath(root_, format::StepDirName(1)), name);
    std::filesystem::remove(p);
    ASSERT_EQ(mkfifo(p.c_str(), 0644), 0);
  }

  TempDir dir_;
  std::string root_ = dir_ / "root";
};

// A shard file of the right name and the wrong kind is a clean error, never
// wrong data.
TEST_F(ReliabilitySecurity, DirectoryInPlaceOfAShardFileIsACleanError) {
  const std::string p =
      JoinPath(JoinPath(root_, format::StepDirName(1)), "shard-00000.ckpt");
  std::filesystem::remove(p);
  std::filesystem::create_directory(p);
  EXPECT_EQ(VerifyInChild(root_, std::chrono::seconds(20)), kCleanError);
}

// A FIFO named like a shard file or MANIFEST (from an untrusted archive, say)
// must fail the load, not block it forever in open(2).
// (libckpt/storage/posix_storage.cc opens with O_NONBLOCK and refuses anything
// but a regular file.)
TEST_F(ReliabilitySecurity, FifoInPlaceOfAShardFileFailsInsteadOfBlocking) {
  MakeFifo("shard-00000.ckpt");
  EXPECT_EQ(VerifyInChild(root_, std::chrono::seconds(5)), kCleanError);
}

TEST_F(ReliabilitySecurity, FifoInPlaceOfTheManifestFailsInsteadOfBlocking) {
  MakeFifo("MANIFEST");
  EXPECT_EQ(VerifyInChild(root_, std::chrono::seconds(5)), kCleanError);
}

}  // namespace
}  // namespace ckpt::reliability

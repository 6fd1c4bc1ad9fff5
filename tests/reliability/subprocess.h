// Child processes for the reliability tests: start ckpt_crash_writer with
// its output in files, kill it, wait for it.
#ifndef CKPT_TESTS_RELIABILITY_SUBPROCESS_H_
#define CKPT_TESTS_RELIABILITY_SUBPROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "libckpt/test_util.h"
#include "testing/files.h"

extern char** environ;

namespace ckpt::reliability {

#ifdef CKPT_CRASH_WRITER
// The writer program, built next to the tests (see CMakeLists.txt).
inline std::string CrashWriterPath() { return CKPT_CRASH_WRITER; }
#endif

using ::ckpt::testing::EnvOr;  // libckpt/test_util.h

class Child {
 public:
  // Starts `argv` (argv[0] is the program path) with stdout and stderr in
  // `out_prefix`.out and `out_prefix`.err.
  static absl::StatusOr<Child> Start(const std::vector<std::string>& argv,
                                     const std::string& out_prefix) {
    Child c;
    c.out_ = out_prefix + ".out";
    c.err_ = out_prefix + ".err";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, c.out_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, c.err_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<char*> args;
    for (const std::string& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    int rc = posix_spawn(&c.pid_, argv[0].c_str(), &fa, nullptr, args.data(),
                         environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      return absl::InternalError(
          absl::StrCat("posix_spawn ", argv[0], ": ", std::strerror(rc)));
    }
    return c;
  }

  Child() = default;
  Child(Child&& o) noexcept { *this = std::move(o); }
  Child& operator=(Child&& o) noexcept {
    pid_ = o.pid_;
    out_ = std::move(o.out_);
    err_ = std::move(o.err_);
    o.pid_ = -1;
    return *this;
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int st;
      waitpid(pid_, &st, 0);
    }
  }

  // SIGKILL, then waits. Returns the wait status.
  int Kill() {
    kill(pid_, SIGKILL);
    return Wait();
  }
  // Waits for the child to end; returns the wait status (as waitpid's).
  int Wait() {
    int st = 0;
    while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return st;
  }

  std::string Stdout() const { return ::ckpt::testing::ReadFileBytes(out_); }
  std::string Stderr() const { return ::ckpt::testing::ReadFileBytes(err_); }
  // The steps of the "saved N" lines printed so far.
  std::vector<uint64_t> SavedSteps() const {
    std::vector<uint64_t> out;
    for (absl::string_view line : absl::StrSplit(Stdout(), '\n')) {
      uint64_t step;
      if (absl::ConsumePrefix(&line, "saved ") &&
          absl::SimpleAtoi(line, &step)) {
        out.push_back(step);
      }
    }
    return out;
  }

 private:
  pid_t pid_ = -1;
  std::string out_, err_;
};

// "exited with 2", "killed by signal 9".
inline std::string DescribeWaitStatus(int st) {
  if (WIFEXITED(st)) return absl::StrCat("exited with ", WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return absl::StrCat("killed by signal ", WTERMSIG(st));
  return absl::StrCat("wait status ", st);
}

}  // namespace ckpt::reliability

#endif  // CKPT_TESTS_RELIABILITY_SUBPROCESS_H_

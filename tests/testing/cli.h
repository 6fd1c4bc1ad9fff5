// Runs a program (a tool binary under test) to completion and captures its
// exit code, stdout, stderr and peak memory: the one runner of the CLI
// tests (tests/tools/*/..._cli_test.cc).
#ifndef CKPT_TESTS_TESTING_CLI_H_
#define CKPT_TESTS_TESTING_CLI_H_

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "testing/files.h"

extern char** environ;

namespace ckpt::testing {

struct CliResult {
  // The exit status, 128 + the signal if a signal ended it, -1 if it could
  // not be started (then `err` says why).
  int exit_code = -1;
  std::string out, err;
  uint64_t max_rss_bytes = 0;  // peak resident set of the child
};

// Runs `binary args...` (no shell: arguments are passed as they are) with
// stdin from /dev/null and stdout and stderr sent to files in `scratch`,
// which must exist; those files are left there.
inline CliResult RunCli(const std::string& binary,
                        const std::vector<std::string>& args,
                        const std::string& scratch) {
  CliResult r;
  const std::string out_path = scratch + "/cli.stdout",
                    err_path = scratch + "/cli.stderr";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> all = {binary};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  const int rc =
      posix_spawn(&pid, binary.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    r.err = "posix_spawn " + binary + ": " + std::strerror(rc);
    return r;
  }
  int status = 0;
  struct rusage usage = {};
  while (wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  r.max_rss_bytes =
      static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // KiB on Linux
  r.exit_code =
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFileBytes(out_path);
  r.err = ReadFileBytes(err_path);
  return r;
}

// Whether this build runs under a sanitizer that reserves terabytes of
// address space (ASan, TSan, MSan): a limit on the address space cannot
// be applied to its binaries.
inline constexpr bool kSanitizerReservesAddressSpace =
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
    true;
#else
    false;
#endif
#else
    false;
#endif

// RunCli under an address-space limit of `limit_bytes` (bash's ulimit -v,
// i.e. RLIMIT_AS): the resource-bound tests of hostile inputs (issue 28,
// SECURITY.md "Resource use"), where an allocation past what the files on
// disk justify fails and must be reported, not crash. One malloc arena
// (MALLOC_ARENA_MAX=1): glibc reserves 64 MiB of address space for each of
// up to 8 arenas a core, which the limit would count though it is no
// memory (a tool with a thread per core of a large machine). REQUIRES:
// !kSanitizerReservesAddressSpace (those tests skip).
inline CliResult RunCliUnderMemoryLimit(const std::string& binary,
                                        const std::vector<std::string>& args,
                                        const std::string& scratch,
                                        uint64_t limit_bytes) {
  std::vector<std::string> sh = {
      "-c",
      "ulimit -v " + std::to_string(limit_bytes / 1024) +
          " && export MALLOC_ARENA_MAX=1 && exec \"$@\"",
      "ulimit", binary};
  sh.insert(sh.end(), args.begin(), args.end());
  return RunCli("/bin/sh", sh, scratch);
}

// The Python interpreter the tests run scripts with: the project's
// .venv/bin/python (CKPT_TEST_PYTHON, tests/CMakeLists.txt), where torch,
// safetensors and h5py are installed; "" when the build found none (the
// tests that need it then skip, saying so).
inline std::string TestPython() {
  const std::string py = CKPT_TEST_PYTHON;
  if (py.empty() || py.find("NOTFOUND") != std::string::npos) return "";
  return access(py.c_str(), X_OK) == 0 ? py : "";
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_CLI_H_

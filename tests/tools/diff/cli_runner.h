// Runs a tool binary and captures its exit code, stdout and stderr, for the
// tests that pin the tools' output against tests/tools/expected/.
#ifndef CKPT_TESTS_TOOLS_DIFF_CLI_RUNNER_H_
#define CKPT_TESTS_TOOLS_DIFF_CLI_RUNNER_H_

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "tests/tools/diff/fixtures.h"

extern char** environ;

namespace ckpt::testing {

struct CliResult {
  int exit_code = -1;
  std::string out, err;
  uint64_t max_rss_bytes = 0;  // peak resident set of the child
};

// Runs `binary args...` with stdout and stderr sent to files in `scratch`.
inline CliResult RunCli(const std::string& binary, const std::vector<std::string>& args,
                        const std::string& scratch) {
  CliResult r;
  const std::string out_path = scratch + "/cli.stdout", err_path = scratch + "/cli.stderr";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::vector<std::string> all = {binary};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  if (posix_spawn(&pid, binary.c_str(), &fa, nullptr, argv.data(), environ) != 0) {
    posix_spawn_file_actions_destroy(&fa);
    r.err = "posix_spawn failed for " + binary;
    return r;
  }
  posix_spawn_file_actions_destroy(&fa);
  int status = 0;
  struct rusage usage = {};
  wait4(pid, &status, 0, &usage);
  r.max_rss_bytes = static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // KiB on Linux
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFileBytes(out_path);
  r.err = ReadFileBytes(err_path);
  return r;
}

// Replaces run-specific text: the temporary directory becomes <TMP>.
inline std::string Scrub(const std::string& text, const std::string& tmp) {
  return absl::StrReplaceAll(text, {{tmp, "<TMP>"}});
}

// The expected-output file tests/tools/expected/<tool>/<name>.txt.
inline std::string Expected(const std::string& tool, const std::string& name) {
  return ReadFileBytes(std::string(CKPT_SOURCE_DIR) + "/tests/tools/expected/" + tool + "/" +
                       name + ".txt");
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TOOLS_DIFF_CLI_RUNNER_H_

// Helpers of the tests that pin the tools' output against
// tests/tools/expected/ (RunCli itself is in tests/testing/cli.h).
#ifndef CKPT_TESTS_TOOLS_DIFF_CLI_RUNNER_H_
#define CKPT_TESTS_TOOLS_DIFF_CLI_RUNNER_H_

#include <string>

#include "absl/strings/str_replace.h"
#include "tests/testing/cli.h"
#include "tests/tools/diff/fixtures.h"

namespace ckpt::testing {

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

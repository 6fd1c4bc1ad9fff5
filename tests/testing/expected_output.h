// Expected-output files of the CLI tests, tests/tools/expected/<tool>/<name>:
// the one implementation of reading them, making a run's output comparable
// (its temporary directory becomes <TMP>) and comparing.
#ifndef CKPT_TESTS_TESTING_EXPECTED_OUTPUT_H_
#define CKPT_TESTS_TESTING_EXPECTED_OUTPUT_H_

#include <filesystem>
#include <string>

#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "testing/files.h"

namespace ckpt::testing {

// The expected-output file tests/tools/expected/<tool>/<name> (`name` with
// its extension). REQUIRES: CKPT_SOURCE_DIR (defined by ckpt_testing).
inline std::string ExpectedOutput(const std::string& tool,
                                  const std::string& name) {
  return ReadFileBytes(std::string(CKPT_SOURCE_DIR) + "/tests/tools/expected/" +
                       tool + "/" + name);
}

// `text` with the run's temporary directory `tmp` replaced by "<TMP>".
inline std::string ReplaceTmp(const std::string& text, const std::string& tmp) {
  return absl::StrReplaceAll(text, {{tmp, "<TMP>"}});
}

// Expects `actual` (already made comparable) to equal
// tests/tools/expected/<tool>/<name>. Where the test target defines
// CKPT_ACTUAL_DIR, a mismatching output is left in
// CKPT_ACTUAL_DIR/<tool>/<name> for review; expected files are never
// rewritten by tests.
inline void ExpectOutput(const std::string& tool, const std::string& name,
                         const std::string& actual) {
  const std::string expected = ExpectedOutput(tool, name);
  if (actual == expected) return;
  std::string saved;
#ifdef CKPT_ACTUAL_DIR
  const std::string dir = std::string(CKPT_ACTUAL_DIR) + "/" + tool;
  std::filesystem::create_directories(dir);
  WriteFileBytes(dir + "/" + name, actual);
  saved = " (actual output: " + dir + "/" + name + ")";
#endif
  ADD_FAILURE() << "output differs from tests/tools/expected/" << tool << "/"
                << name << saved << "\n--- actual ---\n"
                << actual << "--- expected ---\n"
                << expected;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_EXPECTED_OUTPUT_H_

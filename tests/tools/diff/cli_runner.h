// What the tests that pin the tools' output against tests/tools/expected/
// include: the runner (tests/testing/cli.h), the expected-output helpers
// (tests/testing/expected_output.h) and the diff fixtures.
#ifndef CKPT_TESTS_TOOLS_DIFF_CLI_RUNNER_H_
#define CKPT_TESTS_TOOLS_DIFF_CLI_RUNNER_H_

#include <string>

#include "tests/testing/cli.h"
#include "tests/testing/expected_output.h"
#include "tests/tools/diff/fixtures.h"

#endif  // CKPT_TESTS_TOOLS_DIFF_CLI_RUNNER_H_

// What the tests that pin the tools' output against tests/tools/expected/
// include: the runner (tests/testing/cli.h), the expected-output helpers
// (tests/testing/expected_output.h) and the diff fixtures.
#ifndef CKPT_TESTS_TOOLS_DIFF_CLI_RUNNER_H_
#define CKPT_TESTS_TOOLS_DIFF_CLI_RUNNER_H_

#include <string>

#include "testing/cli.h"
#include "testing/expected_output.h"
#include "tools/diff/fixtures.h"

#endif  // CKPT_TESTS_TOOLS_DIFF_CLI_RUNNER_H_

// The S3 servers of the S3 tests: moto (tests/testing/s3/moto_server.py,
// signature checking on) and the fault-injecting proxy
// (tests/testing/s3/fault_proxy.py), both on loopback.
//
// Under ctest, one moto server serves the whole run: the fixture test
// s3.server.start starts it and writes its address and keys to the file
// that CKPT_S3_TEST_SERVER names. A test binary run by hand starts its own
// for the process. Tests use a bucket of their own (NewBucket), so they
// may run in parallel. A fault proxy is started per test that wants one.
#ifndef CKPT_TESTS_LIBCKPT_S3_S3_TEST_SERVER_H_
#define CKPT_TESTS_LIBCKPT_S3_S3_TEST_SERVER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "s3/s3_client.h"

namespace ckpt::s3::testing {

struct TestServer {
  std::string endpoint;  // http://127.0.0.1:PORT
  std::string region;
  Credentials user;     // an IAM user's access key
  Credentials session;  // an assumed role's temporary credentials
};

// Whether this is a CI run (CI=true): a missing server fails there.
bool InCi();

// The moto server for this process, or null with *why set (moto is not
// installed, or did not start).
const TestServer* GetTestServer(std::string* why);

// Options for a client of `server` through `endpoint` (default: the server
// itself), with the user's key and retries fast enough for tests.
ClientOptions TestOptions(const TestServer& server,
                          const std::string& endpoint = "");

// A new bucket for the running test ("ckpt-<test name>-<random>").
std::string NewBucket(S3Client* client);

// A child process (a Python helper) that prints one JSON line when ready
// and runs until its stdin is closed.
class ChildProcess {
 public:
  // Starts `argv` and waits up to `timeout_s` for its first line.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(
      const std::vector<std::string>& argv, int timeout_s,
      std::string* first_line);
  ~ChildProcess();  // closes its stdin, waits, kills after 10 s

 private:
  ChildProcess(pid_t pid, int stdin_fd) : pid_(pid), stdin_fd_(stdin_fd) {}
  pid_t pid_;
  int stdin_fd_;
};

// fault_proxy.py in front of `upstream`.
class FaultProxy {
 public:
  static absl::StatusOr<std::unique_ptr<FaultProxy>> Start(
      const std::string& upstream);
  const std::string& endpoint() const { return endpoint_; }
  // Replaces the rules (a JSON list, fault_proxy.py says what a rule is).
  absl::Status SetRules(const std::string& json);
  // How often each rule fired, in order.
  absl::StatusOr<std::vector<int>> Hits();

 private:
  std::unique_ptr<ChildProcess> child_;
  std::string endpoint_;
};

}  // namespace ckpt::s3::testing

// In a TEST: `var` = the server, or the test is skipped (fails under CI).
#define CKPT_S3_SERVER_OR_SKIP(var)                        \
  std::string var##_why_;                                  \
  const ::ckpt::s3::testing::TestServer* var =             \
      ::ckpt::s3::testing::GetTestServer(&var##_why_);     \
  if (var == nullptr) {                                    \
    if (::ckpt::s3::testing::InCi()) FAIL() << var##_why_; \
    GTEST_SKIP() << var##_why_;                            \
  }

#endif  // CKPT_TESTS_LIBCKPT_S3_S3_TEST_SERVER_H_

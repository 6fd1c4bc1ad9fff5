#include "s3_test_server.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace ckpt::s3::testing {
namespace {

Credentials CredentialsOf(const nlohmann::json& j) {
  Credentials c;
  c.access_key_id = j.value("access_key_id", "");
  c.secret_access_key = j.value("secret_access_key", "");
  c.session_token = j.value("session_token", "");
  return c;
}

// The server's JSON (moto_server.py), or an error saying why there is none.
absl::StatusOr<TestServer> ServerFromJson(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::UnavailableError(
        absl::StrCat("moto_server.py printed no JSON: '", text, "'"));
  }
  if (j.contains("error")) {
    return absl::UnavailableError(j["error"].get<std::string>());
  }
  TestServer s;
  s.endpoint = j.value("endpoint", "");
  s.region = j.value("region", "us-east-1");
  s.user = CredentialsOf(j["user"]);
  s.session = CredentialsOf(j["session"]);
  return s;
}

struct ProcessServer {
  std::unique_ptr<ChildProcess> child;  // null: ctest's fixture runs it
  absl::StatusOr<TestServer> server = absl::UnknownError("not started");
};

ProcessServer* StartServer() {
  auto* p = new ProcessServer;
  if (const char* state = std::getenv("CKPT_S3_TEST_SERVER");
      state != nullptr && state[0] != '\0') {
    std::ifstream in(state);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      p->server = ServerFromJson(text.str());
      return p;
    }
  }
  const std::string python = CKPT_TEST_PYTHON;
  if (python.empty() || access(python.c_str(), X_OK) != 0) {
    p->server = absl::UnavailableError(
        "no Python interpreter for moto (run scripts/setup)");
    return p;
  }
  std::string line;
  auto child = ChildProcess::Start(
      {python, CKPT_SOURCE_DIR "/tests/testing/s3/moto_server.py"}, 60, &line);
  if (!child.ok()) {
    p->server = child.status();
    return p;
  }
  p->child = std::move(*child);
  p->server = ServerFromJson(line);
  return p;
}

}  // namespace

bool InCi() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

const TestServer* GetTestServer(std::string* why) {
  // Started on first use, stopped when the process exits.
  static std::unique_ptr<ProcessServer> server(StartServer());
  if (!server->server.ok()) {
    *why =
        absl::StrCat("no S3 test server: ", server->server.status().message());
    return nullptr;
  }
  return &*server->server;
}

ClientOptions TestOptions(const TestServer& server,
                          const std::string& endpoint) {
  ClientOptions o;
  o.endpoint = endpoint.empty() ? server.endpoint : endpoint;
  o.region = server.region;
  o.credentials = server.user;
  o.addressing = Addressing::kPath;
  o.retry.initial_backoff = absl::Milliseconds(5);
  o.retry.max_backoff = absl::Milliseconds(50);
  o.retry.max_total = absl::Seconds(30);
  return o;
}

std::string NewBucket(S3Client* client) {
  std::string name = "ckpt-";
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  for (char c : std::string(info != nullptr ? info->name() : "test")) {
    name += absl::ascii_isalnum(static_cast<unsigned char>(c))
                ? absl::ascii_tolower(static_cast<unsigned char>(c))
                : '-';
    if (name.size() >= 40) break;
  }
  std::random_device rd;
  absl::StrAppend(&name, "-", absl::Hex(rd(), absl::kZeroPad8));
  absl::Status s = client->CreateBucket(name);
  EXPECT_TRUE(s.ok()) << s;
  return name;
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv, int timeout_s,
    std::string* first_line) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid;
  const int rc =
      posix_spawn(&pid, cargv[0], &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  if (rc != 0) {
    close(in[1]);
    close(out[0]);
    return absl::UnavailableError(
        absl::StrCat("posix_spawn ", argv[0], ": ", std::strerror(rc)));
  }
  std::unique_ptr<ChildProcess> child(new ChildProcess(pid, in[1]));
  // The first line, within the time allowed.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  first_line->clear();
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      close(out[0]);
      return absl::DeadlineExceededError(
          absl::StrCat(argv.back(), " printed nothing in ", timeout_s, " s"));
    }
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char c;
    const ssize_t n = read(out[0], &c, 1);
    if (n <= 0) {
      close(out[0]);
      return absl::UnavailableError(absl::StrCat(
          argv.back(), " exited before it was ready (its stderr says why)"));
    }
    if (c == '\n') break;
    *first_line += c;
  }
  close(out[0]);
  return child;
}

ChildProcess::~ChildProcess() {
  close(stdin_fd_);
  for (int i = 0; i < 100; ++i) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

absl::StatusOr<std::unique_ptr<FaultProxy>> FaultProxy::Start(
    const std::string& upstream) {
  const std::string python = CKPT_TEST_PYTHON;
  std::string line;
  auto child = ChildProcess::Start(
      {python, CKPT_SOURCE_DIR "/tests/testing/s3/fault_proxy.py", "--upstream",
       upstream},
      30, &line);
  if (!child.ok()) return child.status();
  nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.contains("endpoint")) {
    return absl::UnavailableError(
        absl::StrCat("fault_proxy.py printed '", line, "'"));
  }
  auto proxy = std::make_unique<FaultProxy>();
  proxy->child_ = std::move(*child);
  proxy->endpoint_ = j["endpoint"].get<std::string>();
  return proxy;
}

namespace {

size_t Collect(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

// One plain HTTP request to the proxy's control path.
absl::StatusOr<std::string> Control(const std::string& url,
                                    const std::string* put_body) {
  CURL* curl = curl_easy_init();
  std::string got;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &got);
  if (put_body != nullptr) {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "PUT");
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, put_body->c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE,
                     static_cast<long>(put_body->size()));
  }
  const CURLcode rc = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(curl);
  if (rc != CURLE_OK || status != 200) {
    return absl::UnavailableError(absl::StrCat(
        url, ": ", curl_easy_strerror(rc), ", HTTP ", status, ": ", got));
  }
  return got;
}

}  // namespace

absl::Status FaultProxy::SetRules(const std::string& json) {
  return Control(endpoint_ + "/__faults__", &json).status();
}

absl::StatusOr<std::vector<int>> FaultProxy::Hits() {
  auto text = Control(endpoint_ + "/__faults__", nullptr);
  if (!text.ok()) return text.status();
  std::vector<int> hits;
  for (const auto& r : nlohmann::json::parse(*text)) {
    hits.push_back(r.value("hits", 0));
  }
  return hits;
}

}  // namespace ckpt::s3::testing

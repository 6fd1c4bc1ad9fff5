// The tools on s3://bucket/prefix checkpoints (tools/common/tool_storage.h),
// against moto on loopback with signature checking on (the s3 tests'
// server, tests/libckpt/s3/s3_test_server.h): every tool run as a binary
// with the AWS_* variables of the server, its exit code and output checked.
// ckpt-reshard both ways (local -> S3 -> local), each result validated;
// inspect of an S3 copy as of the local one; a flipped byte in an object
// found by ckpt-validate; ckpt-convert exporting from and importing into
// S3; a missing root and a wrong secret reported, the secret never printed.
#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libckpt/s3/s3_test_server.h"
#include "libckpt/test_util.h"
#include "testing/cli.h"

namespace ckpt::tools {
namespace {

using ::ckpt::testing::CliResult;
using ::ckpt::testing::RunCli;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kStep[] = "step-00000100";

class S3ToolsCli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    server_ = s3::testing::GetTestServer(&why);
    if (server_ == nullptr) {
      if (s3::testing::InCi()) GTEST_FAIL() << why;
      GTEST_SKIP() << why;
    }
    // The tools read these (ckpt/open_storage.h); the children inherit them.
    setenv("AWS_ENDPOINT_URL", server_->endpoint.c_str(), 1);
    setenv("AWS_REGION", server_->region.c_str(), 1);
    setenv("AWS_ACCESS_KEY_ID", server_->user.access_key_id.c_str(), 1);
    setenv("AWS_SECRET_ACCESS_KEY", server_->user.secret_access_key.c_str(), 1);
    unsetenv("AWS_SESSION_TOKEN");
    unsetenv("AWS_ENDPOINT_URL_S3");
    auto client = s3::S3Client::Create(s3::testing::TestOptions(*server_));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    bucket_ = s3::testing::NewBucket(client_.get());
    src_ = tmp_ / "src";
    // A small checkpoint of every layout ckpt-synth makes, on 4 ranks.
    CliResult w =
        Run(CKPT_SYNTH_BIN, {"write", src_, "--ranks", "4", "--layout", "mixed",
                             "--seed", "7", "--size-mb", "2", "--step", "100"});
    ASSERT_EQ(w.exit_code, 0) << w.err;
  }

  CliResult Run(const std::string& bin, const std::vector<std::string>& args) {
    return RunCli(bin, args, tmp_.path());
  }
  std::string Url(const std::string& prefix) const {
    return absl::StrCat("s3://", bucket_, "/", prefix);
  }

  const s3::testing::TestServer* server_ = nullptr;
  std::unique_ptr<s3::S3Client> client_;
  std::string bucket_;
  TempDir tmp_;
  std::string src_;
};

TEST_F(S3ToolsCli, ReshardLocalToS3AndBackEachResultValid) {
  const std::string run = Url("run");
  CliResult r = Run(CKPT_RESHARD_BIN, {src_, run, "--to", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out,
              StartsWith(absl::StrCat("resharded ", src_, "/", kStep,
                                      " (step 100, 4 ranks) into ", run, "/",
                                      kStep, " (step 100, 2 ranks)\n")));

  CliResult v = Run(CKPT_VALIDATE_BIN, {run});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  EXPECT_THAT(v.out, HasSubstr("2 of 2 shard files"));
  EXPECT_THAT(v.out, HasSubstr("VALID: no problems found\n"));

  const std::string back = tmp_ / "back";
  r = Run(CKPT_RESHARD_BIN, {run, back, "--to", "3", "--verify"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out,
              StartsWith(absl::StrCat("resharded ", run, "/", kStep,
                                      " (step 100, 2 ranks) into ", back, "/",
                                      kStep, " (step 100, 3 ranks)\n")));
  v = Run(CKPT_VALIDATE_BIN, {back});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  EXPECT_THAT(v.out, HasSubstr("VALID: no problems found\n"));
  CliResult s = Run(CKPT_SYNTH_BIN, {"verify", back, "--ranks", "3"});
  EXPECT_EQ(s.exit_code, 0) << s.out << s.err;

  CliResult d = Run(CKPT_DIFF_BIN, {src_, run});
  EXPECT_EQ(d.exit_code, 0) << d.out << d.err;
  EXPECT_THAT(d.out, HasSubstr("result: equal"));
}

// What ckpt-inspect prints of a checkpoint resharded onto S3 is what it
// prints of the same reshard onto a local disk, but for the path, the
// checkpoint's id and its creation time.
TEST_F(S3ToolsCli, InspectOfAnS3CopyShowsWhatTheLocalOneShows) {
  const std::string run = Url("run"), copy = tmp_ / "copy";
  CliResult r = Run(CKPT_RESHARD_BIN, {src_, run, "--to", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Run(CKPT_RESHARD_BIN, {src_, copy, "--to", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  CliResult local = Run(CKPT_INSPECT_BIN, {copy});
  CliResult remote = Run(CKPT_INSPECT_BIN, {run});
  ASSERT_EQ(local.exit_code, 0) << local.err;
  ASSERT_EQ(remote.exit_code, 0) << remote.err;
  EXPECT_THAT(remote.out,
              StartsWith(absl::StrCat("Checkpoint     ", run, "/", kStep)));
  auto comparable = [](const std::string& out, const std::string& root) {
    std::vector<std::string> keep;
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      if (absl::StartsWith(line, "Checkpoint ") ||
          absl::StartsWith(line, "Created") || absl::StartsWith(line, "ID") ||
          absl::StartsWith(line, "Id")) {
        continue;
      }
      keep.push_back(absl::StrReplaceAll(line, {{root, "ROOT"}}));
    }
    return keep;
  };
  EXPECT_EQ(comparable(remote.out, run), comparable(local.out, copy));
}

TEST_F(S3ToolsCli, ValidateFindsAFlippedByteInAnS3Object) {
  const std::string run = Url("run");
  CliResult r = Run(CKPT_RESHARD_BIN, {src_, run, "--to", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto list = client_->ListObjects(bucket_, absl::StrCat("run/", kStep, "/"));
  ASSERT_TRUE(list.ok()) << list.status();
  std::string shard;
  for (const auto& o : list->objects) {
    if (absl::StrContains(o.key, "/shard-00001")) shard = o.key;
  }
  ASSERT_FALSE(shard.empty());
  auto bytes = client_->GetObject(bucket_, shard);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  std::string data = *std::move(bytes);
  ASSERT_GT(data.size(), 4096u + 100);
  data[4096 + 100] ^= 0x01;  // in the first payload block
  ASSERT_TRUE(client_->PutObject(bucket_, shard, data).ok());

  CliResult v = Run(CKPT_VALIDATE_BIN, {run});
  EXPECT_EQ(v.exit_code, 1) << v.out << v.err;
  EXPECT_THAT(v.out, HasSubstr(absl::StrCat("error: s3://", bucket_, "/", shard,
                                            ": block ")));
  EXPECT_THAT(v.out, HasSubstr("checksum"));
  EXPECT_THAT(v.out, HasSubstr("INVALID: 1 problem"));
  CliResult q = Run(CKPT_VALIDATE_BIN, {run, "--quick"});  // reads no payload
  EXPECT_EQ(q.exit_code, 0) << q.out << q.err;
}

#ifdef CKPT_CONVERT_BIN
TEST_F(S3ToolsCli, ConvertExportsFromAndImportsIntoS3) {
  const std::string run = Url("run");
  CliResult r = Run(CKPT_RESHARD_BIN, {src_, run, "--to", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string h5 = tmp_ / "model.h5";
  CliResult c = Run(CKPT_CONVERT_BIN, {run, h5, "--to", "hdf5"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_THAT(c.out, StartsWith(absl::StrCat("exported ", run, "/", kStep,
                                             " to ", h5, "\n")));

  const std::string imported = Url("imported");
  c = Run(CKPT_CONVERT_BIN, {h5, imported, "--from", "hdf5"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_THAT(c.out, StartsWith(absl::StrCat("imported ", h5, " into ",
                                             imported, "/", kStep, "\n")));
  CliResult v = Run(CKPT_VALIDATE_BIN, {imported});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  CliResult d = Run(CKPT_DIFF_BIN, {src_, imported});
  EXPECT_EQ(d.exit_code, 0) << d.out << d.err;
  EXPECT_THAT(d.out, HasSubstr("result: equal"));

  const std::string st = tmp_ / "model.safetensors";
  c = Run(CKPT_CONVERT_BIN, {run, st, "--to", "safetensors"});
  EXPECT_EQ(c.exit_code, 0) << c.err;
  c = Run(CKPT_CONVERT_BIN, {st, Url("from-st"), "--from", "safetensors"});
  EXPECT_EQ(c.exit_code, 0) << c.err;

  // The file side of a conversion is local.
  c = Run(CKPT_CONVERT_BIN, {run, Url("model.h5"), "--to", "hdf5"});
  EXPECT_EQ(c.exit_code, 2);
  EXPECT_THAT(c.err, HasSubstr("must be a local path"));
}
#endif

TEST_F(S3ToolsCli, MissingS3RootIsAnErrorNamingIt) {
  const std::string nothing = Url("nothing");
  for (const char* bin : {CKPT_INSPECT_BIN, CKPT_VALIDATE_BIN}) {
    CliResult r = Run(bin, {nothing});
    EXPECT_EQ(r.exit_code, 2) << bin << r.out;
    EXPECT_THAT(r.err, HasSubstr(nothing)) << bin;
  }
  CliResult r = Run(CKPT_RESHARD_BIN, {nothing, tmp_ / "out", "--to", "2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(nothing));
}

// SECURITY.md "Object storage": the tools take credentials from the
// environment and never print them.
TEST_F(S3ToolsCli, AWrongSecretFailsEveryToolAndIsNeverPrinted) {
  const std::string run = Url("run");
  CliResult r = Run(CKPT_RESHARD_BIN, {src_, run, "--to", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string secret = "wrongSecretKey/ToolsMustNeverPrintThis0123456";
  setenv("AWS_SECRET_ACCESS_KEY", secret.c_str(), 1);
  setenv("AWS_SESSION_TOKEN", "toolSessionTokenThatMustNotLeak", 1);
  const std::vector<std::pair<const char*, std::vector<std::string>>> runs = {
      {CKPT_INSPECT_BIN, {run}},
      {CKPT_VALIDATE_BIN, {run}},
      {CKPT_DIFF_BIN, {src_, run}},
      {CKPT_RESHARD_BIN, {src_, Url("other"), "--to", "2"}},
  };
  for (const auto& [bin, args] : runs) {
    CliResult t = Run(bin, args);
    EXPECT_EQ(t.exit_code, 2) << bin << t.out << t.err;
    EXPECT_THAT(t.err, HasSubstr("s3://")) << bin;
    for (const std::string& s :
         {secret, std::string("toolSessionTokenThatMustNotLeak")}) {
      EXPECT_THAT(t.out + t.err, Not(HasSubstr(s))) << bin;
    }
  }
}

}  // namespace
}  // namespace ckpt::tools

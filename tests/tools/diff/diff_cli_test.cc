// Runs the ckpt-diff binary: exit codes, exact error messages, and human
// output pinned by tests/tools/expected/diff/*.txt.
#include <filesystem>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "testing/status_matchers.h"
#include "tools/diff/cli_runner.h"

namespace ckpt::testing {
namespace {

class DiffCliTest : public ::testing::Test {
 protected:
  CliResult Run(const std::vector<std::string>& args) {
    CliResult r = RunCli(CKPT_DIFF_BIN, args, tmp_.path());
    r.out = ReplaceTmp(r.out, tmp_.path());
    r.err = ReplaceTmp(r.err, tmp_.path());
    return r;
  }
  std::string A() const { return tmp_ / "a"; }
  std::string B() const { return tmp_ / "b"; }

  // A on 4 ranks; B on 2 ranks with other layouts and, if `change`, a few
  // differences of every kind.
  void WritePair(bool change) {
    std::vector<FixtureTensor> a = {
        {"emb", DType::kFloat32, {6, 4}, Layout::kRows, FloatRamp(24)},
        {"layers.0.w",
         DType::kFloat32,
         {4, 4},
         Layout::kGrid,
         FloatRamp(16, 1)},
        {"layers.0.b",
         DType::kFloat32,
         {4},
         Layout::kReplicated,
         FloatRamp(4, 2)},
        {"opt.step", DType::kInt64, {2}, Layout::kWhole, std::string(16, '\1')},
    };
    std::vector<FixtureObject> ao = {{"loader", "position=42", 1}};
    std::vector<FixtureTensor> b = a;
    std::vector<FixtureObject> bo = {{"loader", "position=42", 0}};
    b[0].layout = Layout::kFlatUneven;
    b[1].layout = Layout::kCols;
    if (change) {
      SetFloat(&b[0].global, 5, 1.5f);   // was 1.25
      SetFloat(&b[0].global, 22, 9.0f);  // was 5.5
      b[2].dtype = DType::kBFloat16;
      b[2].global.clear();
      b.push_back({"head", DType::kFloat32, {2}, Layout::kWhole, FloatRamp(2)});
      b.erase(b.begin() + 3);  // opt.step removed
      bo[0].bytes = "position=43";
    }
    CKPT_ASSERT_OK(WriteFixture(A(), 7, 4, a, ao));
    CKPT_ASSERT_OK(WriteFixture(B(), 7, 2, b, bo));
  }

  TempDir tmp_;
};

TEST_F(DiffCliTest, EqualExitsZeroWithPinnedOutput) {
  WritePair(false);
  CliResult r = Run({A(), B()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ExpectOutput("diff", "equal.txt", r.out);
  EXPECT_EQ(r.err, "");
}

TEST_F(DiffCliTest, DifferentExitsOneWithPinnedOutput) {
  WritePair(true);
  CliResult r = Run({A(), B()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  ExpectOutput("diff", "different.txt", r.out);
  EXPECT_EQ(r.err, "");
}

TEST_F(DiffCliTest, AtolAcceptsTheValueChangesOnly) {
  WritePair(false);
  // Change one value by 0.25 only.
  std::filesystem::remove_all(B());
  std::vector<FixtureTensor> b = {
      {"emb", DType::kFloat32, {6, 4}, Layout::kFlatUneven, FloatRamp(24)},
      {"layers.0.w", DType::kFloat32, {4, 4}, Layout::kCols, FloatRamp(16, 1)},
      {"layers.0.b",
       DType::kFloat32,
       {4},
       Layout::kReplicated,
       FloatRamp(4, 2)},
      {"opt.step", DType::kInt64, {2}, Layout::kWhole, std::string(16, '\1')},
  };
  SetFloat(&b[0].global, 5, 1.5f);
  CKPT_ASSERT_OK(WriteFixture(B(), 7, 2, b, {{"loader", "position=42", 0}}));
  CliResult r = Run({A(), B(), "--atol", "0.3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ExpectOutput("diff", "atol.txt", r.out);
  r = Run({A(), B(), "--atol", "0.1"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  r = Run({A(), B(), "--rtol", "0.2"});  // 0.25 <= 0.2 * 1.5
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

TEST_F(DiffCliTest, JsonDocument) {
  WritePair(true);
  CliResult r = Run({"--json", A(), B()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["equal"], false);
  EXPECT_EQ(j["a"]["path"], "<TMP>/a/step-00000007");
  EXPECT_EQ(j["a"]["world_size"], 4);
  EXPECT_EQ(j["b"]["world_size"], 2);
  ASSERT_EQ(j["structural"].size(), 3u);
  EXPECT_EQ(j["structural"][0]["entry"], "head");
  EXPECT_EQ(j["structural"][0]["change"], "added");
  EXPECT_EQ(j["structural"][1]["change"], "dtype");
  EXPECT_EQ(j["structural"][1]["a"], "float32");
  EXPECT_EQ(j["structural"][2]["change"], "removed");
  ASSERT_EQ(j["values"].size(), 2u);
  EXPECT_EQ(j["values"][0]["entry"], "emb");
  EXPECT_EQ(j["values"][0]["differing"], 2);
  EXPECT_EQ(j["values"][0]["total"], 24);
  EXPECT_EQ(j["values"][0]["max_abs_diff"], 3.5);
  EXPECT_EQ(j["values"][0]["first_at"], nlohmann::json::parse("[1, 1]"));
  EXPECT_EQ(j["values"][1]["kind"], "object");
  EXPECT_EQ(j["values"][1]["differing"], 1);
  ASSERT_EQ(j["notes"].size(), 1u);
  EXPECT_EQ(j["notes"][0]["what"], "world size");
}

TEST_F(DiffCliTest, MissingDirectoryExitsTwo) {
  WritePair(false);
  CliResult r = Run({A(), tmp_ / "nope"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(
      r.err,
      "ckpt-diff: error: <TMP>/nope: no such checkpoint or checkpoint root\n");
}

TEST_F(DiffCliTest, NotACheckpointExitsTwo) {
  WritePair(false);
  std::filesystem::create_directories(tmp_ / "empty");
  CliResult r = Run({tmp_ / "empty", B()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "ckpt-diff: error: <TMP>/empty: not a checkpoint (no MANIFEST) nor "
            "a checkpoint root "
            "(no 'latest')\n");
}

TEST_F(DiffCliTest, TruncatedShardExitsTwo) {
  WritePair(false);
  const std::string shard = B() + "/step-00000007/shard-00001.ckpt";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 10);
  CliResult r = Run({A(), B()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(
      r.err.rfind(
          "ckpt-diff: error: <TMP>/b/step-00000007/shard-00001.ckpt: file is ",
          0),
      0u)
      << r.err;
}

TEST_F(DiffCliTest, CorruptedBlockExitsTwoNamingFileEntryAndBlock) {
  WritePair(false);
  const std::string shard = B() + "/step-00000007/shard-00000.ckpt";
  std::string bytes = ReadFileBytes(shard);
  bytes[4096] ^= 1;
  WriteFileBytes(shard, bytes);
  CliResult r = Run({A(), B()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.err.find("<TMP>/b/step-00000007/shard-00000.ckpt: block 0 of chunk "),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("checksum"), std::string::npos) << r.err;
}

TEST_F(DiffCliTest, UsageErrorExitsTwo) {
  CliResult r = Run({A()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(
      r.err,
      "ckpt-diff: error: B is required\nRun 'ckpt-diff --help' for usage.\n");
  r = Run({A(), B(), "--atol", "-1"});
  EXPECT_EQ(r.exit_code, 2);
}

TEST_F(DiffCliTest, VersionAndHelp) {
  CliResult r = Run({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("ckpt-diff ", 0), 0u);
  r = Run({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--atol"), std::string::npos);
}

}  // namespace
}  // namespace ckpt::testing

#include "synth/synth_tool.h"

#include <sstream>

#include "ckpt/format/status_macros.h"
#include "common/tool_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "testing/status_matchers.h"

namespace ckpt::synth {
namespace {

using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::StartsWith;

WriteArgs SmallWrite(const std::string& dir) {
  WriteArgs w;
  w.dir = dir;
  w.ranks = 4;
  w.layout = "tp";
  w.seed = 7;
  w.size_mb = 0.25;
  w.io_threads = 2;
  return w;
}

TEST(SynthTool, WriteText) {
  TempDir dir;
  std::ostringstream out;
  CKPT_ASSERT_OK_AND_ASSIGN(int code, RunWrite(SmallWrite(dir / "run"), out));
  EXPECT_EQ(code, tools::kExitOk);
  EXPECT_EQ(out.str(), "wrote " + dir.path() +
                           "/run/step-00000100\n"
                           "  step 100, 4 ranks, layout tp, seed 7\n"
                           "  model: 2 layers, hidden 32, ffn 128, vocab 261; "
                           "bfloat16 parameters, "
                           "float32 Adam states\n"
                           "  48 tensors (99840 elements), 5 objects: 325 KiB, "
                           "325 KiB stored\n");
}

TEST(SynthTool, WriteJson) {
  TempDir dir;
  WriteArgs w = SmallWrite(dir.path());
  w.json = true;
  w.codec = "zstd";
  w.dtype = "float32";
  std::ostringstream out;
  CKPT_ASSERT_OK_AND_ASSIGN(int code, RunWrite(w, out));
  EXPECT_EQ(code, tools::kExitOk);
  nlohmann::json j = nlohmann::json::parse(out.str());
  EXPECT_EQ(j["command"], "write");
  EXPECT_EQ(j["path"], dir.path() + "/step-00000100");
  EXPECT_EQ(j["ranks"], 4);
  EXPECT_EQ(j["layout"], "tp");
  EXPECT_EQ(j["seed"], 7);
  EXPECT_EQ(j["dtype"], "float32");
  EXPECT_EQ(j["model"]["hidden"], 24);
  EXPECT_EQ(j["tensors"], 48);
  EXPECT_EQ(j["objects"], 5);
  EXPECT_LT(j["stored_bytes"].get<uint64_t>(),
            j["logical_bytes"].get<uint64_t>());
  EXPECT_TRUE(j["save_seconds"].is_number());
}

TEST(SynthTool, BadWriteArguments) {
  TempDir dir;
  std::ostringstream out;
  WriteArgs w = SmallWrite(dir.path());
  w.layout = "zero";
  EXPECT_THAT(RunWrite(w, out), StatusIs(absl::StatusCode::kInvalidArgument,
                                         "unknown layout 'zero'"));
  w = SmallWrite(dir.path());
  w.dtype = "float128";
  EXPECT_THAT(RunWrite(w, out),
              StatusIs(absl::StatusCode::kInvalidArgument, "float128"));
  w = SmallWrite(dir.path());
  w.codec = "lz4";
  EXPECT_THAT(RunWrite(w, out),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "unknown codec 'lz4' (expected none or zstd)"));
  w = SmallWrite(dir.path());
  w.io_threads = 0;
  EXPECT_THAT(RunWrite(w, out), StatusIs(absl::StatusCode::kInvalidArgument,
                                         "--io-threads must be >= 1, got 0"));
  EXPECT_EQ(out.str(), "");
}

TEST(SynthTool, VerifyOkText) {
  TempDir dir;
  std::ostringstream out;
  CKPT_ASSERT_OK(RunWrite(SmallWrite(dir.path()), out).status());
  VerifyArgs v;
  v.path = dir.path();
  v.ranks = 3;
  v.seed = 7;
  std::ostringstream vout;
  CKPT_ASSERT_OK_AND_ASSIGN(int code, RunVerify(v, vout));
  EXPECT_EQ(code, tools::kExitOk);
  EXPECT_THAT(
      vout.str(),
      StartsWith("verified " + dir.path() +
                 "/step-00000100\n"
                 "  step 100, written by 4 ranks (layout tp), loaded as 3 "
                 "ranks (layout tp), seed 7\n"));
  EXPECT_THAT(
      vout.str(),
      HasSubstr("  53 of 53 entries checked, 100931 elements compared"));
  EXPECT_THAT(vout.str(),
              HasSubstr("\nOK: every entry matches the generator\n"));
}

TEST(SynthTool, VerifyMismatchTextListsTenThenCounts) {
  TempDir dir;
  std::ostringstream out;
  CKPT_ASSERT_OK(RunWrite(SmallWrite(dir.path()), out).status());
  VerifyArgs v;
  v.path = dir.path();
  v.ranks = 2;
  v.seed = 8;
  std::ostringstream vout;
  CKPT_ASSERT_OK_AND_ASSIGN(int code, RunVerify(v, vout));
  EXPECT_EQ(code, tools::kExitFindings);
  const std::string s = vout.str();
  EXPECT_THAT(
      s,
      HasSubstr(
          "\nMISMATCH metadata 'synth.seed': expected 8 (--seed), the "
          "checkpoint records 7\nMISMATCH entry 'embed.weight': element [0, 0] "
          "(index 0) differs: expected 0x"));
  EXPECT_THAT(
      s,
      HasSubstr(
          "\n... and 43 more\nFAILED: 1 metadata value and 52 entries differ "
          "from the generator\n"));
  size_t lines = 0;
  for (size_t p = s.find("MISMATCH"); p != std::string::npos;
       p = s.find("MISMATCH", p + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 10u);
}

TEST(SynthTool, VerifyTextOneMismatch) {
  VerifyResult r;
  r.path = "/c/step-00000001";
  r.mismatches.push_back(Mismatch{Mismatch::Kind::kMissing, "x", 0, "", "", "",
                                  "entry 'x' is gone"});
  EXPECT_THAT(VerifyText(r),
              HasSubstr("\nMISMATCH entry 'x' is gone\nFAILED: 1 entry differs "
                        "from the generator\n"));
}

TEST(SynthTool, VerifyJson) {
  TempDir dir;
  std::ostringstream out;
  CKPT_ASSERT_OK(RunWrite(SmallWrite(dir.path()), out).status());
  VerifyArgs v;
  v.path = dir.path();
  v.ranks = 2;
  v.layout = "fsdp";
  v.seed = 8;
  v.json = true;
  std::ostringstream vout;
  CKPT_ASSERT_OK_AND_ASSIGN(int code, RunVerify(v, vout));
  EXPECT_EQ(code, tools::kExitFindings);
  nlohmann::json j = nlohmann::json::parse(vout.str());
  EXPECT_EQ(j["command"], "verify");
  EXPECT_EQ(j["written_layout"], "tp");
  EXPECT_EQ(j["layout"], "fsdp");
  EXPECT_EQ(j["written_ranks"], 4);
  EXPECT_EQ(j["ranks"], 2);
  EXPECT_EQ(j["ok"], false);
  ASSERT_EQ(j["mismatches"].size(), 53u);
  EXPECT_EQ(j["mismatches"][0]["kind"], "metadata");
  EXPECT_EQ(j["mismatches"][0]["expected"], "8");
  EXPECT_EQ(j["mismatches"][0]["actual"], "7");
  EXPECT_EQ(j["mismatches"][1]["kind"], "value");
  EXPECT_EQ(j["mismatches"][1]["entry"], "embed.weight");
  EXPECT_EQ(j["mismatches"][1]["index"], 0);
  EXPECT_EQ(j["mismatches"][1]["coords"], "[0, 0]");
}

TEST(SynthTool, VerifyErrors) {
  TempDir dir;
  VerifyArgs v;
  v.path = dir / "missing";
  std::ostringstream out;
  EXPECT_THAT(RunVerify(v, out),
              StatusIs(absl::StatusCode::kNotFound, "missing"));
  v.path = dir.path();
  v.layout = "pp";
  EXPECT_THAT(RunVerify(v, out), StatusIs(absl::StatusCode::kInvalidArgument,
                                          "unknown layout 'pp'"));
  EXPECT_EQ(out.str(), "");
}

}  // namespace
}  // namespace ckpt::synth

// The ckpt-synth binary: exit codes, stdout and stderr. Human output is
// pinned by tests/tools/expected/synth/*.txt, with the run's temporary
// directory replaced by <TMP>.
#include <fstream>
#include <sstream>

#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/reader.h"
#include "ckpt/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "nlohmann/json.hpp"
#include "testing/cli.h"
#include "testing/expected_output.h"
#include "testing/status_matchers.h"

namespace ckpt::synth {
namespace {

using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::StartsWith;

struct RunResult {
  int code = -1;
  std::string out, err;
};

// Runs ckpt-synth with `args`, split at spaces (no shell: temp paths have
// no spaces), stdout and stderr captured.
RunResult Synth(const TempDir& tmp, const std::string& args) {
  ckpt::testing::CliResult c = ckpt::testing::RunCli(
      CKPT_SYNTH_BINARY, absl::StrSplit(args, ' ', absl::SkipEmpty()),
      tmp.path());
  EXPECT_NE(c.exit_code, -1) << c.err;
  return RunResult{c.exit_code, c.out, c.err};
}

std::string Placeholders(const std::string& s, const TempDir& tmp) {
  return ckpt::testing::ReplaceTmp(s, tmp.path());
}

constexpr char kWrite[] =
    "write {}/run --ranks 4 --layout tp --seed 7 --size-mb 0.25";

std::string WriteArgs(const TempDir& tmp) {
  return absl::StrReplaceAll(kWrite, {{"{}", tmp.path()}});
}

TEST(SynthCli, Help) {
  TempDir tmp;
  RunResult r = Synth(tmp, "--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("write"));
  EXPECT_THAT(r.out, HasSubstr("verify"));
  EXPECT_EQ(r.err, "");
  r = Synth(tmp, "write --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("--layout"));
  EXPECT_THAT(r.out, HasSubstr("--size-mb"));
  r = Synth(tmp, "verify --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("--seed"));
}

TEST(SynthCli, Version) {
  TempDir tmp;
  RunResult r = Synth(tmp, "--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, StartsWith("ckpt-synth "));
  EXPECT_THAT(r.out, HasSubstr("(ckpt library "));
  EXPECT_THAT(r.out, HasSubstr(", format v1.0)\n"));
}

TEST(SynthCli, UsageErrorsExitTwo) {
  TempDir tmp;
  RunResult r = Synth(tmp, "");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err,
            "ckpt-synth: error: A subcommand is required\n"
            "Run 'ckpt-synth --help' for usage.\n");
  r = Synth(tmp, absl::StrCat("write ", tmp.path(),
                              " --ranks 2 --layout zero --seed 1"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(
      r.err,
      "ckpt-synth: error: --layout: zero not in {tp,fsdp,replicated,mixed}\n"
      "Run 'ckpt-synth --help' for usage.\n");
  r = Synth(tmp, absl::StrCat("write ", tmp.path(), " --layout tp --seed 1"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "ckpt-synth: error: --ranks is required\n"
            "Run 'ckpt-synth --help' for usage.\n");
  r = Synth(tmp, absl::StrCat("write ", tmp.path(),
                              " --ranks 1 --layout tp --seed 1 --dtype f8"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, StartsWith("ckpt-synth: error: "));
  EXPECT_THAT(r.err, HasSubstr("'f8'"));
}

TEST(SynthCli, WriteAndVerifyOutputs) {
  TempDir tmp;
  RunResult w = Synth(tmp, WriteArgs(tmp));
  ASSERT_EQ(w.code, 0) << w.err;
  EXPECT_EQ(w.err, "");
  ckpt::testing::ExpectOutput("synth", "write.txt", Placeholders(w.out, tmp));

  RunResult v =
      Synth(tmp, absl::StrCat("verify ", tmp.path(), "/run --ranks 3"));
  EXPECT_EQ(v.code, 0) << v.err;
  EXPECT_EQ(v.err, "");
  ckpt::testing::ExpectOutput("synth", "verify_ok.txt",
                              Placeholders(v.out, tmp));

  RunResult bad = Synth(
      tmp, absl::StrCat("verify ", tmp.path(), "/run --ranks 2 --seed 8"));
  EXPECT_EQ(bad.code, 1) << bad.err;
  EXPECT_EQ(bad.err, "");
  ckpt::testing::ExpectOutput("synth", "verify_wrong_seed.txt",
                              Placeholders(bad.out, tmp));
}

TEST(SynthCli, JsonOutputs) {
  TempDir tmp;
  RunResult w = Synth(tmp, WriteArgs(tmp) + " --codec zstd --json");
  ASSERT_EQ(w.code, 0) << w.err;
  nlohmann::json j = nlohmann::json::parse(w.out);
  EXPECT_EQ(j["path"], tmp.path() + "/run/step-00000100");
  EXPECT_LT(j["stored_bytes"].get<uint64_t>(),
            j["logical_bytes"].get<uint64_t>());
  RunResult v =
      Synth(tmp, absl::StrCat("verify ", tmp.path(),
                              "/run --ranks 2 --layout mixed --json"));
  EXPECT_EQ(v.code, 0) << v.err;
  j = nlohmann::json::parse(v.out);
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["layout"], "mixed");
  EXPECT_EQ(j["mismatches"].size(), 0u);
}

TEST(SynthCli, ExistingStepIsAnError) {
  TempDir tmp;
  ASSERT_EQ(Synth(tmp, WriteArgs(tmp)).code, 0);
  RunResult again = Synth(tmp, WriteArgs(tmp));
  EXPECT_EQ(again.code, 2);
  EXPECT_EQ(again.out, "");
  EXPECT_THAT(again.err, StartsWith("ckpt-synth: error: "));
  EXPECT_THAT(again.err, HasSubstr("step-00000100"));
  EXPECT_EQ(Synth(tmp, WriteArgs(tmp) + " --overwrite").code, 0);
}

TEST(SynthCli, MissingDirectoryExitsTwo) {
  TempDir tmp;
  RunResult r = Synth(tmp, absl::StrCat("verify ", tmp.path(), "/nope"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  ckpt::testing::ExpectOutput("synth", "verify_missing.txt",
                              Placeholders(r.err, tmp));
}

TEST(SynthCli, NotACheckpointExitsTwo) {
  TempDir tmp;
  RunResult r =
      Synth(tmp, absl::StrCat("verify ", tmp.path()));  // holds only stdout.txt
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  ckpt::testing::ExpectOutput("synth", "verify_not_checkpoint.txt",
                              Placeholders(r.err, tmp));
}

TEST(SynthCli, NotSyntheticExitsTwo) {
  TempDir tmp;
  auto writer = Writer::Create({}).value();
  float x[2] = {1, 2};
  ASSERT_TRUE(
      writer->AddTensor("w", DType::kFloat32, {2}, FullBox({2}), x).ok());
  ASSERT_TRUE(writer->Save(tmp / "c", 5, {}).ok());
  RunResult r = Synth(tmp, absl::StrCat("verify ", tmp.path(), "/c"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(
      Placeholders(r.err, tmp),
      "ckpt-synth: error: <TMP>/c/step-00000005: not written by ckpt-synth (no "
      "'synth.version' in its metadata)\n");
}

TEST(SynthCli, CorruptedShardExitsOneNamingTheEntry) {
  TempDir tmp;
  ASSERT_EQ(Synth(tmp, absl::StrCat("write ", tmp.path(),
                                    "/run --ranks 1 --layout tp --seed 3 "
                                    "--size-mb 0.25"))
                .code,
            0);
  auto reader = Reader::Open(tmp / "run").value();
  const format::EntryRecord* e = reader->Find("final_norm.weight");
  ASSERT_NE(e, nullptr);
  const std::string shard =
      reader->path() + "/" + reader->manifest().shards[0].file_name;
  int fd = open(shard.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char b;
  ASSERT_EQ(pread(fd, &b, 1, e->chunks[0].data_offset), 1);
  b ^= 0x10;
  ASSERT_EQ(pwrite(fd, &b, 1, e->chunks[0].data_offset), 1);
  close(fd);
  RunResult r =
      Synth(tmp, absl::StrCat("verify ", tmp.path(), "/run --ranks 2"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, HasSubstr("\nMISMATCH "));
  EXPECT_THAT(r.out, HasSubstr("'final_norm.weight'"));
  EXPECT_THAT(r.out, HasSubstr("checksum"));
  EXPECT_THAT(r.out,
              HasSubstr("\nFAILED: 1 entry differs from the generator\n"));
}

}  // namespace
}  // namespace ckpt::synth

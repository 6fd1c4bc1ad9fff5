// The ckpt-validate binary: exit codes, messages and output pinned by
// tests/tools/expected/validate/*.txt.
#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tools/inspect/fixture.h"

namespace ckpt::tools {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::TempDir;
using testing::ChunkOffset;
using testing::ExpectOutput;
using testing::FlipByte;
using ::testing::HasSubstr;
using testing::Normalize;
using testing::RunResult;
using testing::StandardSpec;
using testing::WriteCheckpoint;

RunResult Validate(const std::string& args, const TempDir& tmp) {
  return testing::Run(std::string(CKPT_VALIDATE_BIN) + " " + args, tmp.path());
}

TEST(ValidateCli, Valid) {
  TempDir tmp;
  WriteCheckpoint(tmp.path(), StandardSpec());
  RunResult r = Validate(tmp.path(), tmp);
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.err, "");
  ExpectOutput("validate", "valid.txt", Normalize(r.out, tmp.path()));
}

TEST(ValidateCli, QuickChecksMetadataOnly) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  FlipByte(dir + "/shard-00001.ckpt", ChunkOffset(dir, "layers.0.attn.w", 1));
  RunResult r = Validate(dir + " --quick", tmp);
  EXPECT_EQ(r.code, 0);
  ExpectOutput("validate", "quick.txt", Normalize(r.out, tmp.path()));
}

TEST(ValidateCli, CorruptedBlock) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  FlipByte(dir + "/shard-00001.ckpt", ChunkOffset(dir, "layers.0.attn.w", 1));
  RunResult r = Validate(tmp.path(), tmp);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "");
  ExpectOutput("validate", "corrupted_block.txt", Normalize(r.out, tmp.path()));
}

TEST(ValidateCli, MultipleProblems) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  FlipByte(dir + "/shard-00000.ckpt", ChunkOffset(dir, "embed.w", 0));
  fs::remove(dir + "/shard-00002.ckpt");
  fs::resize_file(dir + "/shard-00003.ckpt",
                  fs::file_size(dir + "/shard-00003.ckpt") - 1);
  fs::create_directory(tmp / ".tmp-step-00000008-00112233aabbccdd");
  RunResult r = Validate(tmp.path(), tmp);
  EXPECT_EQ(r.code, 1);
  ExpectOutput("validate", "multiple.txt", Normalize(r.out, tmp.path()));
}

// A warning alone shows but does not make the checkpoint invalid.
TEST(ValidateCli, StrayTempDirOnlyIsAWarningAndExitsZero) {
  TempDir tmp;
  WriteCheckpoint(tmp.path(), StandardSpec());
  fs::create_directory(tmp / ".tmp-step-00000008-00112233aabbccdd");
  RunResult r = Validate(tmp.path(), tmp);
  EXPECT_EQ(r.code, 0);
  ExpectOutput("validate", "stray_temp.txt", Normalize(r.out, tmp.path()));
}

TEST(ValidateCli, StrictMakesAWarningFail) {
  TempDir tmp;
  WriteCheckpoint(tmp.path(), StandardSpec());
  fs::create_directory(tmp / ".tmp-step-00000008-00112233aabbccdd");
  RunResult r = Validate(tmp.path() + " --strict", tmp);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("INVALID: 1 problem (0 errors, 1 warning)"));
  r = Validate(tmp.path() + " --strict --json", tmp);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(nlohmann::json::parse(r.out)["valid"], false);
}

TEST(ValidateCli, CheckFinite) {
  TempDir tmp;
  auto spec = StandardSpec();
  for (auto& t : spec.tensors) {
    if (t.name == "embed.w")
      t.data[2 * 5 + 1] = '\x7f', t.data[2 * 5] = '\xc0';  // bf16 NaN
  }
  WriteCheckpoint(tmp.path(), spec);
  EXPECT_EQ(Validate(tmp.path(), tmp).code, 0);
  RunResult r = Validate(tmp.path() + " --check-finite", tmp);
  EXPECT_EQ(r.code, 1);
  ExpectOutput("validate", "check_finite.txt", Normalize(r.out, tmp.path()));
}

TEST(ValidateCli, MissingDirectory) {
  TempDir tmp;
  RunResult r = Validate(tmp / "nope", tmp);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(Normalize(r.err, tmp.path()),
            "ckpt-validate: error: <TMP>/nope: no such checkpoint or "
            "checkpoint root\n");
}

TEST(ValidateCli, NotACheckpoint) {
  TempDir tmp;
  RunResult r = Validate(tmp.path(), tmp);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(Normalize(r.err, tmp.path()),
            "ckpt-validate: error: <TMP>: not a checkpoint (no MANIFEST) nor a "
            "checkpoint root "
            "(no 'latest')\n");
}

TEST(ValidateCli, CorruptManifestIsAFinding) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  fs::resize_file(dir + "/MANIFEST", fs::file_size(dir + "/MANIFEST") - 3);
  RunResult r = Validate(dir, tmp);
  EXPECT_EQ(r.code, 1);
  ExpectOutput("validate", "corrupt_manifest.txt",
               Normalize(r.out, tmp.path()));
}

TEST(ValidateCli, UsageErrors) {
  TempDir tmp;
  RunResult r = Validate(tmp.path() + " --quick --check-finite", tmp);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(
      r.err.rfind("ckpt-validate: error: --quick excludes --check-finite", 0),
      0u)
      << r.err;
  r = Validate("", tmp);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("DIR is required"), std::string::npos) << r.err;
  r = Validate(tmp.path() + " --bogus", tmp);
  EXPECT_EQ(r.code, 2);
}

TEST(ValidateCli, HelpAndVersion) {
  TempDir tmp;
  RunResult r = Validate("--version", tmp);
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(
      r.out.rfind("ckpt-validate 0.1.0 (ckpt library 0.1.0, format v1.0)", 0),
      0u)
      << r.out;
  r = Validate("--help", tmp);
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--check-finite"), std::string::npos);
}

TEST(ValidateCli, JsonReport) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  FlipByte(dir + "/shard-00001.ckpt", ChunkOffset(dir, "layers.0.attn.w", 1));
  RunResult r = Validate(tmp.path() + " --json", tmp);
  EXPECT_EQ(r.code, 1);
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["valid"], false);
  EXPECT_EQ(j["root"], tmp.path());
  EXPECT_EQ(j["checkpoint"], dir);
  EXPECT_EQ(j["format_version"], "1.0");
  EXPECT_EQ(j["step"], 7);
  EXPECT_EQ(j["world_size"], 4);
  EXPECT_EQ(j["errors"], 1);
  ASSERT_EQ(j["findings"].size(), 1u);
  const auto& f = j["findings"][0];
  EXPECT_EQ(f["severity"], "error");
  EXPECT_EQ(f["file"], dir + "/shard-00001.ckpt");
  EXPECT_EQ(f["entry"], "layers.0.attn.w");
  EXPECT_EQ(f["chunk"], 1);
  EXPECT_EQ(f["block"], 0);
  EXPECT_EQ(f["region"], "[0:4, 4:8]");
  EXPECT_TRUE(f["message"].get<std::string>().rfind("checksum 0x", 0) == 0);

  r = Validate(tmp / "nope --json", tmp);  // errors stay on stderr
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
}

}  // namespace
}  // namespace ckpt::tools

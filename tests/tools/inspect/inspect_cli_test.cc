// The ckpt-inspect binary: exit codes, messages and output pinned by
// tests/tools/expected/inspect/*.txt.
#include <filesystem>

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
using testing::Normalize;
using testing::RunResult;
using testing::StandardSpec;
using testing::WriteCheckpoint;

RunResult Inspect(const std::string& args, const TempDir& tmp) {
  return testing::Run(std::string(CKPT_INSPECT_BIN) + " " + args, tmp.path());
}

TEST(InspectCli, Default) {
  TempDir tmp;
  WriteCheckpoint(tmp.path(), StandardSpec());
  RunResult r = Inspect(tmp.path(), tmp);
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.err, "");
  ExpectOutput("inspect", "default.txt", Normalize(r.out, tmp.path()));
}

TEST(InspectCli, Entry) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  RunResult r = Inspect(dir + " --entry layers.0.attn.w.exp_avg", tmp);
  EXPECT_EQ(r.code, 0);
  ExpectOutput("inspect", "entry.txt", Normalize(r.out, tmp.path()));
}

TEST(InspectCli, Stats) {
  TempDir tmp;
  WriteCheckpoint(tmp.path(), StandardSpec());
  RunResult r = Inspect(tmp.path() + " --stats", tmp);
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.err, "");
  ExpectOutput("inspect", "stats.txt", Normalize(r.out, tmp.path()));
}

TEST(InspectCli, EntryStats) {
  TempDir tmp;
  WriteCheckpoint(tmp.path(), StandardSpec());
  RunResult r = Inspect(tmp.path() + " --entry lm_head.w --stats", tmp);
  EXPECT_EQ(r.code, 0);
  ExpectOutput("inspect", "entry_stats.txt", Normalize(r.out, tmp.path()));
}

TEST(InspectCli, UnknownEntry) {
  TempDir tmp;
  WriteCheckpoint(tmp.path(), StandardSpec());
  RunResult r = Inspect(tmp.path() + " --entry nope", tmp);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(Normalize(r.err, tmp.path()),
            "ckpt-inspect: error: entry 'nope' is not in the checkpoint "
            "<TMP>/step-00000007\n");
}

TEST(InspectCli, MissingDirectory) {
  TempDir tmp;
  RunResult r = Inspect(tmp / "nope", tmp);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(Normalize(r.err, tmp.path()),
            "ckpt-inspect: error: <TMP>/nope: no such checkpoint or checkpoint "
            "root\n");
}

TEST(InspectCli, NotACheckpoint) {
  TempDir tmp;
  RunResult r = Inspect(tmp.path(), tmp);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(Normalize(r.err, tmp.path()),
            "ckpt-inspect: error: <TMP>: not a checkpoint (no MANIFEST) nor a "
            "checkpoint root "
            "(no 'latest')\n");
}

TEST(InspectCli, TruncatedManifest) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  fs::resize_file(dir + "/MANIFEST", fs::file_size(dir + "/MANIFEST") - 3);
  RunResult r = Inspect(dir, tmp);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(Normalize(r.err, tmp.path()),
            "ckpt-inspect: error: <TMP>/step-00000007/MANIFEST: manifest: bad "
            "magic at offset "
            "852 (end of file): truncated or extended\n");
}

TEST(InspectCli, MetadataDoesNotNeedShards) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  fs::resize_file(dir + "/shard-00002.ckpt", 10);
  EXPECT_EQ(Inspect(dir, tmp).code, 0);
  RunResult r = Inspect(dir + " --stats", tmp);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(
      r.err.rfind(
          "ckpt-inspect: error: " + dir + "/shard-00002.ckpt: shard header", 0),
      0u)
      << r.err;
}

TEST(InspectCli, StatsOnCorruptedBlock) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  FlipByte(dir + "/shard-00001.ckpt", ChunkOffset(dir, "layers.0.attn.w", 1));
  FlipByte(dir + "/shard-00000.ckpt", ChunkOffset(dir, "embed.w", 0));
  RunResult r = Inspect(dir + " --stats", tmp);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  ExpectOutput("inspect", "stats_corrupted.txt", Normalize(r.err, tmp.path()));
}

TEST(InspectCli, Json) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  RunResult r = Inspect(tmp.path() + " --json", tmp);
  EXPECT_EQ(r.code, 0);
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["path"], dir);
  EXPECT_EQ(j["format_version"], "1.0");
  EXPECT_EQ(j["step"], 7);
  EXPECT_EQ(j["world_size"], 4);
  EXPECT_EQ(j["checkpoint_id"], "101112131415161718191a1b1c1d1e1f");
  EXPECT_EQ(j["created"], "2026-11-21T00:00:00.000Z");
  ASSERT_EQ(j["entries"].size(), 16u);
  for (const auto& e : j["entries"]) {
    EXPECT_TRUE(e.contains("name") && e.contains("dtype") &&
                e.contains("shape") && e.contains("chunks"))
        << e.dump();
  }
  const auto& exp_avg = j["entries"][5];
  EXPECT_EQ(exp_avg["name"], "layers.0.attn.w.exp_avg");
  EXPECT_EQ(exp_avg["dtype"], "float32");
  EXPECT_EQ(exp_avg["shape"], nlohmann::json::array({8, 8}));
  EXPECT_EQ(exp_avg["chunks"], 4);
  EXPECT_EQ(exp_avg["sharding"], "flat x4 uneven");

  r = Inspect(tmp.path() + " --json --stats --entry tokens", tmp);
  EXPECT_EQ(r.code, 0);
  j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["entries"].size(), 1u);
  EXPECT_EQ(j["entries"][0]["stats"]["max"], 300.0);
  EXPECT_EQ(j["entries"][0]["chunk_map"][0]["shard"], 1);
}

TEST(InspectCli, HelpAndVersion) {
  TempDir tmp;
  RunResult r = Inspect("--version", tmp);
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(
      r.out.rfind("ckpt-inspect 0.1.0 (ckpt library 0.1.0, format v1.0)", 0),
      0u)
      << r.out;
  r = Inspect("--help", tmp);
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--entry"), std::string::npos);
  r = Inspect("", tmp);
  EXPECT_EQ(r.code, 2);
}

}  // namespace
}  // namespace ckpt::tools

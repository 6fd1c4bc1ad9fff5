// Runs the ckpt-reshard binary: exit codes, exact error messages, human
// output pinned by tests/tools/expected/reshard/*.txt, and peak memory.
#include <filesystem>

#include "ckpt/reader.h"
#include "diff/diff.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "testing/status_matchers.h"
#include "tools/diff/cli_runner.h"

namespace ckpt::testing {
namespace {

class ReshardCliTest : public ::testing::Test {
 protected:
  CliResult Run(const std::vector<std::string>& args) {
    CliResult r = RunCli(CKPT_RESHARD_BIN, args, tmp_.path());
    r.out = ReplaceTmp(r.out, tmp_.path());
    r.err = ReplaceTmp(r.err, tmp_.path());
    return r;
  }
  std::string Src() const { return tmp_ / "src"; }
  std::string Dst() const { return tmp_ / "dst"; }

  void WriteModel() {
    std::vector<FixtureTensor> model = {
        {"emb", DType::kFloat32, {10, 4}, Layout::kRows, FloatRamp(40)},
        {"layers.0.w", DType::kBFloat16, {4, 8}, Layout::kGrid},
        {"layers.0.b", DType::kFloat32, {8}, Layout::kReplicated, FloatRamp(8)},
        {"opt.exp_avg",
         DType::kFloat32,
         {5, 5},
         Layout::kFlatUneven,
         FloatRamp(25)},
    };
    CKPT_ASSERT_OK(
        WriteFixture(Src(), 7, 4, model, {{"loader", "position=42", 2}}));
  }

  // Nothing committed into DST, nothing left behind.
  bool DstIsEmpty() const { return LeftoversIn(Dst()).empty(); }

  TempDir tmp_;
};

TEST_F(ReshardCliTest, SummaryIsPinned) {
  WriteModel();
  CliResult r = Run({Src(), Dst(), "--to", "2", "--from", "4"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ExpectOutput("reshard", "summary.txt", r.out);
  EXPECT_EQ(r.err, "");
}

TEST_F(ReshardCliTest, VerboseWithVerifyIsPinned) {
  WriteModel();
  WriteFileBytes(tmp_ / "layout.json",
                 R"({"entries": {"emb": {"split": "dim1"}}})");
  CliResult r = Run({Src(), Dst(), "--to", "3", "-v", "--verify", "--layout",
                     tmp_ / "layout.json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ExpectOutput("reshard", "verbose.txt", r.out);
}

TEST_F(ReshardCliTest, JsonDocument) {
  WriteModel();
  CliResult r = Run(
      {Src(), Dst(), "--to", "3", "--json", "--codec", "zstd", "--step", "9"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["src"]["path"], "<TMP>/src/step-00000007");
  EXPECT_EQ(j["src"]["step"], 7);
  EXPECT_EQ(j["src"]["world_size"], 4);
  EXPECT_EQ(j["dst"]["path"], "<TMP>/dst/step-00000009");
  EXPECT_EQ(j["dst"]["step"], 9);
  EXPECT_EQ(j["dst"]["world_size"], 3);
  EXPECT_EQ(j["step"], 9);
  EXPECT_EQ(j["codec"], "zstd");
  ASSERT_EQ(j["entries"].size(), 5u);
  EXPECT_EQ(j["entries"][0]["name"], "emb");
  EXPECT_EQ(j["entries"][0]["dtype"], "float32");
  EXPECT_EQ(j["entries"][0]["shape"], nlohmann::json::parse("[10, 4]"));
  EXPECT_EQ(j["entries"][0]["source"], "4 parts along dim0");
  EXPECT_EQ(j["entries"][0]["layout"], "dim0");
  EXPECT_EQ(j["entries"][0]["override"], false);
  EXPECT_EQ(j["entries"][3]["kind"], "object");
  EXPECT_EQ(j["tensor_bytes"], 40 * 4 + 32 * 2 + 8 * 4 + 25 * 4);
  EXPECT_EQ(j["object_bytes"], 11);
  EXPECT_TRUE(j["verify"].is_null());
}

// `ckpt-reshard r r --to 1 --step 2` (issue 28) said "r/step-00000007
// (step 2, ...)": the output's step printed as the source's.
TEST_F(ReshardCliTest, StepOptionIsShownAsTheOutputsNotTheSources) {
  WriteModel();
  CliResult r = Run({Src(), Src(), "--to", "1", "--step", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.substr(0, r.out.find('\n')),
            "resharded <TMP>/src/step-00000007 (step 7, 4 ranks) into "
            "<TMP>/src/step-00000002 (step 2, 1 rank)");
}

TEST_F(ReshardCliTest, WrongFromExitsTwo) {
  WriteModel();
  CliResult r = Run({Src(), Dst(), "--to", "2", "--from", "3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err,
            "ckpt-reshard: error: <TMP>/src/step-00000007: saved on 4 ranks, "
            "--from 3 given\n");
  EXPECT_TRUE(DstIsEmpty());
}

TEST_F(ReshardCliTest, MissingSourceExitsTwo) {
  CliResult r = Run({Src(), Dst(), "--to", "2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "ckpt-reshard: error: <TMP>/src: no such checkpoint or checkpoint "
            "root\n");
}

TEST_F(ReshardCliTest, NotACheckpointExitsTwo) {
  std::filesystem::create_directories(Src());
  CliResult r = Run({Src(), Dst(), "--to", "2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "ckpt-reshard: error: <TMP>/src: not a checkpoint (no MANIFEST) "
            "nor a checkpoint root "
            "(no 'latest')\n");
}

TEST_F(ReshardCliTest, IrregularLayoutExitsTwo) {
  FixtureTensor t{"odd", DType::kFloat32, {4, 4}, Layout::kRows};
  t.pieces = {BoxPiece({0, 0}, {2, 2}), BoxPiece({0, 2}, {2, 2}),
              BoxPiece({2, 0}, {2, 4})};
  CKPT_ASSERT_OK(WriteFixture(Src(), 1, 3, {t}));
  CliResult r = Run({Src(), Dst(), "--to", "2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "ckpt-reshard: error: entry 'odd': cannot infer its layout: its 3 "
            "chunks are not a "
            "regular grid (along dim1, a chunk starts at 0 where another part "
            "is); give it in an "
            "override file (--layout FILE)\n");
  EXPECT_TRUE(DstIsEmpty());
}

TEST_F(ReshardCliTest, BadLayoutFileExitsTwo) {
  WriteModel();
  WriteFileBytes(tmp_ / "layout.json",
                 "{\"entries\": {\"emb\": {\"split\": \"dim0\"},}}");
  CliResult r =
      Run({Src(), Dst(), "--to", "2", "--layout", tmp_ / "layout.json"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "ckpt-reshard: error: <TMP>/layout.json: line 1, column 39: syntax "
            "error while "
            "parsing object key - unexpected '}'; expected string literal\n");
  WriteFileBytes(tmp_ / "layout.json",
                 R"({"entries": {"emb": {"split": "dim2"}}})");
  r = Run({Src(), Dst(), "--to", "2", "--layout", tmp_ / "layout.json"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "ckpt-reshard: error: override emb -> dim2 for entry 'emb': the "
            "tensor has 2 dims "
            "(shape [10, 4])\n");
  r = Run({Src(), Dst(), "--to", "2", "--layout", tmp_ / "missing.json"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("<TMP>/missing.json"), std::string::npos) << r.err;
  EXPECT_TRUE(DstIsEmpty());
}

TEST_F(ReshardCliTest, CorruptedSourceExitsTwoAndCommitsNothing) {
  WriteModel();
  const std::string shard = Src() + "/step-00000007/shard-00003.ckpt";
  std::string bytes = ReadFileBytes(shard);
  bytes[4096] ^= 0x01;
  WriteFileBytes(shard, bytes);
  CliResult r = Run({Src(), Dst(), "--to", "2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.err.find("<TMP>/src/step-00000007/shard-00003.ckpt: block 0 of chunk "),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("checksum"), std::string::npos) << r.err;
  EXPECT_TRUE(DstIsEmpty());
}

TEST_F(ReshardCliTest, TruncatedSourceShardExitsTwo) {
  WriteModel();
  const std::string shard = Src() + "/step-00000007/shard-00001.ckpt";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 1);
  CliResult r = Run({Src(), Dst(), "--to", "2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("<TMP>/src/step-00000007/shard-00001.ckpt: file is "),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(DstIsEmpty());
}

TEST_F(ReshardCliTest, UsageErrorsExitTwo) {
  CliResult r = Run({Src(), Dst()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "ckpt-reshard: error: --to is required\nRun 'ckpt-reshard --help' "
            "for usage.\n");
  r = Run({Src(), Dst(), "--to", "0"});
  EXPECT_EQ(r.exit_code, 2);
  r = Run({Src(), Dst(), "--to", "2", "--codec", "lz4"});
  EXPECT_EQ(r.exit_code, 2);
  r = Run({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("ckpt-reshard ", 0), 0u);
}

// Writes a [rows, cols] float32 tensor saved as row blocks by `world` ranks,
// streamed from a generator so the test never holds it in memory.
absl::Status WriteLargeSource(const std::string& root, uint64_t rows,
                              uint64_t cols, int world) {
  InProcessWorld w(world);
  return RunRanks(w, [&](Communicator& comm) -> absl::Status {
    Writer::Options wo;
    wo.comm = &comm;
    CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
    const uint64_t r0 = rows * comm.rank() / world,
                   r1 = rows * (comm.rank() + 1) / world;
    const uint64_t base = r0 * cols * 4;
    CKPT_RETURN_IF_ERROR(writer->AddTensorSource(
        "w", DType::kFloat32, {rows, cols}, Box{{r0, 0}, {r1 - r0, cols}},
        [base](uint64_t offset, void* dst, uint64_t n) {
          auto* p = static_cast<uint8_t*>(dst);
          for (uint64_t i = 0; i < n; ++i)
            p[i] = static_cast<uint8_t>((base + offset + i) * 131 >> 3);
          return absl::OkStatus();
        }));
    return writer->Save(root, 1, SaveOptions{}).status();
  });
}

// Sanitizers' shadow memory and quarantine inflate the resident set.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

TEST_F(ReshardCliTest, PeakMemoryStaysFarBelowTheTensor) {
  if (kSanitized)
    GTEST_SKIP() << "peak RSS is not meaningful under a sanitizer";
  constexpr uint64_t kRows = 4096, kCols = 4096;  // 64 MiB of float32
  CKPT_ASSERT_OK(WriteLargeSource(Src(), kRows, kCols, 2));
  CliResult r = Run({Src(), Dst(), "--to", "3", "--threads", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const uint64_t tensor = kRows * kCols * 4;
  std::printf("peak RSS of ckpt-reshard on a %llu MiB tensor: %.1f MiB\n",
              static_cast<unsigned long long>(tensor >> 20),
              r.max_rss_bytes / 1048576.0);
  EXPECT_GT(r.max_rss_bytes, 0u);
  EXPECT_LT(r.max_rss_bytes, tensor / 2);
  tools::DiffOptions d;
  d.a = Src();
  d.b = Dst();
  d.progress = false;
  d.window_bytes = 8 << 20;
  auto diff = tools::Diff(d);
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_TRUE(diff->equal());
}

}  // namespace
}  // namespace ckpt::testing

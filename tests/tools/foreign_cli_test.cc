// ckpt-inspect, ckpt-validate and ckpt-diff on foreign inputs: the format
// detected and said, the output pinned by tests/tools/expected/interop/,
// and hostile files refused with a clear error and exit 1 or 2 (promptly:
// the runs that used to hang are watched by timeout(1)).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "testing/cli.h"
#include "testing/expected_output.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/convert/convert_fixture.h"

namespace ckpt::tools {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CliResult;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;

class ForeignCli : public ::testing::Test {
 protected:
  CliResult Run(const std::string& bin, std::vector<std::string> args) {
    for (auto& a : args) {
      a = absl::StrReplaceAll(a, {{"<TMP>", dir_.path()}, {"<DATA>", data_}});
    }
    CliResult r = ckpt::testing::RunCli(bin, args, dir_.path());
    EXPECT_NE(r.exit_code, -1) << r.err;
    for (std::string* s : {&r.out, &r.err}) {
      *s = absl::StrReplaceAll(*s, {{dir_.path(), "<TMP>"}, {data_, "<DATA>"}});
    }
    return r;
  }
  static std::string Expected(const std::string& name) {
    return ::ckpt::testing::ExpectedOutput("interop", name + ".txt");
  }
  TempDir dir_;
  const std::string data_ =
      std::string(CKPT_SOURCE_DIR) + "/tests/data/interop";
};

TEST_F(ForeignCli, InspectMegatronTorchDist) {
  CliResult r = Run(CKPT_INSPECT_BIN, {"<DATA>/megatron_torch_dist"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Expected("inspect_megatron"));
}

// A Megatron checkpoint whose common.pt cannot be read (here a directory)
// fails every tool with one line naming it, instead of aborting.
TEST_F(ForeignCli, UnreadableCommonStateFailsEveryToolNamingIt) {
  const fs::path copy = fs::path(dir_.path()) / "mt";
  fs::copy(data_ + "/megatron_torch_dist", copy);
  fs::remove(copy / "common.pt");
  fs::create_directory(copy / "common.pt");
  const std::string error = "<TMP>/mt/common.pt: not a regular file";
  for (const char* bin : {CKPT_INSPECT_BIN, CKPT_DIFF_BIN}) {
    std::vector<std::string> args = {"<TMP>/mt"};
    if (bin == std::string(CKPT_DIFF_BIN)) args.push_back("<TMP>/mt");
    CliResult r = Run(bin, args);
    EXPECT_EQ(r.exit_code, 2) << bin << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("error: " + error)) << bin;
  }
  CliResult convert =
      Run(CKPT_CONVERT_BIN, {"<TMP>/mt", "<TMP>/out", "--from", "dcp"});
  EXPECT_EQ(convert.exit_code, 2) << convert.err;
  EXPECT_THAT(convert.err, HasSubstr("error: " + error));
  EXPECT_FALSE(fs::exists(copy.parent_path() / "out"));
  CliResult validate = Run(CKPT_VALIDATE_BIN, {"<TMP>/mt"});
  EXPECT_EQ(validate.exit_code, 1) << validate.err;
  EXPECT_THAT(validate.out, HasSubstr("error: " + error));
}

TEST_F(ForeignCli, InspectDcpEntry) {
  CliResult r =
      Run(CKPT_INSPECT_BIN, {"<DATA>/dcp_torch213", "--entry", "model.w_cols"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Expected("inspect_dcp_entry"));
}

TEST_F(ForeignCli, InspectSafetensorsReferenceFile) {
  CliResult r =
      Run(CKPT_INSPECT_BIN, {"<DATA>/safetensors/overall.safetensors"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Expected("inspect_safetensors"));
}

// The --json reports of foreign inputs, pinned like the text ones.
TEST_F(ForeignCli, InspectJsonMegatronTorchDist) {
  CliResult r = Run(CKPT_INSPECT_BIN, {"<DATA>/megatron_torch_dist", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Expected("inspect_megatron_json"));
}

TEST_F(ForeignCli, InspectJsonSafetensorsReferenceFile) {
  CliResult r = Run(CKPT_INSPECT_BIN,
                    {"<DATA>/safetensors/overall.safetensors", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Expected("inspect_safetensors_json"));
}

TEST_F(ForeignCli, InspectStatsNeedsConversion) {
  CliResult r = Run(CKPT_INSPECT_BIN, {"<DATA>/dcp_torch213", "--stats"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "ckpt-inspect: error: --stats reads ckpt checkpoints; "
            "<DATA>/dcp_torch213 is dcp "
            "(convert it with ckpt-convert --from dcp first)\n");
}

TEST_F(ForeignCli, ValidateTorch113Dcp) {
  CliResult r = Run(CKPT_VALIDATE_BIN, {"<DATA>/dcp_torch113"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Expected("validate_dcp"));
}

TEST_F(ForeignCli, ValidateDamagedRecordNamesFileAndItem) {
  fs::copy(data_ + "/dcp_torch213", dir_ / "d", fs::copy_options::recursive);
  // Rank 1's file cut short: its last item now runs past the end.
  const uintmax_t size = fs::file_size(dir_ / "d/__1_0.distcp") - 1;
  fs::resize_file(dir_ / "d/__1_0.distcp", size);
  CliResult r = Run(CKPT_VALIDATE_BIN, {"<TMP>/d"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("error: <TMP>/d/__1_0.distcp: '"));
  EXPECT_THAT(r.out,
              HasSubstr(absl::StrCat("outside the file (", size, " bytes)")));
  EXPECT_THAT(r.out, HasSubstr("INVALID: 1 problem (1 error, 0 warnings)"));
}

TEST_F(ForeignCli, ValidateCompressedRecords) {
  CliResult r = Run(CKPT_VALIDATE_BIN, {"<DATA>/hostile/dcp_compressed"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(
      r.out,
      HasSubstr(
          "error: <DATA>/hostile/dcp_compressed/__0_0.distcp [2448, 3239) "
          "of 'model.norm': zip: entry 'archive/data.pkl' is compressed "
          "(method 8); torch.save stores entries\n"));
  EXPECT_THAT(r.out, HasSubstr("INVALID: 8 problems (8 errors, 0 warnings)"));
  r = Run(CKPT_CONVERT_BIN,
          {"<DATA>/hostile/dcp_compressed", "<TMP>/c", "--from", "dcp"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("is compressed (method 8)"));
  EXPECT_FALSE(fs::exists(dir_ / "c/latest"));
}

TEST_F(ForeignCli, DcpItemOutsideItsDirectory) {
  CliResult r = Run(CKPT_CONVERT_BIN,
                    {"<DATA>/hostile/dcp_outside", "<TMP>/c", "--from", "dcp"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "ckpt-convert: error: <DATA>/hostile/dcp_outside/.metadata: DCP "
            "metadata: "
            "'model.w_rows' is stored in '../__1_0.distcp', which is not a "
            "file inside the "
            "checkpoint directory\n");
}

TEST_F(ForeignCli, ValidateHostilePickle) {
  CliResult r = Run(CKPT_VALIDATE_BIN, {"<DATA>/hostile/dcp_os_system"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, Expected("validate_os_system"));
  EXPECT_FALSE(fs::exists("/tmp/ckpt-pwned"));
}

TEST_F(ForeignCli, ValidateIndexPointingOutside) {
  fs::create_directory(dir_ / "evil");
  std::ofstream(dir_ / "evil/model.safetensors.index.json")
      << R"({"metadata":{"total_size":1},"weight_map":{"w":"/etc/passwd"}})";
  CliResult r = Run(CKPT_VALIDATE_BIN, {"<TMP>/evil"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(
      r.out,
      "Format      safetensors\nChecked     header\nerror: "
      "<TMP>/evil/model.safetensors.index.json: weight_map entry of 'w' names "
      "'/etc/passwd', which is not a file inside the index's directory\n"
      "INVALID: 1 problem (1 error, 0 warnings)\n");
}

TEST_F(ForeignCli, DiffDcpAgainstItsConversionIsEqual) {
  ASSERT_EQ(
      Run(CKPT_CONVERT_BIN, {"<DATA>/dcp_torch113", "<TMP>/c", "--from", "dcp"})
          .exit_code,
      0);
  CliResult r = Run(CKPT_DIFF_BIN, {"<DATA>/dcp_torch113", "<TMP>/c"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Expected("diff_dcp"));
  // Nothing is left in the temporary directory.
}

// ckpt-diff converts a foreign input under TMPDIR: without a usable one it
// fails with one line saying so instead of aborting.
TEST_F(ForeignCli, DiffWithoutATemporaryDirectoryFailsWithOneLine) {
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old != nullptr ? old : "";
  setenv("TMPDIR", (dir_.path() + "/missing").c_str(), 1);
  CliResult r =
      Run(CKPT_DIFF_BIN, {"<DATA>/dcp_torch113", "<DATA>/dcp_torch113"});
  if (old != nullptr) {
    setenv("TMPDIR", saved.c_str(), 1);
  } else {
    unsetenv("TMPDIR");
  }
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err,
            "ckpt-diff: error: no temporary directory for the conversion of "
            "<DATA>/dcp_torch113: No such file or directory (TMPDIR)\n");
}

TEST_F(ForeignCli, DiffSafetensorsAgainstDcpFindsDifferences) {
  // The 2.13 and 1.13 fixtures hold the same values under the same names
  // but for model.tiny (2.13 only) and the bytes items (2.13 flattens the
  // dict extra.note); a safetensors export of one compared with the other
  // DCP differs there only.
  ASSERT_EQ(
      Run(CKPT_CONVERT_BIN, {"<DATA>/dcp_torch213", "<TMP>/c", "--from", "dcp"})
          .exit_code,
      0);
  ASSERT_EQ(Run(CKPT_CONVERT_BIN,
                {"<TMP>/c", "<TMP>/m.safetensors", "--to", "safetensors"})
                .exit_code,
            0);
  CliResult r =
      Run(CKPT_DIFF_BIN, {"<TMP>/m.safetensors", "<DATA>/dcp_torch113"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.out, HasSubstr("A: <TMP>/m.safetensors [safetensors] (step 0"));
  EXPECT_THAT(r.out, HasSubstr("B: <DATA>/dcp_torch113 [dcp] (step 0"));
  EXPECT_THAT(r.out, HasSubstr("extra.note"));
  EXPECT_THAT(r.out, HasSubstr("model.tiny"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("model.w_rows")));
}

// The DCP checkpoints written by real torch 2.13, in each FileSystemWriter
// layout that torch reads back, through every tool: inspected, valid,
// converted, equal to their conversion, resharded 2 -> 3 and equal again.
TEST_F(ForeignCli, Torch213LayoutsThroughEveryTool) {
  for (const std::string v :
       {"dcp_torch213", "dcp_torch213_item_files", "dcp_torch213_rank_local"}) {
    SCOPED_TRACE(v);
    const std::string dcp = "<DATA>/" + v, c = "<TMP>/" + v,
                      c3 = "<TMP>/" + v + "_3";
    CliResult inspect = Run(CKPT_INSPECT_BIN, {dcp});
    EXPECT_EQ(inspect.exit_code, 0) << inspect.err;
    EXPECT_THAT(inspect.out,
                HasSubstr("Entries       8 (6 tensors in 10 chunks, 2 bytes "
                          "items)"));
    EXPECT_THAT(inspect.out, HasSubstr("extra.note.name"));
    CliResult validate = Run(CKPT_VALIDATE_BIN, {dcp});
    EXPECT_EQ(validate.exit_code, 0) << validate.out;
    EXPECT_THAT(validate.out, HasSubstr("12 of 12 records read and verified"));
    CliResult convert = Run(CKPT_CONVERT_BIN, {dcp, c, "--from", "dcp"});
    ASSERT_EQ(convert.exit_code, 0) << convert.err;
    CliResult diff = Run(CKPT_DIFF_BIN, {dcp, c});
    EXPECT_EQ(diff.exit_code, 0) << diff.out << diff.err;
    EXPECT_THAT(diff.out, HasSubstr("result: equal (8 entries"));
    CliResult reshard =
        Run(CKPT_RESHARD_BIN, {c, c3, "--from", "2", "--to", "3"});
    ASSERT_EQ(reshard.exit_code, 0) << reshard.err;
    CliResult diff3 = Run(CKPT_DIFF_BIN, {c, c3});
    EXPECT_EQ(diff3.exit_code, 0) << diff3.out << diff3.err;
  }
}

// Real megatron-core 0.16.1 output through every tool: inspected (its
// SavePlans counted, the ShardedObject's ckpt name said), valid, converted,
// equal to its conversion, resharded 2 -> 3 and equal again.
TEST_F(ForeignCli, MegatronCore016ThroughEveryTool) {
  const std::string dcp = "<DATA>/megatron_torch_dist_real";
  CliResult inspect = Run(CKPT_INSPECT_BIN, {dcp});
  EXPECT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_EQ(inspect.out, Expected("inspect_megatron_real"));
  CliResult json = Run(CKPT_INSPECT_BIN, {dcp, "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const nlohmann::json j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["all_local_plans"], 2);
  EXPECT_EQ(j["data_files"], 4);
  EXPECT_EQ(j["entries"].back()["name"], "extra.note/shard_0_1");
  EXPECT_EQ(j["entries"].back()["converted_name"], "extra.note");
  EXPECT_EQ(j["entries"].back()["value"], "[{'epoch': 3, 'name': 'fixture'}]");
  CliResult validate = Run(CKPT_VALIDATE_BIN, {dcp});
  EXPECT_EQ(validate.exit_code, 0) << validate.out;
  EXPECT_THAT(validate.out, HasSubstr("4 data files, 9 of 9 records read and "
                                      "verified"));
  CliResult convert = Run(CKPT_CONVERT_BIN, {dcp, "<TMP>/c", "--from", "dcp"});
  ASSERT_EQ(convert.exit_code, 0) << convert.err;
  EXPECT_THAT(convert.out,
              HasSubstr("2 ranks (as saved), 7 entries (5 tensors in 8 chunks, "
                        "2 objects)"));
  CliResult entries = Run(CKPT_INSPECT_BIN, {"<TMP>/c"});
  EXPECT_THAT(entries.out, HasSubstr("\nextra.note      object"));
  EXPECT_THAT(entries.out,
              HasSubstr("megatron.sharded_objects = "
                        "{\"extra.note\":\"extra.note/shard_0_1\"}"));
  CliResult diff = Run(CKPT_DIFF_BIN, {dcp, "<TMP>/c"});
  EXPECT_EQ(diff.exit_code, 0) << diff.out << diff.err;
  EXPECT_THAT(diff.out, HasSubstr("result: equal (7 entries"));
  CliResult reshard = Run(CKPT_RESHARD_BIN,
                          {"<TMP>/c", "<TMP>/c3", "--from", "2", "--to", "3"});
  ASSERT_EQ(reshard.exit_code, 0) << reshard.err;
  CliResult diff3 = Run(CKPT_DIFF_BIN, {"<TMP>/c", "<TMP>/c3"});
  EXPECT_EQ(diff3.exit_code, 0) << diff3.out << diff3.err;
  CliResult diff_dcp3 = Run(CKPT_DIFF_BIN, {dcp, "<TMP>/c3"});
  EXPECT_EQ(diff_dcp3.exit_code, 0) << diff_dcp3.out << diff_dcp3.err;
}

// A DCP item whose name ckpt cannot hold (here a bytes item renamed
// "extra.note/name" in a copy of the 2.13 fixture) fails ckpt-convert and
// ckpt-diff promptly with one line naming the file and the item, exit 2,
// and is a finding of ckpt-validate. Both used to hang forever: rank 0 of
// the conversion failed while rank 1 waited for it in a collective. Run
// under timeout(1), so that a hang fails the test instead of stalling it.
TEST_F(ForeignCli, NameCkptRefusesFailsEveryToolPromptly) {
  fs::copy(data_ + "/dcp_torch213", dir_ / "d", fs::copy_options::recursive);
  std::string md = ::ckpt::testing::ReadFileBytes(dir_ / "d/.metadata");
  for (size_t at = md.find("extra.note.name"); at != std::string::npos;
       at = md.find("extra.note.name", at)) {
    md.replace(at, 15, "extra.note/name");
  }
  std::ofstream(dir_ / "d/.metadata", std::ios::binary | std::ios::trunc) << md;
  const std::string error =
      "error: <TMP>/d/.metadata: bytes item 'extra.note/name' cannot be a "
      "ckpt entry: invalid name 'extra.note/name': path separator\n";
  const std::vector<std::pair<const char*, std::vector<std::string>>> runs = {
      {CKPT_CONVERT_BIN, {"<TMP>/d", "<TMP>/out", "--from", "dcp"}},
      {CKPT_DIFF_BIN, {"<TMP>/d", "<TMP>/d"}}};
  for (const auto& [bin, args] : runs) {
    std::vector<std::string> watched = {"-k", "5", "60", bin};
    watched.insert(watched.end(), args.begin(), args.end());
    CliResult r = Run("/usr/bin/timeout", watched);
    EXPECT_NE(r.exit_code, 124) << bin << " hangs (killed after 60 s)";
    EXPECT_EQ(r.exit_code, 2) << bin << ": " << r.err;
    const std::string tool = fs::path(bin).filename().string();
    EXPECT_EQ(r.err, tool + ": " + error) << bin;
  }
  EXPECT_FALSE(fs::exists(dir_ / "out"));
  CliResult validate = Run(CKPT_VALIDATE_BIN, {"<TMP>/d"});
  EXPECT_EQ(validate.exit_code, 1) << validate.err;
  EXPECT_THAT(validate.out, HasSubstr(error));
  EXPECT_THAT(validate.out, HasSubstr("INVALID: 1 problem (1 error"));
}

// save(use_collectives=False) is said: its metadata is per rank.
TEST_F(ForeignCli, InspectTorch213RankLocalSaysSo) {
  CliResult r = Run(CKPT_INSPECT_BIN, {"<DATA>/dcp_torch213_rank_local"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out,
              HasSubstr("Format        PyTorch DCP "
                        "(torch.distributed.checkpoint.metadata; rank-local "
                        "metadata, 2 files)\n"));
  EXPECT_THAT(r.out, HasSubstr("World size    2 (from the data and metadata "
                               "file names)\n"));
}

// serialization_format=SAFETENSORS: inspected (its metadata is DCP's), but
// every tensor is a finding naming the writer option.
TEST_F(ForeignCli, ValidateTorch213SafetensorsSerializationNamesIt) {
  CliResult r = Run(CKPT_VALIDATE_BIN, {"<DATA>/dcp_torch213_safetensors"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out,
              HasSubstr("error: <DATA>/dcp_torch213_safetensors/__0_0.distcp "
                        "[0, 48) of 'model.w_rows': a safetensors file, not a "
                        "torch.save record: written by "
                        "FileSystemWriter(serialization_format=SAFETENSORS)"));
  EXPECT_THAT(r.out, HasSubstr("INVALID: 10 problems (10 errors, 0 warnings)"));
}

}  // namespace
}  // namespace ckpt::tools

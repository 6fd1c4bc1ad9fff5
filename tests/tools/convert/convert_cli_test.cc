// The ckpt-convert binary: exit codes, error messages, JSON, and the human
// output pinned by tests/tools/expected/convert/*.txt.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "interop/hdf5/h5_builder.h"
#include "nlohmann/json.hpp"
#include "testing/cli.h"
#include "testing/expected_output.h"
#include "testing/status_matchers.h"
#include "tools/convert/convert_fixture.h"

namespace ckpt::tools {
namespace {

using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;

using ::ckpt::testing::CliResult;

class ConvertCli : public ::testing::Test {
 protected:
  void SetUp() override {
    CKPT_ASSERT_OK(ckpt::testing::WriteFixture(ckpt::testing::MakeFixture(),
                                               dir_ / "src", 2));
  }

  // Runs ckpt-convert with `args`; "<TMP>" in an argument is the temporary
  // directory. In the results the temporary directory becomes <TMP> and the
  // HDF5 file size <SIZE> (it depends on the HDF5 library version).
  // `binary` replaces ckpt-convert (e.g. a shell that runs it).
  CliResult Run(std::vector<std::string> args,
                const std::string& binary = CKPT_CONVERT_BIN) {
    for (auto& a : args) a = absl::StrReplaceAll(a, {{"<TMP>", dir_.path()}});
    CliResult r = ckpt::testing::RunCli(binary, args, dir_.path());
    EXPECT_NE(r.exit_code, -1) << r.err;
    r.out = Scrub(r.out);
    r.err = Scrub(r.err);
    return r;
  }

  std::string Scrub(const std::string& text) {
    std::string s = ckpt::testing::ReplaceTmp(text, dir_.path());
    // "  hdf5: ..., file 77.2 KiB" ends its line.
    const std::string kFile = ", file ";
    for (size_t pos = s.find(kFile); pos != std::string::npos;
         pos = s.find(kFile, pos + 1)) {
      size_t end = s.find('\n', pos);
      s.replace(pos + kFile.size(), end - pos - kFile.size(), "<SIZE>");
    }
    return s;
  }

  static std::string Expected(const std::string& name) {
    return ckpt::testing::ExpectedOutput("convert", name + ".txt");
  }

  // An error run: nothing on stdout, exit 2, exactly `message` on stderr.
  void ExpectError(const std::vector<std::string>& args,
                   const std::string& message) {
    CliResult r = Run(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, message);
  }

  TempDir dir_;
};

TEST_F(ConvertCli, ExportOutput) {
  CliResult r = Run({"<TMP>/src", "<TMP>/out.h5", "--to", "hdf5"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out, Expected("export"));
}

TEST_F(ConvertCli, ExportVerboseOutputWithoutCompression) {
  CliResult r = Run({"<TMP>/src", "<TMP>/out.h5", "--to", "hdf5", "-v",
                     "--compression", "none"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Expected("export_verbose"));
}

TEST_F(ConvertCli, ImportOutput) {
  ASSERT_EQ(Run({"<TMP>/src", "<TMP>/out.h5", "--to", "hdf5"}).exit_code, 0);
  CliResult r = Run({"<TMP>/out.h5", "<TMP>/back", "--from", "hdf5"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out, Expected("import"));
  CKPT_EXPECT_OK(ckpt::testing::SameContent(dir_ / "src", dir_ / "back"));
}

TEST_F(ConvertCli, ImportVerboseOutputWithZstdAndAStep) {
  ASSERT_EQ(Run({"<TMP>/src", "<TMP>/out.h5", "--to", "hdf5", "--level", "9"})
                .exit_code,
            0);
  CliResult r = Run({"<TMP>/out.h5", "<TMP>/back", "--from", "hdf5",
                     "--verbose", "--codec", "zstd", "--step", "7"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Expected("import_verbose"));
}

TEST_F(ConvertCli, ImportSkippingUnsupported) {
  {
    ckpt::testing::H5Builder b(dir_ / "in.h5");
    float v[2] = {1, 2};
    b.Dataset("/ok", H5T_IEEE_F32LE, std::vector<hsize_t>{2}, v, H5P_DEFAULT,
              H5T_NATIVE_FLOAT);
    hid_t str = H5Tcopy(H5T_C_S1);
    H5Tset_size(str, H5T_VARIABLE);
    b.Dataset("/names", str, std::vector<hsize_t>{2});
    H5Tclose(str);
    hsize_t n = 2;
    hid_t space = H5Screate_simple(1, &n, nullptr);
    hid_t a = H5Acreate2(b.root(), "vec", H5T_IEEE_F64LE, space, H5P_DEFAULT,
                         H5P_DEFAULT);
    double d[2] = {1, 2};
    H5Awrite(a, H5T_NATIVE_DOUBLE, d);
    H5Aclose(a);
    H5Sclose(space);
  }
  ExpectError({"<TMP>/in.h5", "<TMP>/ckpt", "--from", "hdf5"},
              "ckpt-convert: error: <TMP>/in.h5: root attribute 'vec': "
              "expected a string or a "
              "1-d byte array, found float (8 bytes, 64-bit precision) with 2 "
              "elements\n");
  CliResult r = Run(
      {"<TMP>/in.h5", "<TMP>/ckpt", "--from", "hdf5", "--skip-unsupported"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Expected("import_skip"));
}

TEST_F(ConvertCli, ExportJson) {
  CliResult r = Run({"<TMP>/src", "<TMP>/out.h5", "--to", "hdf5", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["direction"], "export");
  EXPECT_EQ(j["format"], "hdf5");
  EXPECT_EQ(j["output"], "<TMP>/out.h5");
  EXPECT_EQ(j["checkpoint"], "<TMP>/src/step-00000042");
  EXPECT_EQ(j["step"], 42);
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["compression"], "deflate");
  EXPECT_EQ(j["level"], 4);
  EXPECT_EQ(j["tensors"], 23);
  EXPECT_EQ(j["objects"], 2);
  EXPECT_EQ(j["metadata_keys"], 6);
  EXPECT_EQ(j["file_bytes"], std::filesystem::file_size(dir_ / "out.h5"));
  ASSERT_EQ(j["entries"].size(), 25u);
  bool found = false;
  for (const auto& e : j["entries"]) {
    if (e["name"] != "opt.w") continue;
    found = true;
    EXPECT_EQ(e["path"], "/opt/w/.self");
    EXPECT_EQ(e["kind"], "tensor");
    EXPECT_EQ(e["dtype"], "float32");
    EXPECT_EQ(e["shape"], nlohmann::json({4, 4}));
    EXPECT_EQ(e["chunk"], nlohmann::json({4, 4}));
    EXPECT_EQ(e["bytes"], 64);
  }
  EXPECT_TRUE(found);
}

TEST_F(ConvertCli, ImportJson) {
  ASSERT_EQ(Run({"<TMP>/src", "<TMP>/out.h5", "--to", "hdf5"}).exit_code, 0);
  CliResult r = Run({"<TMP>/out.h5", "<TMP>/back", "--from", "hdf5", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["direction"], "import");
  EXPECT_EQ(j["input"], "<TMP>/out.h5");
  EXPECT_EQ(j["root"], "<TMP>/back");
  EXPECT_EQ(j["checkpoint"], "<TMP>/back/step-00000042");
  EXPECT_EQ(j["step"], 42);
  EXPECT_EQ(j["tensors"], 23);
  EXPECT_EQ(j["objects"], 2);
  EXPECT_EQ(j["entries"].size(), 25u);
  EXPECT_EQ(j["skipped"], nlohmann::json::array());
}

TEST_F(ConvertCli, HelpAndVersion) {
  CliResult r = Run({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("Usage: ckpt-convert [OPTIONS] SRC DST"));
  r = Run({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(
      r.out, HasSubstr("ckpt-convert 0.1.0 (ckpt library 0.1.0, format v1.0)"));
}

TEST_F(ConvertCli, NoDirection) {
  ExpectError({"<TMP>/src", "<TMP>/out.h5"},
              "ckpt-convert: error: give --to FORMAT (export a checkpoint) or "
              "--from FORMAT "
              "(import a file)\n");
}

TEST_F(ConvertCli, BothDirections) {
  ExpectError({"<TMP>/src", "<TMP>/out.h5", "--to", "hdf5", "--from", "hdf5"},
              "ckpt-convert: error: --to and --from exclude each other\n");
}

TEST_F(ConvertCli, WrongTo) {
  ExpectError(
      {"<TMP>/src", "<TMP>/out.st", "--to", "dcp"},
      "ckpt-convert: error: unknown format 'dcp' for --to; supported: hdf5, "
      "safetensors\n");
}

TEST_F(ConvertCli, WrongFrom) {
  ExpectError(
      {"<TMP>/in.npz", "<TMP>/ckpt", "--from", "npz"},
      "ckpt-convert: error: unknown format 'npz' for --from; supported: hdf5, "
      "safetensors, dcp\n");
}

TEST_F(ConvertCli, OptionOfTheOtherDirection) {
  ExpectError({"<TMP>/src", "<TMP>/out.h5", "--to", "hdf5", "--step", "3"},
              "ckpt-convert: error: --step applies to --from hdf5 only\n");
  ExpectError(
      {"<TMP>/in.h5", "<TMP>/ckpt", "--from", "hdf5", "--compression", "none"},
      "ckpt-convert: error: --compression applies to --to hdf5 only\n");
}

TEST_F(ConvertCli, UnknownCompressionAndCodec) {
  ExpectError(
      {"<TMP>/src", "<TMP>/out.h5", "--to", "hdf5", "--compression", "lzf"},
      "ckpt-convert: error: unknown compression 'lzf' for --compression; "
      "supported: "
      "none, deflate\n");
  ExpectError({"<TMP>/in.h5", "<TMP>/ckpt", "--from", "hdf5", "--codec", "lz4"},
              "ckpt-convert: error: unknown codec 'lz4' for --codec; "
              "supported: none, zstd\n");
}

TEST_F(ConvertCli, LevelOutOfRange) {
  ExpectError({"<TMP>/src", "<TMP>/out.h5", "--to", "hdf5", "--level", "12"},
              "ckpt-convert: error: --level: Value 12 not in range 0 to 9\n"
              "Run 'ckpt-convert --help' for usage.\n");
}

TEST_F(ConvertCli, ExportMissingDirectory) {
  ExpectError({"<TMP>/nothing", "<TMP>/out.h5", "--to", "hdf5"},
              "ckpt-convert: error: <TMP>/nothing: no such checkpoint or "
              "checkpoint root\n");
}

TEST_F(ConvertCli, ExportNotACheckpoint) {
  std::filesystem::create_directory(dir_ / "empty");
  ExpectError({"<TMP>/empty", "<TMP>/out.h5", "--to", "hdf5"},
              "ckpt-convert: error: <TMP>/empty: not a checkpoint (no "
              "MANIFEST) nor a checkpoint "
              "root (no 'latest')\n");
}

TEST_F(ConvertCli, ExportTruncatedShard) {
  const std::string shard = dir_ / "src/step-00000042/shard-00001.ckpt";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 10);
  CliResult r = Run({"<TMP>/src", "<TMP>/out.h5", "--to", "hdf5"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(
      r.err,
      HasSubstr(
          "ckpt-convert: error: <TMP>/src/step-00000042/shard-00001.ckpt: "
          "file is "));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "out.h5"));
}

TEST_F(ConvertCli, ExportCorruptedShard) {
  const std::string shard = dir_ / "src/step-00000042/shard-00000.ckpt";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096);  // the first payload block (default alignment)
    char c;
    f.read(&c, 1);
    f.seekp(4096);
    c ^= 0x5A;
    f.write(&c, 1);
  }
  CliResult r = Run({"<TMP>/src", "<TMP>/out.h5", "--to", "hdf5"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("<TMP>/src/step-00000042/shard-00000.ckpt"));
  EXPECT_THAT(r.err, HasSubstr("checksum"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "out.h5"));
}

// A file system that fills up while the HDF5 file is written (here the
// file size limit, RLIMIT_FSIZE, with SIGXFSZ ignored: writes fail with
// EFBIG as they would with ENOSPC). libhdf5 1.10 used to be left with a
// half-closed file that its exit handler then crashed on (SIGSEGV); the
// export must fail cleanly: exit 2, one line naming the output, the dataset
// and the errno text, and no file left behind.
TEST_F(ConvertCli, ExportOntoAFullDiskFailsWithOneLine) {
  for (const char* compression : {"none", "deflate"}) {
    SCOPED_TRACE(compression);
    // A limit of 4 KiB: the fixture's file is larger than that either way.
    CliResult r = Run({"-c", "ulimit -f 8; trap '' XFSZ; exec \"$0\" \"$@\"",
                       CKPT_CONVERT_BIN, "<TMP>/src", "<TMP>/out.h5", "--to",
                       "hdf5", "--compression", compression},
                      "/bin/sh");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_THAT(r.err,
                ::testing::StartsWith("ckpt-convert: error: <TMP>/out.h5: "));
    EXPECT_THAT(r.err, HasSubstr("dataset '/"));
    EXPECT_THAT(r.err, ::testing::EndsWith(": File too large\n"));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("HDF5")));
    std::vector<std::string> left;
    for (const auto& f : std::filesystem::directory_iterator(dir_.path())) {
      if (f.path().filename().string().rfind("out.h5", 0) == 0)
        left.push_back(f.path());
    }
    EXPECT_THAT(left, ::testing::IsEmpty());
  }
}

TEST_F(ConvertCli, ExportOutputExists) {
  std::ofstream(dir_ / "out.h5") << "x";
  ExpectError({"<TMP>/src", "<TMP>/out.h5", "--to", "hdf5"},
              "ckpt-convert: error: <TMP>/out.h5: already exists (use --force "
              "to replace it)\n");
  EXPECT_EQ(
      Run({"<TMP>/src", "<TMP>/out.h5", "--to", "hdf5", "--force"}).exit_code,
      0);
}

TEST_F(ConvertCli, ImportMissingFile) {
  ExpectError({"<TMP>/in.h5", "<TMP>/ckpt", "--from", "hdf5"},
              "ckpt-convert: error: <TMP>/in.h5: no such file\n");
}

TEST_F(ConvertCli, ImportNotHdf5) {
  ExpectError({"<TMP>/src/latest", "<TMP>/ckpt", "--from", "hdf5"},
              "ckpt-convert: error: <TMP>/src/latest: not an HDF5 file\n");
}

TEST_F(ConvertCli, ImportUnsupportedDataset) {
  {
    ckpt::testing::H5Builder b(dir_ / "in.h5");
    hid_t compound = H5Tcreate(H5T_COMPOUND, 8);
    H5Tinsert(compound, "re", 0, H5T_IEEE_F32LE);
    H5Tinsert(compound, "im", 4, H5T_IEEE_F32LE);
    b.Dataset("/fft/out", compound, std::vector<hsize_t>{3});
    H5Tclose(compound);
  }
  ExpectError({"<TMP>/in.h5", "<TMP>/ckpt", "--from", "hdf5"},
              "ckpt-convert: error: <TMP>/in.h5: dataset '/fft/out': "
              "unsupported HDF5 type "
              "compound (2 members)\n");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "ckpt"));
}

TEST_F(ConvertCli, ImportStepExists) {
  ASSERT_EQ(Run({"<TMP>/src", "<TMP>/out.h5", "--to", "hdf5"}).exit_code, 0);
  ExpectError({"<TMP>/out.h5", "<TMP>/src", "--from", "hdf5"},
              "ckpt-convert: error: <TMP>/src/step-00000042: a checkpoint of "
              "step 42 already "
              "exists (use --force to replace it)\n");
  CliResult r = Run({"<TMP>/out.h5", "<TMP>/src", "--from", "hdf5", "--force"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(ConvertCli, ImportIntoAFile) {
  ASSERT_EQ(Run({"<TMP>/src", "<TMP>/out.h5", "--to", "hdf5"}).exit_code, 0);
  ExpectError(
      {"<TMP>/out.h5", "<TMP>/src/latest", "--from", "hdf5"},
      "ckpt-convert: error: <TMP>/src/latest: exists and is not a directory (a "
      "checkpoint root)\n");
}

TEST_F(ConvertCli, SafetensorsExportOutput) {
  CliResult r =
      Run({"<TMP>/src", "<TMP>/m.safetensors", "--to", "safetensors", "-v"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out, Expected("safetensors_export"));
}

TEST_F(ConvertCli, SafetensorsShardsExportAndImportOutput) {
  CliResult r = Run({"<TMP>/src", "<TMP>/hf", "--to", "safetensors",
                     "--max-shard-size", "1KB", "--exclude", "*.exp_avg"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Expected("safetensors_export_shards"));
  r = Run({"<TMP>/hf", "<TMP>/back", "--from", "safetensors", "--ranks", "2",
           "-v"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out, Expected("safetensors_import"));
}

TEST_F(ConvertCli, SafetensorsOptionsOfOtherModes) {
  ExpectError(
      {"<TMP>/src", "<TMP>/m.safetensors", "--to", "safetensors", "--ranks",
       "2"},
      "ckpt-convert: error: --ranks applies to --from safetensors only\n");
  ExpectError({"<TMP>/m.safetensors", "<TMP>/c", "--from", "safetensors",
               "--max-shard-size", "1GB"},
              "ckpt-convert: error: --max-shard-size applies to --to "
              "safetensors only\n");
  ExpectError({"<TMP>/src", "<TMP>/o.h5", "--to", "hdf5", "--include", "x"},
              "ckpt-convert: error: --max-shard-size, --include, --exclude and "
              "--ranks apply to "
              "safetensors and dcp only\n");
  ExpectError({"<TMP>/src", "<TMP>/hf", "--to", "safetensors",
               "--max-shard-size", "big"},
              "ckpt-convert: error: size 'big' is not a positive number of "
              "bytes (e.g. 5GB, "
              "500MiB, 1000000)\n");
}

TEST_F(ConvertCli, SafetensorsHostileIndexExitsTwo) {
  std::filesystem::create_directory(dir_ / "evil");
  std::ofstream(dir_ / "evil/model.safetensors.index.json")
      << R"({"weight_map":{"w":"../../etc/passwd"}})";
  ExpectError({"<TMP>/evil", "<TMP>/c", "--from", "safetensors"},
              "ckpt-convert: error: <TMP>/evil/model.safetensors.index.json: "
              "weight_map entry of "
              "'w' names '../../etc/passwd', which is not a file inside the "
              "index's directory\n");
}

TEST_F(ConvertCli, DcpImportOutput) {
  const std::string dcp =
      std::string(CKPT_SOURCE_DIR) + "/tests/data/interop/dcp_torch113";
  CliResult r = Run({dcp, "<TMP>/c", "--from", "dcp", "-v"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(absl::StrReplaceAll(r.out, {{CKPT_SOURCE_DIR, "<SRC>"}}),
            Expected("dcp_import"));
}

TEST_F(ConvertCli, DcpImportJson) {
  const std::string dcp =
      std::string(CKPT_SOURCE_DIR) + "/tests/data/interop/megatron_torch_dist";
  CliResult r = Run({dcp, "<TMP>/c", "--from", "dcp", "--json", "--step", "7"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["direction"], "import");
  EXPECT_EQ(j["format"], "dcp");
  EXPECT_EQ(j["detected"], "Megatron torch_dist");
  EXPECT_EQ(j["module"], "torch.distributed.checkpoint.metadata");
  EXPECT_EQ(j["checkpoint"], "<TMP>/c/step-00000007");
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["tensors"], 5);
  EXPECT_EQ(j["objects"], 2);
  EXPECT_EQ(j["chunks"], 8);
  EXPECT_EQ(j["entries"][0]["name"], "common.pt");
  EXPECT_EQ(j["entries"][0]["kind"], "object");
}

TEST_F(ConvertCli, SafetensorsExportJson) {
  CliResult r =
      Run({"<TMP>/src", "<TMP>/hf", "--to", "safetensors", "--max-shard-size",
           "1KiB", "--include", "dtypes.*", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["format"], "safetensors");
  EXPECT_EQ(j["sharded"], true);
  EXPECT_EQ(j["max_shard_bytes"], 1024);
  EXPECT_EQ(j["tensors"], 15);
  EXPECT_EQ(j["objects"], 0);
  EXPECT_EQ(j["excluded"], 10);
  uint64_t total = 0;
  for (const auto& e : j["entries"]) total += e["bytes"].get<uint64_t>();
  EXPECT_EQ(j["total_size"], total);
  EXPECT_EQ(j["entries"][0]["dtype"], "BF16");
  EXPECT_EQ(j["files"][0]["name"], "model-00001-of-00002.safetensors");
}

}  // namespace
}  // namespace ckpt::tools

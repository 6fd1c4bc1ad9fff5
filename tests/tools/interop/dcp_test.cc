// PyTorch DCP and Megatron torch_dist into ckpt: the committed fixtures
// (real torch 1.13 output and the layout of current releases), a DCP
// checkpoint written by the installed torch at test time, and damaged or
// hostile directories.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/format/status_macros.h"
#include "diff/diff.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "interop/dcp_import.h"
#include "interop/dcp_reader.h"
#include "nlohmann/json.hpp"
#include "reshard/reshard.h"
#include "testing/cli.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/convert/convert_fixture.h"

namespace ckpt::tools {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;

std::string DataDir(const std::string& name) {
  return std::string(CKPT_SOURCE_DIR) + "/tests/data/interop/" + name;
}

double ElementAsDouble(DType d, const char* p) {
  switch (d) {
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DType::kInt32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::kInt64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return static_cast<double>(v);
    }
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      uint32_t bits = static_cast<uint32_t>(h) << 16;
      float v;
      std::memcpy(&v, &bits, 4);
      return v;
    }
    default:
      ADD_FAILURE() << "dtype " << DTypeName(d);
      return 0;
  }
}

// Every tensor of the checkpoint at `root` equals expected.json of `dcp`
// (the values make_dcp.py wrote, as float64).
void ExpectValues(const std::string& root, const std::string& dcp) {
  const nlohmann::json exp = nlohmann::json::parse(
      ::ckpt::testing::ReadFileBytes(dcp + "/expected.json"));
  auto reader = Reader::Open(root);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const auto& [name, t] : exp["tensors"].items()) {
    const format::EntryRecord* e = (*reader)->Find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(std::vector<uint64_t>(e->shape.begin(), e->shape.end()),
              t["shape"].get<std::vector<uint64_t>>())
        << name;
    auto bytes = ckpt::testing::ReadWhole(**reader, *e);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    const auto values = t["values"].get<std::vector<double>>();
    const int es = DTypeSize(e->dtype);
    ASSERT_EQ(bytes->size(), values.size() * es) << name;
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(ElementAsDouble(e->dtype, bytes->data() + i * es), values[i])
          << name << "[" << i << "]";
    }
  }
}

TEST(DcpImport, Torch113FixtureKeepsShardingAndValues) {
  TempDir dir;
  CKPT_ASSERT_OK_AND_ASSIGN(DcpImportResult r,
                            ImportDcp(DataDir("dcp_torch113"), dir / "c", {}));
  EXPECT_EQ(r.world_size, 2);
  EXPECT_EQ(r.format, "PyTorch DCP");
  EXPECT_EQ(r.module, "torch.distributed._shard.checkpoint.metadata");
  ExpectValues(dir / "c", DataDir("dcp_torch113"));
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir / "c"));
  EXPECT_EQ(reader->manifest().info.world_size, 2u);
  const format::EntryRecord* cols = reader->Find("model.w_cols");
  ASSERT_NE(cols, nullptr);
  ASSERT_EQ(cols->chunks.size(), 2u);
  EXPECT_EQ(std::get<Box>(cols->chunks[1].region).offset, (Dims{0, 2}));
  EXPECT_EQ(cols->chunks[1].shard, 1u);  // written by rank 1, as in the DCP
  CKPT_ASSERT_OK_AND_ASSIGN(std::string note, reader->ReadObject("extra.note"));
  EXPECT_EQ(DescribeTorchRecord(note), "{'epoch': 3, 'name': 'fixture'}");
}

TEST(DcpImport, CurrentReleaseLayout) {
  TempDir dir;
  CKPT_ASSERT_OK_AND_ASSIGN(DcpImportResult r,
                            ImportDcp(DataDir("dcp_modern"), dir / "c", {}));
  EXPECT_EQ(r.module, "torch.distributed.checkpoint.metadata");
  EXPECT_EQ(r.world_size, 2);
  ExpectValues(dir / "c", DataDir("dcp_modern"));
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir / "c"));
  EXPECT_EQ(
      reader->manifest().metadata,
      (format::Metadata{{"dcp.module", "torch.distributed.checkpoint.metadata"},
                        {"dcp.version", "1.0.0"},
                        {"dcp.checkpoint_id", "dcp_modern"}}));
}

TEST(DcpImport, MegatronTorchDist) {
  TempDir dir;
  CKPT_ASSERT_OK_AND_ASSIGN(
      DcpImportResult r,
      ImportDcp(DataDir("megatron_torch_dist"), dir / "c", {}));
  EXPECT_EQ(r.format, "Megatron torch_dist");
  ExpectValues(dir / "c", DataDir("megatron_torch_dist"));
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir / "c"));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string common,
                            reader->ReadObject("common.pt"));
  EXPECT_EQ(common, ::ckpt::testing::ReadFileBytes(
                        DataDir("megatron_torch_dist/common.pt")));
  EXPECT_EQ(DescribeTorchRecord(common),
            "{'iteration': 1000, 'checkpoint_version': 3, "
            "'num_floating_point_operations_so_far': 0}");
}

// The end-to-end check: a DCP checkpoint written by real PyTorch
// (the installed torch, at test time) converts to ckpt, reshards --from 2
// --to 3, and diffs equal against the conversion.
TEST(DcpImport, WrittenByInstalledTorchConvertsReshardsAndDiffsEqual) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  TempDir dir;
  ckpt::testing::CliResult py = ckpt::testing::RunCli(
      "/usr/bin/python3", {DataDir("make_dcp.py"), "real", dir / "dcp"},
      dir.path());
  if (py.exit_code != 0 &&
      py.err.find("No module named 'torch'") != std::string::npos) {
    GTEST_SKIP()
        << "torch is not installed (scripts/setup installs python3-torch)";
  }
  ASSERT_EQ(py.exit_code, 0) << py.err;
  CKPT_ASSERT_OK_AND_ASSIGN(DcpImportResult r,
                            ImportDcp(dir / "dcp", dir / "c", {}));
  EXPECT_EQ(r.world_size, 2);
  ExpectValues(dir / "c", dir / "dcp");
  ReshardOptions ro;
  ro.src = dir / "c";
  ro.dst = dir / "c3";
  ro.from = 2;
  ro.to = 3;
  ro.progress = false;
  CKPT_ASSERT_OK(Reshard(ro).status());
  DiffOptions d;
  d.a = dir / "c";
  d.b = dir / "c3";
  d.progress = false;
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport diff, Diff(d));
  EXPECT_TRUE(diff.equal());
  ExpectValues(dir / "c3", dir / "dcp");
}

class DamagedDcp : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::copy(DataDir("dcp_modern"), dir_ / "d", fs::copy_options::recursive);
  }
  TempDir dir_;
};

TEST_F(DamagedDcp, MissingDataFile) {
  fs::remove(dir_ / "d/__1_0.distcp");
  EXPECT_THAT(OpenDcp(dir_ / "d"),
              StatusIs(absl::StatusCode::kNotFound, "__1_0.distcp"));
}

TEST_F(DamagedDcp, TruncatedDataFile) {
  fs::resize_file(dir_ / "d/__1_0.distcp", 100);
  EXPECT_THAT(OpenDcp(dir_ / "d"), StatusIs(absl::StatusCode::kDataLoss,
                                            "outside the file (100 bytes)"));
}

TEST_F(DamagedDcp, FlippedByteFailsItsCrc) {
  // The last byte of the first record's tensor data (before its central
  // directory), found through the reader.
  CKPT_ASSERT_OK_AND_ASSIGN(auto in, OpenDcp(dir_ / "d"));
  const interop::DcpStorage* s = in->chunk_storage.at("model.w_rows")[0];
  const std::string path = dir_ / ("d/" + s->relative_path);
  std::string bytes = ::ckpt::testing::ReadFileBytes(path);
  const size_t at =
      bytes.find("archive/data/0", s->offset) + 14 + 64;  // into the data
  ASSERT_LT(at, s->offset + s->length);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(bytes[at] ^ 0x40));
  f.close();
  EXPECT_THAT(ImportDcp(dir_ / "d", dir_ / "c", {}),
              StatusIs(absl::StatusCode::kDataLoss, "CRC-32"));
}

TEST(DcpImport, PickleCallingOsSystemExitsCleanly) {
  TempDir dir;
  EXPECT_THAT(ImportDcp(DataDir("hostile/dcp_os_system"), dir / "c", {}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "pickle global 'posix.system' is not allowed"));
  EXPECT_FALSE(fs::exists("/tmp/ckpt-pwned"));
}

}  // namespace
}  // namespace ckpt::tools

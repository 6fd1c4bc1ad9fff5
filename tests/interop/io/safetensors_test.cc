// Export to safetensors (one file and Hugging Face shards) and import back:
// exact round trips of every dtype, objects and metadata; the reference
// implementation's sample file; hostile and inconsistent indexes.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/escaping.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/interop/io/safetensors_export.h"
#include "ckpt/interop/io/safetensors_import.h"
#include "ckpt/testing/forwarding_storage.h"
#include "ckpt/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "testing/cli.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/convert/convert_fixture.h"

namespace ckpt::interop {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;

class SafetensorsTools : public ::testing::Test {
 protected:
  void SetUp() override {
    CKPT_ASSERT_OK(
        ckpt::testing::WriteFixture(ckpt::testing::MakeFixture(), src_, 3));
  }
  TempDir dir_;
  const std::string src_ = (dir_ / "src");
};

TEST_F(SafetensorsTools, OneFileRoundTripIsExact) {
  const std::string out = (dir_ / "m.safetensors");
  CKPT_ASSERT_OK_AND_ASSIGN(SafetensorsExportResult e,
                            ExportSafetensors(src_, out, {}));
  EXPECT_EQ(e.files.size(), 1u);
  EXPECT_EQ(e.entries.size(), 25u);
  CKPT_ASSERT_OK_AND_ASSIGN(SafetensorsImportResult r,
                            ImportSafetensors(out, (dir_ / "back"), {}));
  EXPECT_EQ(r.step, 42u);
  CKPT_EXPECT_OK(ckpt::testing::SameContent(src_, (dir_ / "back")));
}

// Windows far smaller than the tensors, and of sizes that are no multiple
// of any element size: tensors are cut into flat pieces at odd places and
// windows hold the ends and starts of several of them.
TEST_F(SafetensorsTools, SmallWindowsRoundTripIsExact) {
  for (uint64_t slab : {1, 7, 100, 4099}) {
    SCOPED_TRACE(slab);
    const std::string name = "m" + std::to_string(slab);
    SafetensorsExportOptions o;
    o.slab_bytes = slab;
    CKPT_ASSERT_OK(
        ExportSafetensors(src_, dir_ / (name + ".safetensors"), o).status());
    CKPT_ASSERT_OK(
        ImportSafetensors(dir_ / (name + ".safetensors"), dir_ / name, {})
            .status());
    CKPT_EXPECT_OK(ckpt::testing::SameContent(src_, dir_ / name));
  }
}

// Windows end at block boundaries of chunks that are one run of the
// tensor's flattening where one fits (9000-byte windows over 4 KiB blocks):
// no block is read twice, so the export reads no more than the
// checkpoint's files hold. Cut where they fill, most windows would split a
// block and read it once more (about 1.45x the data).
TEST_F(SafetensorsTools, WindowsEndAtBlockBoundariesSoEachBlockIsReadOnce) {
  std::vector<float> w(256 * 1024);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  const std::string src = (dir_ / "rows");
  {
    CKPT_ASSERT_OK_AND_ASSIGN(auto writer, Writer::Create({}));
    CKPT_ASSERT_OK(writer->AddTensor("w", DType::kFloat32, {256, 1024},
                                     FullBox({256, 1024}), w.data()));
    SaveOptions so;
    so.block_size = 4096;
    CKPT_ASSERT_OK(writer->Save(src, 1, so).status());
  }
  uint64_t files = 0;
  for (const auto& f : fs::directory_iterator(src + "/step-00000001")) {
    files += fs::file_size(f.path());
  }
  ckpt::testing::ReadCountingStorage counting;
  SafetensorsExportOptions o;
  o.slab_bytes = 9000;
  o.storage = &counting;
  const std::string out = (dir_ / "rows.safetensors");
  CKPT_ASSERT_OK(ExportSafetensors(src, out, o).status());
  EXPECT_GE(counting.bytes_read(), w.size() * sizeof(float));
  EXPECT_LE(counting.bytes_read(), files);
  CKPT_ASSERT_OK(ImportSafetensors(out, dir_ / "back", {}).status());
  CKPT_EXPECT_OK(ckpt::testing::SameContent(src, dir_ / "back"));
}

// A flipped byte in a stored block fails the export with the block's
// place, and leaves neither the output nor its temporary file. The byte is
// found by content: the tensor's bytes are stored as they are.
TEST_F(SafetensorsTools, CorruptBlockFailsAndLeavesNothing) {
  std::vector<float> w(64 * 1024);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) + 0.5f;
  const std::string src = (dir_ / "one");
  {
    CKPT_ASSERT_OK_AND_ASSIGN(auto writer, Writer::Create({}));
    CKPT_ASSERT_OK(writer->AddTensor("w", DType::kFloat32, {64, 1024},
                                     FullBox({64, 1024}), w.data()));
    CKPT_ASSERT_OK(writer->Save(src, 1, {}).status());
  }
  const std::string shard = "shard-00000.ckpt";
  {
    const std::string path = (dir_ / "one/step-00000001/") + shard;
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    const std::string s((std::istreambuf_iterator<char>(io)),
                        std::istreambuf_iterator<char>());
    const size_t at = s.find(std::string(
        reinterpret_cast<const char*>(w.data() + 40000), 4 * sizeof(float)));
    ASSERT_NE(at, std::string::npos);
    io.clear();
    io.seekp(static_cast<std::streamoff>(at));
    io.put(static_cast<char>(s[at] ^ 0xFF));
  }
  const std::string out = (dir_ / "m.safetensors");
  auto e = ExportSafetensors(src, out, {});
  EXPECT_THAT(e, StatusIs(absl::StatusCode::kDataLoss, shard));
  EXPECT_THAT(e, StatusIs(absl::StatusCode::kDataLoss, "of 'w'"));
  for (const auto& f : fs::directory_iterator(dir_.path())) {
    EXPECT_EQ(f.path().filename().string().rfind("m.safetensors", 0),
              std::string::npos)
        << f.path();
  }
}

TEST_F(SafetensorsTools, ShardsRoundTripIsExactAndIndexIsHuggingFaces) {
  const std::string out = (dir_ / "hf");
  SafetensorsExportOptions o;
  o.max_shard_bytes = 200;
  CKPT_ASSERT_OK_AND_ASSIGN(SafetensorsExportResult e,
                            ExportSafetensors(src_, out, o));
  ASSERT_GT(e.files.size(), 2u);
  nlohmann::json index = nlohmann::json::parse(
      ::ckpt::testing::ReadFileBytes(out + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), e.total_size);
  for (const auto& x : e.entries) {
    EXPECT_EQ(index["weight_map"][x.name].get<std::string>(), x.file) << x.name;
  }
  for (size_t i = 0; i < e.files.size(); ++i) {
    EXPECT_TRUE(
        fs::exists(out + "/" + interop::HfShardName(i, e.files.size())));
  }
  // Every shard but the last is within the limit unless it holds one entry.
  uint64_t total = 0;
  for (const auto& x : e.entries) total += x.bytes;
  EXPECT_EQ(total, e.total_size);
  CKPT_ASSERT_OK(ImportSafetensors(out, (dir_ / "back"), {}).status());
  CKPT_EXPECT_OK(ckpt::testing::SameContent(src_, (dir_ / "back")));
}

// The shards of transformers' save_pretrained (huggingface_hub's
// split_state_dict_into_shards_factory, checked against the real one by
// python/tests/test_interop_hf.py): an entry larger than the limit is a
// shard of its own where it is reached, and the entries after it go on
// filling the shard that was open.
TEST_F(SafetensorsTools, ShardsArePlannedAsHuggingfaceHub) {
  CKPT_ASSERT_OK_AND_ASSIGN(auto writer, Writer::Create(Writer::Options{}));
  const std::string bytes(500, '\x5a');
  for (const auto& [name, n] :
       std::vector<std::pair<std::string, uint64_t>>{{"a", 100},
                                                     {"b", 100},
                                                     {"c_big", 500},
                                                     {"d", 100},
                                                     {"e", 100},
                                                     {"f", 100}}) {
    CKPT_ASSERT_OK(writer->AddTensor(name, DType::kUInt8, {n}, FullBox({n}),
                                     bytes.data()));
  }
  const std::string src = (dir_ / "plan");
  CKPT_ASSERT_OK(writer->Save(src, 1, SaveOptions{}).status());
  SafetensorsExportOptions o;
  o.max_shard_bytes = 250;
  const std::string out = (dir_ / "plan-hf");
  CKPT_ASSERT_OK_AND_ASSIGN(SafetensorsExportResult e,
                            ExportSafetensors(src, out, o));
  std::map<std::string, std::string> files;
  for (const auto& x : e.entries) files[x.name] = x.file;
  const auto shard = [](size_t i) { return interop::HfShardName(i, 4); };
  EXPECT_EQ(files, (std::map<std::string, std::string>{{"c_big", shard(0)},
                                                       {"a", shard(1)},
                                                       {"b", shard(1)},
                                                       {"d", shard(2)},
                                                       {"e", shard(2)},
                                                       {"f", shard(3)}}));
  CKPT_ASSERT_OK(ImportSafetensors(out, (dir_ / "plan-back"), {}).status());
  CKPT_EXPECT_OK(ckpt::testing::SameContent(src, (dir_ / "plan-back")));
}

TEST_F(SafetensorsTools, ImportOnThreeRanksInfersLayoutsAsReshard) {
  const std::string out = (dir_ / "m.safetensors");
  CKPT_ASSERT_OK(ExportSafetensors(src_, out, {}).status());
  SafetensorsImportOptions io;
  io.ranks = 3;
  CKPT_ASSERT_OK_AND_ASSIGN(SafetensorsImportResult r,
                            ImportSafetensors(out, (dir_ / "back"), io));
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(r.checkpoint));
  EXPECT_EQ(reader->manifest().info.world_size, 3u);
  CKPT_EXPECT_OK(ckpt::testing::SameContent(src_, (dir_ / "back")));
  EXPECT_FALSE(
      fs::exists(dir_ / ("back.import-tmp-" + std::to_string(::getpid()))));
}

TEST_F(SafetensorsTools, IncludeAndExcludeSelectEntries) {
  SafetensorsExportOptions o;
  o.include = {"dtypes.*", "opt.*"};
  o.exclude = {"*.exp_avg", "dtypes.float8*"};
  CKPT_ASSERT_OK_AND_ASSIGN(
      SafetensorsExportResult e,
      ExportSafetensors(src_, (dir_ / "m.safetensors"), o));
  std::vector<std::string> names;
  for (const auto& x : e.entries) names.push_back(x.name);
  EXPECT_THAT(names, ::testing::Contains("opt.w"));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains("opt.w.exp_avg")));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains("dtypes.float8_e5m2")));
  EXPECT_EQ(names.size(), 14u);  // 13 dtypes + opt.w
  EXPECT_EQ(e.excluded, 11u);
}

TEST_F(SafetensorsTools, GlobsSelectingNothing) {
  SafetensorsExportOptions o;
  o.include = {"nothing*"};
  EXPECT_THAT(ExportSafetensors(src_, (dir_ / "m.safetensors"), o),
              StatusIs(absl::StatusCode::kInvalidArgument, "select no entry"));
  EXPECT_FALSE(fs::exists(dir_ / "m.safetensors"));
}

TEST_F(SafetensorsTools, ExistingOutputNeedsForce) {
  const std::string out = (dir_ / "m.safetensors");
  ::ckpt::testing::WriteFileBytes(out, "old");
  EXPECT_THAT(ExportSafetensors(src_, out, {}),
              StatusIs(absl::StatusCode::kAlreadyExists, "use --force"));
  SafetensorsExportOptions o;
  o.overwrite = true;
  CKPT_EXPECT_OK(ExportSafetensors(src_, out, o).status());
  EXPECT_NE(::ckpt::testing::ReadFileBytes(out), "old");
}

// `ckpt-convert SRC DIR --to safetensors --max-shard-size S --force` used to
// replace DIR whole, deleting files ckpt never wrote (issue 28): a shard
// directory holding any other file is refused, naming it, and kept.
TEST_F(SafetensorsTools, ForceKeepsADirectoryWithUnrelatedFiles) {
  const std::string out = (dir_ / "hf");
  SafetensorsExportOptions o;
  o.max_shard_bytes = 200;
  o.overwrite = true;
  CKPT_ASSERT_OK(ExportSafetensors(src_, out, o).status());
  ::ckpt::testing::WriteFileBytes(out + "/config.json", "{}");
  ::ckpt::testing::WriteFileBytes(out + "/tokenizer.json", "{}");
  EXPECT_THAT(ExportSafetensors(src_, out, o),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       out + ": holds 'config.json' and 1 more, not written "
                             "by ckpt-convert"));
  EXPECT_EQ(::ckpt::testing::ReadFileBytes(out + "/config.json"), "{}");
  EXPECT_EQ(::ckpt::testing::ReadFileBytes(out + "/tokenizer.json"), "{}");
  EXPECT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
}

TEST_F(SafetensorsTools, ForceRefusesADirectoryWithASubdirectory) {
  const std::string out = (dir_ / "hf");
  fs::create_directories(out + "/model-00001-of-00001.safetensors");
  SafetensorsExportOptions o;
  o.max_shard_bytes = 200;
  o.overwrite = true;
  EXPECT_THAT(
      ExportSafetensors(src_, out, o),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               "holds 'model-00001-of-00001.safetensors', not written"));
  EXPECT_TRUE(fs::is_directory(out + "/model-00001-of-00001.safetensors"));
}

// A previous export's shards (another count) and index are replaced.
TEST_F(SafetensorsTools, ForceReplacesAPreviousExport) {
  const std::string out = (dir_ / "hf");
  SafetensorsExportOptions o;
  o.max_shard_bytes = 200;
  o.overwrite = true;
  CKPT_ASSERT_OK(ExportSafetensors(src_, out, o).status());
  o.max_shard_bytes = 1 << 20;
  CKPT_ASSERT_OK_AND_ASSIGN(SafetensorsExportResult e,
                            ExportSafetensors(src_, out, o));
  ASSERT_EQ(e.files.size(), 1u);
  std::vector<std::string> names;
  for (const auto& f : fs::directory_iterator(out))
    names.push_back(f.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"model-00001-of-00001.safetensors",
                                             "model.safetensors.index.json"}));
}

TEST_F(SafetensorsTools, ReferenceSampleFileImports) {
  const std::string in = std::string(CKPT_SOURCE_DIR) +
                         "/tests/data/interop/safetensors/overall.safetensors";
  CKPT_ASSERT_OK_AND_ASSIGN(SafetensorsImportResult r,
                            ImportSafetensors(in, (dir_ / "ref"), {}));
  EXPECT_EQ(r.entries.size(), 9u);
  EXPECT_EQ(r.step, 0u);
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open((dir_ / "ref")));
  EXPECT_EQ(reader->manifest().metadata, (format::Metadata{{"test", "a"}}));
  const format::EntryRecord* f = reader->Find("f");
  ASSERT_NE(f, nullptr);
  CKPT_ASSERT_OK_AND_ASSIGN(std::string bytes,
                            ckpt::testing::ReadWhole(*reader, *f));
  std::vector<float> v(6);
  std::memcpy(v.data(), bytes.data(), 24);
  EXPECT_EQ(v, (std::vector<float>{-3, -2, -1, 0, 1, 2}));
}

class HostileIndex : public SafetensorsTools {
 protected:
  void SetUp() override {
    SafetensorsTools::SetUp();
    SafetensorsExportOptions o;
    o.max_shard_bytes = 200;
    auto e = ExportSafetensors(src_, hf_, o);
    ASSERT_TRUE(e.ok()) << e.status();
    exported_ = *std::move(e);
  }
  void Rewrite(const std::function<void(nlohmann::json&)>& edit) {
    const std::string path = hf_ + "/model.safetensors.index.json";
    nlohmann::json j =
        nlohmann::json::parse(::ckpt::testing::ReadFileBytes(path));
    edit(j);
    ::ckpt::testing::WriteFileBytes(path, j.dump());
  }
  const std::string hf_ = (dir_ / "hf");
  SafetensorsExportResult exported_;
};

TEST_F(HostileIndex, FileOutsideItsDirectory) {
  ::ckpt::testing::WriteFileBytes((dir_ / "outside.safetensors"), "x");
  Rewrite([](nlohmann::json& j) {
    j["weight_map"]["opt.w"] = "../outside.safetensors";
  });
  EXPECT_THAT(ImportSafetensors(hf_, (dir_ / "b"), {}),
              StatusIs(absl::StatusCode::kDataLoss,
                       "weight_map entry of 'opt.w' names "
                       "'../outside.safetensors', which is not "
                       "a file inside the index's directory"));
}

TEST_F(HostileIndex, TensorMappedToTheWrongShard) {
  Rewrite([&](nlohmann::json& j) {
    const std::string own = j["weight_map"]["dtypes.bool"].get<std::string>();
    for (const auto& [_, file] : j["weight_map"].items()) {
      if (file != own) {
        j["weight_map"]["dtypes.bool"] = file;
        break;
      }
    }
  });
  EXPECT_THAT(ImportSafetensors(hf_, (dir_ / "b"), {}),
              StatusIs(absl::StatusCode::kDataLoss, "but mapped to"));
}

TEST_F(HostileIndex, TensorMissingFromTheIndex) {
  Rewrite([](nlohmann::json& j) { j["weight_map"].erase("opt.w"); });
  EXPECT_THAT(ImportSafetensors(hf_, (dir_ / "b"), {}),
              StatusIs(absl::StatusCode::kDataLoss, "tensor 'opt.w' of"));
}

TEST_F(HostileIndex, MissingShard) {
  const std::string shard = interop::HfShardName(1, exported_.files.size());
  fs::remove(hf_ + "/" + shard);
  EXPECT_THAT(ImportSafetensors(hf_, (dir_ / "b"), {}),
              StatusIs(absl::StatusCode::kNotFound, shard));
}

TEST_F(SafetensorsTools, ObjectMarkerOnAWideTensor) {
  const std::string path = (dir_ / "x.safetensors");
  CKPT_ASSERT_OK_AND_ASSIGN(
      std::string head,
      interop::EncodeSafetensorsHeader({{"w", DType::kFloat32, {1}, 0, 4}},
                                       {{"ckpt.objects", "[\"w\"]"}}));
  ::ckpt::testing::WriteFileBytes(path, head + std::string(4, '\0'));
  EXPECT_THAT(ImportSafetensors(path, (dir_ / "b"), {}),
              StatusIs(absl::StatusCode::kDataLoss,
                       "listed in ckpt.objects but is not 1-d U8"));
}

TEST_F(SafetensorsTools, FifoInPlaceOfAShardIsRefusedWithoutBlocking) {
  const std::string fifo = (dir_ / "x.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_THAT(
      ImportSafetensors(fifo, (dir_ / "b"), {}),
      StatusIs(absl::StatusCode::kFailedPrecondition, "not a regular file"));
}

// An independent reader (Python's json and struct, no safetensors package)
// checks the exported file against the specification: header length,
// padding to 8 bytes, __metadata__ first, contiguous offsets, and the
// values of one tensor.
TEST_F(SafetensorsTools, IndependentPythonReaderAgrees) {
  const std::string python = ckpt::testing::TestPython();
  if (python.empty())
    GTEST_SKIP() << "no Python interpreter (run scripts/setup)";
  const std::string out = (dir_ / "m.safetensors");
  CKPT_ASSERT_OK(ExportSafetensors(src_, out, {}).status());
  const std::string script = R"PY(
import json, struct, sys
b = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
assert n % 8 == 0, n
h = json.loads(b[8:8 + n])
assert list(h)[0] == '__metadata__', list(h)[0]
meta = h.pop('__metadata__')
assert meta['format'] == 'pt' and meta['ckpt.step'] == '42', meta
spans = sorted(v['data_offsets'] for v in h.values())
end = 0
for s, e in spans:
    assert s == end, (s, end)
    end = e
assert 8 + n + end == len(b), (8 + n + end, len(b))
w = h['opt.w']
assert w['dtype'] == 'F32' and w['shape'] == [4, 4], w
s, e = w['data_offsets']
print(len(h), b[8 + n + s:8 + n + e].hex())
)PY";
  std::ofstream(dir_ / "check.py") << script;
  ckpt::testing::CliResult r =
      ckpt::testing::RunCli(python, {dir_ / "check.py", out}, dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The same bytes through ckpt's reader.
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(src_));
  CKPT_ASSERT_OK_AND_ASSIGN(
      std::string bytes,
      ckpt::testing::ReadWhole(*reader, *reader->Find("opt.w")));
  EXPECT_EQ(r.out, "25 " + absl::BytesToHexString(bytes) + "\n");
}

TEST(SelectedByGlobsTest, StarMatchesDots) {
  EXPECT_TRUE(SelectedByGlobs("a.b.c", {"a.*"}, {}));
  EXPECT_FALSE(SelectedByGlobs("a.b.c", {"a.*"}, {"*.c"}));
  EXPECT_TRUE(SelectedByGlobs("x", {}, {}));
}

}  // namespace
}  // namespace ckpt::interop

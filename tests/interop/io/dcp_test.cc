// PyTorch DCP and Megatron torch_dist into ckpt: the committed fixtures
// (written by real torch 2.13 in each FileSystemWriter layout, by real
// torch 1.13, the legacy format, and by real megatron-core 0.16.1), DCP
// checkpoints written by the installed torch at test time, and damaged or
// hostile directories (those that used to deadlock the conversion run under
// a watchdog).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "ckpt/format/status_macros.h"
#include "ckpt/interop/io/dcp_import.h"
#include "ckpt/interop/io/dcp_reader.h"
#include "ckpt/interop/io/foreign.h"
#include "ckpt/interop/torch_zip.h"
#include "diff/diff.h"
#include "diff/foreign_diff.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "reshard/reshard.h"
#include "testing/cli.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/convert/convert_fixture.h"

namespace ckpt::interop {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;
using ::ckpt::tools::Diff;
using ::ckpt::tools::DiffOptions;
using ::ckpt::tools::DiffReport;
using ::ckpt::tools::Reshard;
using ::ckpt::tools::ReshardOptions;
using ::ckpt::tools::RunDiffAnyFormat;

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

// Every object of expected.json's "objects" (the bytes items by their DCP
// names, as Python's repr of their values) is in the checkpoint at `root`,
// under its name or the one `renamed` gives it, decoding to it.
void ExpectObjects(const std::string& root, const std::string& dcp,
                   const std::map<std::string, std::string>& renamed = {}) {
  const nlohmann::json exp = nlohmann::json::parse(
      ::ckpt::testing::ReadFileBytes(dcp + "/expected.json"));
  ASSERT_TRUE(exp.contains("objects")) << dcp;
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(root));
  for (const auto& [fqn, repr] : exp["objects"].items()) {
    const auto it = renamed.find(fqn);
    const std::string name = it == renamed.end() ? fqn : it->second;
    CKPT_ASSERT_OK_AND_ASSIGN(std::string record, reader->ReadObject(name));
    EXPECT_EQ(DescribeTorchRecord(record), repr.get<std::string>()) << name;
  }
}

// Runs `fn` on a thread of its own and waits at most `seconds` for it. A
// call that does not return in time (ranks of a conversion waiting for one
// that gave up: a deadlock) fails the test and ends the test program,
// instead of leaving ctest waiting forever.
template <typename Fn>
auto WithinSeconds(int seconds, Fn fn) -> decltype(fn()) {
  using Result = decltype(fn());
  auto task = std::make_shared<std::packaged_task<Result()>>(std::move(fn));
  std::future<Result> done = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  if (done.wait_for(std::chrono::seconds(seconds)) !=
      std::future_status::ready) {
    std::fprintf(
        stderr,
        "FAILED: %s did not return within %d s (a deadlock: ranks "
        "wait for one that gave up); ending the test program\n",
        ::testing::UnitTest::GetInstance()->current_test_info()->name(),
        seconds);
    std::fflush(stderr);
    std::_Exit(1);
  }
  return done.get();
}

// A copy of the fixture `name` at `to` whose .metadata has every `from`
// replaced by `to_text` (of the same length, so the pickle stays valid).
void CopyWithMetadataRenamed(const std::string& name, const fs::path& to,
                             const std::string& from,
                             const std::string& to_text) {
  ASSERT_EQ(from.size(), to_text.size());
  fs::copy(DataDir(name), to, fs::copy_options::recursive);
  std::string md = ::ckpt::testing::ReadFileBytes(to / ".metadata");
  size_t n = 0;
  for (size_t at = md.find(from); at != std::string::npos;
       at = md.find(from, at + 1), ++n) {
    md.replace(at, from.size(), to_text);
  }
  ASSERT_GT(n, 0u) << from;
  std::ofstream(to / ".metadata", std::ios::binary | std::ios::trunc) << md;
}

// ckpt-diff of the DCP directory `dcp` against its conversion dir/c says
// `equal` (its report contains `equal_line`), and the conversion reshards
// --from 2 --to 3 into dir/c3, which diffs equal against it and holds the
// values torch computed.
void ExpectDiffsEqualAndReshardsEqual(const std::string& dcp,
                                      const TempDir& dir,
                                      const std::string& equal_line) {
  DiffOptions d;
  d.a = dcp;
  d.b = dir / "c";
  d.progress = false;
  std::ostringstream out;
  CKPT_ASSERT_OK_AND_ASSIGN(int diff_exit, RunDiffAnyFormat(d, false, out));
  EXPECT_EQ(diff_exit, 0) << out.str();
  EXPECT_THAT(out.str(), ::testing::HasSubstr(equal_line));
  ReshardOptions ro;
  ro.src = dir / "c";
  ro.dst = dir / "c3";
  ro.from = 2;
  ro.to = 3;
  ro.progress = false;
  CKPT_ASSERT_OK(Reshard(ro).status());
  d.a = dir / "c";
  d.b = dir / "c3";
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport diff, Diff(d));
  EXPECT_TRUE(diff.equal());
  ExpectValues(dir / "c3", dcp);
}

// The issue's end-to-end check of a DCP checkpoint written by real PyTorch:
// it converts to ckpt with the values torch computed, ckpt-diff of the DCP
// directory against the conversion is equal, and the conversion reshards
// --from 2 --to 3 and diffs equal against it.
void ExpectConvertsReshardsAndDiffsEqual(const std::string& dcp,
                                         const TempDir& dir) {
  SCOPED_TRACE(dcp);
  CKPT_ASSERT_OK_AND_ASSIGN(DcpImportResult r, ImportDcp(dcp, dir / "c", {}));
  EXPECT_EQ(r.world_size, 2);
  ExpectValues(dir / "c", dcp);
  ExpectObjects(dir / "c", dcp);
  ExpectDiffsEqualAndReshardsEqual(dcp, dir, "result: equal");
}

// The chunk of `entry` at `offset` in `reader`'s checkpoint, or null.
const format::ChunkRecord* ChunkAt(const Reader& reader,
                                   const std::string& entry,
                                   const Dims& offset) {
  const format::EntryRecord* e = reader.Find(entry);
  if (e == nullptr) return nullptr;
  for (const format::ChunkRecord& c : e->chunks) {
    if (std::get<Box>(c.region).offset == offset) return &c;
  }
  return nullptr;
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

// torch 2.13's FileSystemWriter defaults: one __<rank>_0.distcp per rank,
// records addressed by offset and length, a global .metadata.
TEST(DcpImport, Torch213DefaultLayout) {
  TempDir dir;
  const std::string dcp = DataDir("dcp_torch213");
  ExpectConvertsReshardsAndDiffsEqual(dcp, dir);
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir / "c"));
  EXPECT_EQ(
      reader->manifest().metadata,
      (format::Metadata{{"dcp.module", "torch.distributed.checkpoint.metadata"},
                        {"dcp.version", "1.0.0"},
                        {"dcp.checkpoint_id", "dcp_torch213"}}));
  // DTensor Shard(1): rank 1 holds columns 3..5, and writes them.
  const format::ChunkRecord* cols = ChunkAt(*reader, "model.w_cols", {0, 3});
  ASSERT_NE(cols, nullptr);
  EXPECT_EQ(std::get<Box>(cols->region).size, (Dims{4, 3}));
  EXPECT_EQ(cols->shard, 1u);
  // Shard(0) of 1 row on 2 ranks: rank 1's chunk is empty ([0, 3] at
  // [1, 0]) and holds nothing to convert.
  const format::EntryRecord* tiny = reader->Find("model.tiny");
  ASSERT_NE(tiny, nullptr);
  ASSERT_EQ(tiny->chunks.size(), 1u);
  EXPECT_EQ(std::get<Box>(tiny->chunks[0].region).size, (Dims{1, 3}));
}

// single_file_per_rank=False: one __<rank>_<n>.distcp per item.
TEST(DcpImport, Torch213ItemFilesLayout) {
  TempDir dir;
  const std::string dcp = DataDir("dcp_torch213_item_files");
  CKPT_ASSERT_OK_AND_ASSIGN(auto in, OpenDcp(dcp));
  EXPECT_EQ(in->files.size(), 12u);  // 10 chunks, 2 bytes items
  for (const interop::DcpStorage& s : in->meta.storage) {
    EXPECT_EQ(s.offset, 0u) << s.fqn;
    EXPECT_EQ(s.length, in->files.at(s.relative_path)->size()) << s.fqn;
  }
  ExpectConvertsReshardsAndDiffsEqual(dcp, dir);
}

// save(use_collectives=False): no .metadata; each rank's __<rank>.metadata
// lists what it wrote, its own copy of the replicated tensor, the scalar
// and the bytes items included. The merge keeps rank 0's copies.
TEST(DcpImport, Torch213RankLocalMetadata) {
  TempDir dir;
  const std::string dcp = DataDir("dcp_torch213_rank_local");
  ASSERT_FALSE(fs::exists(dcp + "/.metadata"));
  EXPECT_EQ(DetectFormat(dcp), InputFormat::kDcp);
  ExpectConvertsReshardsAndDiffsEqual(dcp, dir);
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir / "c"));
  EXPECT_EQ(
      reader->manifest().metadata,
      (format::Metadata{{"dcp.module", "torch.distributed.checkpoint.metadata"},
                        {"dcp.version", "1.0.0"},
                        {"dcp.checkpoint_id", "dcp_torch213_rank_local"},
                        {"dcp.rank_local_metadata", "2"}}));
  for (const char* replicated : {"model.norm", "opt.step_count"}) {
    const format::EntryRecord* e = reader->Find(replicated);
    ASSERT_NE(e, nullptr) << replicated;
    ASSERT_EQ(e->chunks.size(), 1u) << replicated;
    EXPECT_EQ(e->chunks[0].shard, 0u) << replicated;
  }
  const format::ChunkRecord* rows = ChunkAt(*reader, "model.w_rows", {3, 0});
  ASSERT_NE(rows, nullptr);
  EXPECT_EQ(rows->shard, 1u);
}

// serialization_format=SAFETENSORS: the tensors are one safetensors file per
// rank, which torch's own FileSystemReader cannot load (expected.json's
// torch_load); ckpt says so instead of reporting a broken zip.
TEST(DcpImport, Torch213SafetensorsSerializationIsRefusedNamingIt) {
  const std::string dcp = DataDir("dcp_torch213_safetensors");
  const nlohmann::json exp = nlohmann::json::parse(
      ::ckpt::testing::ReadFileBytes(dcp + "/expected.json"));
  EXPECT_NE(exp["torch_load"], "equal");
  TempDir dir;
  EXPECT_THAT(ImportDcp(dcp, dir / "c", {}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "FileSystemWriter(serialization_format=SAFETENSORS)"));
  CKPT_ASSERT_OK_AND_ASSIGN(auto in, OpenDcp(dcp));
  // Its bytes items are torch.save records still.
  CKPT_ASSERT_OK_AND_ASSIGN(std::string epoch,
                            ReadDcpBytes(*in, "extra.note.epoch"));
  EXPECT_EQ(DescribeTorchRecord(epoch), "3");
}

// Items stored through FileSystemWriter's stream transforms (_extensions:
// torch 2.13 has "stream.zstd/1") are refused, not read as records.
TEST(DcpImport, TransformedItemsAreRefusedNamingTheTransform) {
  CKPT_ASSERT_OK_AND_ASSIGN(auto in, OpenDcp(DataDir("dcp_torch213")));
  for (interop::DcpStorage& s : in->meta.storage) {
    s.transform_descriptors = {"stream.zstd/1"};
  }
  const interop::DcpTensor& t = in->meta.tensors[0];
  EXPECT_THAT(ReadDcpChunk(*in, t, 0),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "stream transforms [stream.zstd/1]"));
  EXPECT_THAT(ReadDcpBytes(*in, "extra.note.name"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "stream transforms [stream.zstd/1]"));
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

// Real megatron-core 0.16.1 output (make_megatron.py, with the two
// torch.cuda calls a CPU-only torch lacks stubbed): the tensors convert with
// the values torch computed, the ShardedObject "extra.note" (stored as
// "extra.note/shard_0_1", torch.save([obj])) becomes the object "extra.note"
// holding Megatron's record unchanged, common.pt the object "common.pt";
// the conversion diffs equal against the directory and reshards 2 -> 3.
TEST(DcpImport, MegatronCore016RealSave) {
  TempDir dir;
  const std::string dcp = DataDir("megatron_torch_dist_real");
  const nlohmann::json exp = nlohmann::json::parse(
      ::ckpt::testing::ReadFileBytes(dcp + "/expected.json"));
  EXPECT_EQ(exp["megatron_core"], "0.16.1");
  EXPECT_EQ(exp["megatron_load"], "equal");  // Megatron reads it back
  CKPT_ASSERT_OK_AND_ASSIGN(auto in, OpenDcp(dcp));
  EXPECT_TRUE(in->megatron);
  EXPECT_EQ(in->world_size, 2);
  EXPECT_EQ(in->meta.all_local_plans, std::optional<size_t>(2));
  // thread_count=2: two data files per rank.
  EXPECT_EQ(in->file_rank, (std::map<std::string, int>{{"__0_0.distcp", 0},
                                                       {"__0_1.distcp", 0},
                                                       {"__1_0.distcp", 1},
                                                       {"__1_1.distcp", 1}}));
  EXPECT_EQ(in->object_names, (std::map<std::string, std::string>{
                                  {"extra.note/shard_0_1", "extra.note"}}));
  EXPECT_TRUE(EntryNameProblems(*in).empty());
  // Its records are torch 2.13's: .format_version, .storage_alignment and
  // .data/serialization_id entries, data aligned to 64 bytes.
  for (const interop::DcpStorage& s : in->meta.storage) {
    SCOPED_TRACE(s.fqn);
    CKPT_ASSERT_OK_AND_ASSIGN(
        std::string record,
        in->files.at(s.relative_path)->Read(s.offset, s.length));
    CKPT_ASSERT_OK_AND_ASSIGN(interop::ZipArchive zip,
                              interop::ParseZip(record));
    for (const char* e :
         {"archive/.format_version", "archive/.storage_alignment",
          "archive/.data/serialization_id"}) {
      EXPECT_NE(zip.Find(e), nullptr) << e;
    }
    if (const interop::ZipEntry* data = zip.Find("archive/data/0")) {
      EXPECT_EQ(data->data_offset % 64, 0u);
    }
  }
  CKPT_ASSERT_OK_AND_ASSIGN(DcpImportResult r, ImportDcp(dcp, dir / "c", {}));
  EXPECT_EQ(r.format, "Megatron torch_dist");
  EXPECT_EQ(r.world_size, 2);
  ExpectValues(dir / "c", dcp);
  ExpectObjects(dir / "c", dcp, {{"extra.note/shard_0_1", "extra.note"}});
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir / "c"));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string common,
                            reader->ReadObject("common.pt"));
  EXPECT_EQ(common, ::ckpt::testing::ReadFileBytes(dcp + "/common.pt"));
  // Python's repr says 3.0 where ckpt's description says 3.
  EXPECT_EQ(exp["common"],
            "{'iteration': 1000, 'checkpoint_version': 3.0, "
            "'num_floating_point_operations_so_far': 0}");
  EXPECT_EQ(DescribeTorchRecord(common),
            "{'iteration': 1000, 'checkpoint_version': 3, "
            "'num_floating_point_operations_so_far': 0}");
  EXPECT_EQ(reader->manifest().metadata,
            (format::Metadata{
                {"dcp.module", "torch.distributed.checkpoint.metadata"},
                {"dcp.version", "1.0.0"},
                {"dcp.checkpoint_id", "megatron_torch_dist_real"},
                {"megatron.metadata.json",
                 ::ckpt::testing::ReadFileBytes(dcp + "/metadata.json")},
                {"megatron.sharded_objects",
                 R"({"extra.note":"extra.note/shard_0_1"})"}}));
  // Rank 1 holds columns 2..5 of model.w_cols, and writes them.
  const format::ChunkRecord* cols = ChunkAt(*reader, "model.w_cols", {0, 2});
  ASSERT_NE(cols, nullptr);
  EXPECT_EQ(std::get<Box>(cols->region).size, (Dims{4, 4}));
  EXPECT_EQ(cols->shard, 1u);
  ExpectDiffsEqualAndReshardsEqual(dcp, dir, "result: equal (7 entries");
}

// A bytes item whose name ckpt refuses ('/'): ImportDcp says so, naming the
// metadata file and the item, before any rank starts. It used to hang:
// rank 0 failed in SetObject while rank 1 waited for it in the save's first
// collective.
TEST(DcpImport, NameCkptRefusesIsAnErrorNotADeadlock) {
  TempDir dir;
  CopyWithMetadataRenamed("dcp_torch213", dir / "d", "extra.note.name",
                          "extra.note/name");
  const auto imported = WithinSeconds(
      60, [&] { return ImportDcp(dir / "d", dir / "c", {}).status(); });
  EXPECT_THAT(imported,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       dir / "d/.metadata" +
                           ": bytes item 'extra.note/name' cannot be a ckpt "
                           "entry: invalid name 'extra.note/name': path "
                           "separator"));
  EXPECT_FALSE(fs::exists(dir / "c"));
}

// Any rank's failure before the save (here rank 0's, reading a bytes item
// stored through a transform) is every rank's: the import returns it
// instead of rank 1 waiting forever in the save's first collective.
TEST(DcpImport, RankFailingBeforeTheSaveFailsEveryRank) {
  TempDir dir;
  CKPT_ASSERT_OK_AND_ASSIGN(auto in, OpenDcp(DataDir("dcp_torch213")));
  for (interop::DcpStorage& s : in->meta.storage) {
    if (s.fqn == "extra.note.name") s.transform_descriptors = {"stream.zstd/1"};
  }
  const auto imported = WithinSeconds(
      60, [&] { return ImportOpenedDcp(*in, dir / "c", {}).status(); });
  EXPECT_THAT(imported, StatusIs(absl::StatusCode::kFailedPrecondition,
                                 "of 'extra.note.name': stored through the "
                                 "stream transforms [stream.zstd/1]"));
  EXPECT_FALSE(fs::exists(dir / "c/latest"));
}

// Two items that would be one ckpt entry (a ShardedObject named like a
// tensor) are refused, naming both.
TEST(DcpImport, MegatronObjectNamedLikeATensorIsRefused) {
  TempDir dir;
  CopyWithMetadataRenamed("megatron_torch_dist_real", dir / "d",
                          "extra.note/shard_0_1", "model.norm/shard_0_1");
  CKPT_ASSERT_OK_AND_ASSIGN(auto in, OpenDcp(dir / "d"));
  const std::vector<absl::Status> bad = EntryNameProblems(*in);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_THAT(bad[0], StatusIs(absl::StatusCode::kFailedPrecondition,
                               "tensor 'model.norm' and bytes item "
                               "'model.norm/shard_0_1' (Megatron "
                               "ShardedObject) would both be the ckpt entry "
                               "'model.norm'"));
  EXPECT_THAT(
      WithinSeconds(
          60, [&] { return ImportDcp(dir / "d", dir / "c", {}).status(); }),
      StatusIs(absl::StatusCode::kFailedPrecondition, "would both be"));
}

// Only a Megatron checkpoint's ShardedObject keys are renamed: without
// metadata.json the same directory is a plain DCP whose item name ckpt
// cannot hold.
TEST(DcpImport, ShardedObjectKeyOutsideMegatronIsRefusedByName) {
  TempDir dir;
  fs::copy(DataDir("megatron_torch_dist_real"), dir / "d",
           fs::copy_options::recursive);
  fs::remove(dir / "d/metadata.json");
  EXPECT_THAT(
      WithinSeconds(
          60, [&] { return ImportDcp(dir / "d", dir / "c", {}).status(); }),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               "bytes item 'extra.note/shard_0_1' cannot be a ckpt entry"));
}

// The same, on DCP checkpoints written at test time by the installed torch
// (make_dcp.py real: every FileSystemWriter layout).
TEST(DcpImport, WrittenByInstalledTorchConvertsReshardsAndDiffsEqual) {
  const std::string python = ckpt::testing::TestPython();
  if (python.empty())
    GTEST_SKIP() << "no Python interpreter (run scripts/setup)";
  TempDir dir;
  ckpt::testing::CliResult py = ckpt::testing::RunCli(
      python, {DataDir("make_dcp.py"), "real", dir / "w", "--prefix", "dcp"},
      dir.path());
  if (py.exit_code != 0 &&
      py.err.find("No module named 'torch'") != std::string::npos) {
    GTEST_SKIP()
        << "torch is not installed (scripts/setup installs it into .venv/)";
  }
  ASSERT_EQ(py.exit_code, 0) << py.err;
  for (const char* variant : {"dcp", "dcp_item_files", "dcp_rank_local"}) {
    const std::string dcp = dir / ("w/" + std::string(variant));
    const nlohmann::json exp = nlohmann::json::parse(
        ::ckpt::testing::ReadFileBytes(dcp + "/expected.json"));
    EXPECT_EQ(exp["torch_load"], "equal") << variant;  // torch reads it too
    TempDir out;
    ExpectConvertsReshardsAndDiffsEqual(dcp, out);
  }
  EXPECT_THAT(ImportDcp(dir / "w/dcp_safetensors", dir / "s", {}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "serialization_format=SAFETENSORS"));
}

class DamagedDcp : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::copy(DataDir("dcp_torch213"), dir_ / "d", fs::copy_options::recursive);
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
  // The first byte of the first record's tensor data, found through the
  // reader and the zip parser.
  CKPT_ASSERT_OK_AND_ASSIGN(auto in, OpenDcp(dir_ / "d"));
  const interop::DcpStorage* s = in->chunk_storage.at("model.w_rows")[0];
  const std::string path = dir_ / ("d/" + s->relative_path);
  const std::string bytes = ::ckpt::testing::ReadFileBytes(path);
  const std::string record = bytes.substr(s->offset, s->length);
  CKPT_ASSERT_OK_AND_ASSIGN(interop::ZipArchive zip, interop::ParseZip(record));
  const interop::ZipEntry* data = zip.Find("archive/data/0");
  ASSERT_NE(data, nullptr);
  ASSERT_GT(data->size, 0u);
  const size_t at = s->offset + data->data_offset;
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(bytes[at] ^ 0x40));
  f.close();
  EXPECT_THAT(ImportDcp(dir_ / "d", dir_ / "c", {}),
              StatusIs(absl::StatusCode::kDataLoss, "CRC-32"));
}

class DamagedRankLocalDcp : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::copy(DataDir("dcp_torch213_rank_local"), dir_ / "d",
             fs::copy_options::recursive);
  }
  TempDir dir_;
};

// Without rank 1's metadata its data file is unaccounted for.
TEST_F(DamagedRankLocalDcp, MissingLastRankMetadata) {
  fs::remove(dir_ / "d/__1.metadata");
  EXPECT_THAT(OpenDcp(dir_ / "d"),
              StatusIs(absl::StatusCode::kNotFound,
                       "__1.metadata: missing (rank-local metadata, one file "
                       "per rank): rank 1 wrote __1_*.distcp"));
}

TEST_F(DamagedRankLocalDcp, MissingFirstRankMetadata) {
  fs::remove(dir_ / "d/__0.metadata");
  EXPECT_FALSE(LooksLikeDcp(dir_ / "d"));
  EXPECT_THAT(OpenDcp(dir_ / "d"),
              StatusIs(absl::StatusCode::kNotFound,
                       "__0.metadata: missing (rank-local metadata, one file "
                       "per rank): __1.metadata exists"));
}

// Rank 1's chunks gone (its metadata replaced by rank 0's): the tensors
// sharded across the ranks have gaps, named.
TEST_F(DamagedRankLocalDcp, RankMetadataOfAnotherRank) {
  fs::copy_file(dir_ / "d/__0.metadata", dir_ / "d/__1.metadata",
                fs::copy_options::overwrite_existing);
  EXPECT_THAT(OpenDcp(dir_ / "d"),
              StatusIs(absl::StatusCode::kDataLoss,
                       "__0.metadata .. __1.metadata: tensor 'model.w_cols'"));
}

TEST(DcpImport, PickleCallingOsSystemExitsCleanly) {
  TempDir dir;
  EXPECT_THAT(ImportDcp(DataDir("hostile/dcp_os_system"), dir / "c", {}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "pickle global 'posix.system' is not allowed"));
  EXPECT_FALSE(fs::exists("/tmp/ckpt-pwned"));
}

}  // namespace
}  // namespace ckpt::interop

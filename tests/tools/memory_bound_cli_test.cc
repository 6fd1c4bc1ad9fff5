// The tools on hostile inputs whose every checksum is valid, each run
// under an address-space limit of 16 x the metadata bytes on disk + 512
// MiB (ulimit -v: issue 28's target, SECURITY.md "Resource use"): each
// input is refused with one line, or read, within the limit; never an
// abort (exit 134) or a bare out-of-memory. The inputs are made here, a
// few MiB at most.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "synth/synth.h"
#include "testing/cli.h"
#include "testing/dcp_pickle.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace ckpt::testing {
namespace {

namespace fs = std::filesystem;
namespace dp = dcp_pickle;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kFixedBytes = 512ull << 20;

class MemoryBoundCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kSanitizerReservesAddressSpace) {
      GTEST_SKIP() << "ulimit -v cannot apply to a sanitizer's binaries";
    }
  }

  // Runs `binary` under the limit for `metadata_bytes` of metadata on disk.
  CliResult Run(const std::string& binary, const std::vector<std::string>& args,
                uint64_t metadata_bytes) {
    CliResult r = RunCliUnderMemoryLimit(binary, args, dir_.path(),
                                         16 * metadata_bytes + kFixedBytes);
    EXPECT_NE(r.exit_code, -1) << r.err;
    EXPECT_NE(r.exit_code, 128 + 6) << binary << " aborted: " << r.err;
    EXPECT_THAT(r.err, Not(HasSubstr("bad_alloc"))) << binary;
    return r;
  }

  // The one line of a tool's error on stderr.
  static void ExpectOneLineError(const CliResult& r, const std::string& tool,
                                 const std::string& what) {
    EXPECT_EQ(r.exit_code, 2) << tool << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(tool + ": error: ")) << r.err;
    EXPECT_THAT(r.err, HasSubstr(what)) << tool;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }

  // A DCP directory whose `.metadata` is `pickle`; returns its path.
  std::string WriteDcp(const std::string& name, const std::string& pickle) {
    const std::string dir = dir_ / name;
    fs::create_directories(dir);
    WriteFileBytes(dir + "/.metadata", pickle);
    return dir;
  }

  // A checkpoint of one rank written by ckpt-synth, for its files; returns
  // its directory.
  std::string WriteSynthCheckpoint(const std::string& root) {
    auto r =
        synth::WriteTestCheckpoint(dir_ / root, 1, synth::SynthLayout::kTp);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->path : "";
  }

  // Rewrites the MANIFEST of checkpoint directory `dir` with `edit`;
  // returns the new manifest's size.
  template <typename Edit>
  uint64_t EditManifest(const std::string& dir, Edit edit) {
    const std::string path = dir + "/" + format::kManifestFileName;
    auto m = format::DecodeManifest(ReadFileBytes(path));
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return 0;
    edit(*m);
    const std::string bytes = format::EncodeManifest(*m);
    WriteFileBytes(path, bytes);
    return bytes.size();
  }

  // A valid checkpoint (one object, written by the library) whose user
  // metadata is that of a ckpt-synth checkpoint but for `key` = `value`;
  // returns its directory.
  std::string WriteWithSynthMetadata(const std::string& root,
                                     const std::string& key,
                                     const std::string& value) {
    const std::string real = WriteSynthCheckpoint(root + ".real");
    auto m = format::DecodeManifest(
        ReadFileBytes(real + "/" + format::kManifestFileName));
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return "";
    SaveOptions so;
    so.metadata = m->metadata;
    for (auto& [k, v] : so.metadata) {
      if (k == key) v = value;
    }
    auto w = Writer::Create({});
    EXPECT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE((*w)->SetObject("step", "100").ok());
    auto saved = (*w)->Save(dir_ / root, 100, so);
    EXPECT_TRUE(saved.ok()) << saved.status();
    return saved.ok() ? saved->path : "";
  }

  static uint64_t ManifestBytes(const std::string& dir) {
    return fs::file_size(dir + "/" + format::kManifestFileName);
  }

  TempDir dir_;
};

// Issue 28's first example: a MANIFEST declaring a [2^61, 2] uint8 tensor
// in one zstd chunk of stored length 2^62, in a shard whose file_size says
// 2^64 - 1; the real shard is small. ckpt-reshard aborted at once (its
// output planner sized block tables from the declared chunk), and
// ckpt-convert --to hdf5 built slab jobs until memory ran out.
void DeclareHugeChunk(format::Manifest& m, bool claim_huge_file) {
  format::EntryRecord e;
  e.name = "t";
  e.dtype = DType::kUInt8;
  e.shape = {uint64_t{1} << 61, 2};
  format::ChunkRecord c;
  c.region = FullBox(e.shape);
  c.codec = format::Codec::kZstd;
  c.data_offset = format::kShardHeaderSize;
  c.stored_length = claim_huge_file ? uint64_t{1} << 62 : 64;
  e.chunks.push_back(c);
  m.entries = {e};  // alone: no object is read (which opens the shard) first
  m.required_features |= format::kFeatureZstd;
  if (claim_huge_file) m.shards[0].file_size = ~uint64_t{0};
}

TEST_F(MemoryBoundCli, DeclaredHugeChunkInAShardOfAnotherSizeIsRefused) {
  const std::string src = WriteSynthCheckpoint("src");
  const uint64_t meta =
      EditManifest(src, [](format::Manifest& m) { DeclareHugeChunk(m, true); });
  const std::string why =
      "shard-00000.ckpt: file is " +
      std::to_string(fs::file_size(src + "/shard-00000.ckpt")) +
      " bytes, the manifest says 18446744073709551615";
  ExpectOneLineError(
      Run(CKPT_RESHARD_BIN, {src, dir_ / "dst", "--to", "2", "--threads", "1"},
          meta),
      "ckpt-reshard", why);
  ExpectOneLineError(
      Run(CKPT_CONVERT_BIN,
          {src, dir_ / "out.h5", "--to", "hdf5", "--threads", "1"}, meta),
      "ckpt-convert", why);
  ExpectOneLineError(Run(CKPT_CONVERT_BIN,
                         {src, dir_ / "out.safetensors", "--to", "safetensors",
                          "--threads", "1"},
                         meta),
                     "ckpt-convert", why);
  CliResult v = Run(CKPT_VALIDATE_BIN, {src, "--threads", "1"}, meta);
  EXPECT_EQ(v.exit_code, 1) << v.err;
  EXPECT_THAT(v.out, HasSubstr(why.substr(why.find(':') + 2)));
  EXPECT_FALSE(fs::exists(dir_ / "out.h5"));
  EXPECT_FALSE(fs::exists(dir_ / "dst"));
}

// The same tensor in a shard of the size the manifest says: the shard's
// index, which lists what the file really holds, disagrees with the
// manifest before anything is planned from it.
TEST_F(MemoryBoundCli, DeclaredHugeChunkTheShardIndexDoesNotListIsRefused) {
  const std::string src = WriteSynthCheckpoint("src");
  const uint64_t meta = EditManifest(
      src, [](format::Manifest& m) { DeclareHugeChunk(m, false); });
  for (const auto& [tool, args] :
       std::vector<std::pair<std::string, std::vector<std::string>>>{
           {CKPT_RESHARD_BIN,
            {src, dir_ / "dst", "--to", "2", "--threads", "1"}},
           {CKPT_CONVERT_BIN,
            {src, dir_ / "out.h5", "--to", "hdf5", "--threads", "1"}}}) {
    ExpectOneLineError(Run(tool, args, meta),
                       fs::path(tool).filename().string(),
                       "shard-00000.ckpt: entry 'embed.weight': entry is in "
                       "the shard index (1 chunks) but not in the manifest");
  }
}

// Issue 28: a 32 MiB DCP .metadata of 2^25 NONE opcodes took ~3.8 GB in
// every tool that reads DCP. Here 8 MiB of them (about 1 GB before): None
// is one shared value, so the run costs a pointer an opcode.
TEST_F(MemoryBoundCli, DcpMetadataOfMillionsOfNonesIsReadWithinTheBudget) {
  const std::string pickle =
      "\x80\x02" + std::string(8 << 20, 'N') + std::string(".");
  const std::string dcp = WriteDcp("nones", pickle);
  const std::string why = "pickle: STOP with 8388608 values on the stack";
  ExpectOneLineError(Run(CKPT_INSPECT_BIN, {dcp}, pickle.size()),
                     "ckpt-inspect", why);
  ExpectOneLineError(
      Run(CKPT_CONVERT_BIN,
          {dcp, dir_ / "c", "--from", "dcp", "--threads", "1"}, pickle.size()),
      "ckpt-convert", why);
  CliResult v = Run(CKPT_VALIDATE_BIN, {dcp, "--threads", "1"}, pickle.size());
  EXPECT_EQ(v.exit_code, 1) << v.err;
  EXPECT_THAT(v.out, HasSubstr(why));
}

// The same with EMPTY_LIST, a new value each: the unpickler's budget (16
// bytes per byte of the pickle + 64 MiB) refuses it.
TEST_F(MemoryBoundCli, DcpMetadataOfMillionsOfEmptyListsIsRefusedByTheBudget) {
  const std::string pickle =
      "\x80\x02" + std::string(8 << 20, ']') + std::string(".");
  const std::string dcp = WriteDcp("lists", pickle);
  const std::string why = "bytes of memory, the budget of decoding it";
  ExpectOneLineError(Run(CKPT_INSPECT_BIN, {dcp}, pickle.size()),
                     "ckpt-inspect", why);
  ExpectOneLineError(Run(CKPT_DIFF_BIN, {dcp, dcp}, 2 * pickle.size()),
                     "ckpt-diff", why);
  ExpectOneLineError(
      Run(CKPT_CONVERT_BIN,
          {dcp, dir_ / "c", "--from", "dcp", "--threads", "1"}, pickle.size()),
      "ckpt-convert", why);
}

// Issue 28 §3: a DCP tensor of size [2^32, 2^32] and no chunks had 2^64
// elements, which wrapped to 0: ckpt-validate said VALID, ckpt-convert
// dropped it (its summary counting it) and ckpt-diff said equal. Its size
// is checked like a ckpt shape, and the message shows no wrapped number.
TEST_F(MemoryBoundCli, DcpTensorWhoseElementCountOverflowsIsAnError) {
  const std::string pickle = dp::Metadata(
      {{"w", dp::Tensor({int64_t{1} << 32, int64_t{1} << 32}, "]")}});
  const std::string dcp = WriteDcp("overflow", pickle);
  const std::string why =
      "tensor 'w' (torch.float32): shape [4294967296, 4294967296]: element "
      "count overflows int64";
  CliResult v = Run(CKPT_VALIDATE_BIN, {dcp, "--threads", "1"}, pickle.size());
  EXPECT_EQ(v.exit_code, 1) << v.out;
  EXPECT_THAT(v.out, HasSubstr(why));
  EXPECT_THAT(v.out, HasSubstr("INVALID: 1 problem"));
  ExpectOneLineError(Run(CKPT_DIFF_BIN, {dcp, dcp}, 2 * pickle.size()),
                     "ckpt-diff", why);
  ExpectOneLineError(
      Run(CKPT_CONVERT_BIN,
          {dcp, dir_ / "c", "--from", "dcp", "--threads", "1"}, pickle.size()),
      "ckpt-convert", why);
  EXPECT_FALSE(fs::exists(dir_ / "c"));
}

// A DCP chunk declared far larger than the record that stores it (float32
// [2^30, 2^29], 2^61 bytes, in a record of 100): refused when the metadata
// is read, before a conversion plans the chunk's blocks.
TEST_F(MemoryBoundCli, DcpChunkLargerThanItsRecordIsRefused) {
  const std::vector<int64_t> size = {int64_t{1} << 30, int64_t{1} << 29};
  const std::string pickle = dp::Metadata(
      {{"w", dp::Tensor(size, "](" + dp::Chunk({0, 0}, size) + "e")}},
      {dp::StorageItem("w", {0, 0}, "__0_0.distcp", 0, 100)});
  const std::string dcp = WriteDcp("short", pickle);
  WriteFileBytes(dcp + "/__0_0.distcp", std::string(100, '\0'));
  const std::string why =
      "__0_0.distcp [0, 100) of 'w': 100 bytes, too few for chunk "
      "[0:1073741824, 0:536870912] (2305843009213693952 bytes of float32)";
  ExpectOneLineError(
      Run(CKPT_CONVERT_BIN,
          {dcp, dir_ / "c", "--from", "dcp", "--threads", "1"}, pickle.size()),
      "ckpt-convert", why);
  ExpectOneLineError(Run(CKPT_INSPECT_BIN, {dcp}, pickle.size()),
                     "ckpt-inspect", why);
}

// Issue 28: ckpt-synth verify trusted synth.* metadata: layers or ranks of
// 2^20 in a small checkpoint aborted it, or took minutes and tens of GiB.
// The checkpoint's own entries bound what it plans.
TEST_F(MemoryBoundCli, SynthVerifyRefusesLayersTheCheckpointDoesNotHold) {
  const std::string dir =
      WriteWithSynthMetadata("layers", synth::kMetaLayers, "1048576");
  ExpectOneLineError(Run(CKPT_SYNTH_BIN, {"verify", dir, "--io-threads", "1"},
                         ManifestBytes(dir)),
                     "ckpt-synth",
                     "metadata 'synth.layers' 1048576 and 'synth.ranks' 1 "
                     "describe 22020104 entries, more than twice the "
                     "checkpoint's 1 + 1024");
}

TEST_F(MemoryBoundCli, SynthVerifyRefusesRanksTheCheckpointDoesNotHold) {
  const std::string dir =
      WriteWithSynthMetadata("ranks", synth::kMetaRanks, "1048576");
  ExpectOneLineError(Run(CKPT_SYNTH_BIN, {"verify", dir, "--io-threads", "1"},
                         ManifestBytes(dir)),
                     "ckpt-synth",
                     "metadata 'synth.layers' 2 and 'synth.ranks' 1048576 "
                     "describe 1048625 entries, more than twice the "
                     "checkpoint's 1 + 1024");
}

// Where an allocation can still fail (here a legitimate 96 MiB object,
// which ckpt-diff reads whole, under a limit of 128 MiB), the tool says so
// in one line and exits 2: it aborted with std::bad_alloc (exit 134)
// before. Which allocation fails first depends on what the process maps
// (libcurl's libraries where ckpt_s3 is built): the buffer, or a reading
// thread's stack (std::system_error, EAGAIN).
TEST_F(MemoryBoundCli, FailedAllocationIsOneLineAndExitTwo) {
  auto w = Writer::Create({});
  ASSERT_TRUE(w.ok()) << w.status();
  CKPT_ASSERT_OK((*w)->SetObject("big", std::string(96 << 20, '\0')));
  SaveOptions so;
  so.codec = format::Codec::kZstd;
  auto saved = (*w)->Save(dir_ / "big", 1, so);
  ASSERT_TRUE(saved.ok()) << saved.status();
  CliResult r =
      RunCliUnderMemoryLimit(CKPT_DIFF_BIN, {saved->path, saved->path},
                             dir_.path(), uint64_t{128} << 20);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err,
              ::testing::MatchesRegex("ckpt-diff: error: out of memory \\((an "
                                      "allocation failed|a thread could not "
                                      "start)\\)\n"));
}

}  // namespace
}  // namespace ckpt::testing

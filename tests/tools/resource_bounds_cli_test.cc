// The tools on checkpoints whose every checksum is valid but whose metadata
// asks for far more memory or work than its bytes on disk (issue 28,
// SECURITY.md "Resource use"). Each tool runs under an address-space limit
// (bash's ulimit -v) of 16 bytes per byte of metadata on disk + 512 MiB,
// and one block more where blocks are read: the bound SECURITY.md states.
// Each case took several times that before it was fixed. The checkpoints
// are built at test time (testing/hostile_checkpoints.h).
//
// Skipped under sanitizers, whose shadow memory reserves terabytes of
// address space.
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "testing/cli.h"
#include "testing/hostile_checkpoints.h"

namespace ckpt::testing {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// The bound of SECURITY.md: 16 bytes per byte of metadata + 512 MiB.
uint64_t MetadataBound(uint64_t metadata_bytes) {
  return 16 * metadata_bytes + 512 * kMiB;
}

class ResourceBounds : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kSanitizerReservesAddressSpace) {
      GTEST_SKIP() << "ulimit -v cannot apply to a sanitizer's binaries";
    }
  }

  // Runs `binary args...` with at most `limit` bytes of address space.
  CliResult RunLimited(uint64_t limit, const std::string& binary,
                       const std::vector<std::string>& args) {
    const auto t0 = std::chrono::steady_clock::now();
    CliResult r = RunCliUnderMemoryLimit(binary, args, dir_.path(), limit);
    seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    return r;
  }

  std::string Write(const std::string& name, HostileCheckpoint h) {
    const std::string dir = dir_ / name;
    metadata_ = WriteHostileCheckpoint(dir, std::move(h));
    return dir;
  }

  TempDir dir_;
  uint64_t metadata_ = 0;  // of the last checkpoint written
  double seconds_ = 0;     // of the last run
};

// One box that is not a run, then 20,000 copies of a flat range of 63 boxes
// of 32 dims (260 KB of manifest): the coverage check took 1.4 GB and 6.7 s
// to refuse it; the copies overlap, which is now found among the runs.
TEST_F(ResourceBounds, FlatRangeCopiesAreRefusedInBoundedMemory) {
  const std::string ckpt = Write("coverage", CoverageBomb(20000));
  const uint64_t limit = MetadataBound(metadata_);
  CliResult v = RunLimited(limit, CKPT_VALIDATE_BIN, {ckpt});
  EXPECT_EQ(v.exit_code, 1) << v.err;
  EXPECT_NE(v.out.find("chunks 1 and 2 overlap in flat[1:4294967295)"),
            std::string::npos)
      << v.out;
  EXPECT_LT(seconds_, 10);
  CliResult d = RunLimited(limit, CKPT_DIFF_BIN, {ckpt, ckpt});
  EXPECT_EQ(d.exit_code, 2) << d.err;
  EXPECT_NE(d.err.find("overlap"), std::string::npos) << d.err;
}

// 2^23 chunk records of 7 bytes in one 0-d entry (59 MB of manifest):
// decoding them took 39 bytes of memory per byte; the second record is now
// refused as it is read (the two overlap).
TEST_F(ResourceBounds, ScalarChunksAreRefusedAtTheSecondRecord) {
  const std::string ckpt = Write("scalars", ScalarChunks(1u << 23));
  const uint64_t limit = MetadataBound(metadata_);
  const std::string why =
      "chunk 1: 2 chunks hold elements of an entry of 1 elements";
  CliResult v = RunLimited(limit, CKPT_VALIDATE_BIN, {ckpt});
  EXPECT_EQ(v.exit_code, 1) << v.err;
  EXPECT_NE(v.out.find(why), std::string::npos) << v.out;
  for (const char* tool : {CKPT_INSPECT_BIN, CKPT_DIFF_BIN}) {
    std::vector<std::string> args = {ckpt};
    if (std::string(tool) == CKPT_DIFF_BIN) args.push_back(ckpt);
    CliResult r = RunLimited(limit, tool, args);
    EXPECT_EQ(r.exit_code, 2) << tool << ": " << r.err;
    EXPECT_NE(r.err.find(why), std::string::npos) << tool << ": " << r.err;
  }
}

// A shard index that lists an entry without the manifest's 2^21 chunks: one
// finding per missing chunk took 36 bytes of memory per byte of metadata;
// 100 are listed, the rest counted.
TEST_F(ResourceBounds, ChunksMissingFromTheIndexAreCountedNotListed) {
  const std::string ckpt =
      Write("unindexed", EmptyChunks(1u << 21, /*indexed=*/false));
  CliResult v = RunLimited(MetadataBound(metadata_), CKPT_VALIDATE_BIN,
                           {"--quick", ckpt});
  EXPECT_EQ(v.exit_code, 1) << v.err;
  EXPECT_NE(v.out.find("2097052 more disagreements between the shard index "
                       "and the manifest are not listed"),
            std::string::npos)
      << v.out;
}

// The smallest records in number that a valid checkpoint can hold (2^21
// chunks without elements, 9 bytes each in the manifest and 10 in the
// index): within the bound, and VALID.
TEST_F(ResourceBounds, SmallestRecordsStayWithinTheMetadataBound) {
  const std::string ckpt =
      Write("empty", EmptyChunks(1u << 21, /*indexed=*/true));
  const uint64_t limit = MetadataBound(metadata_);
  CliResult v = RunLimited(limit, CKPT_VALIDATE_BIN, {ckpt});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  CliResult i = RunLimited(limit, CKPT_INSPECT_BIN, {ckpt});
  EXPECT_EQ(i.exit_code, 0) << i.err;
}

// Decoded chunk records took 17 to 19 bytes of memory per byte of the
// smallest ones on disk (9 bytes, chunks without elements, each a 144-byte
// ChunkRecord): over the 16 of the bound, which the 512 MiB hid below about
// 190 MB of manifest. Each tool's peak RSS now grows by under 16 bytes per
// byte of metadata from 2^18 to 2^20 such chunks, whose shard index lists
// none (the manifest is all the metadata), each run within the bound.
TEST_F(ResourceBounds, SmallestChunkRecordsTakeUnder16BytesPerByteDecoded) {
  std::string ckpt[2];
  uint64_t meta[2];
  for (int k = 0; k < 2; ++k) {
    ckpt[k] = Write(k == 0 ? "small" : "large",
                    EmptyChunks(k == 0 ? 1u << 18 : 1u << 20,
                                /*indexed=*/false));
    meta[k] = metadata_;
  }
  for (const std::string tool :
       {CKPT_VALIDATE_BIN, CKPT_INSPECT_BIN, CKPT_DIFF_BIN}) {
    const bool diff = tool == CKPT_DIFF_BIN;  // reads the manifest twice
    uint64_t rss[2];
    for (int k = 0; k < 2; ++k) {
      std::vector<std::string> args = {ckpt[k]};
      if (diff) args.push_back(ckpt[k]);
      CliResult r =
          RunLimited(MetadataBound((diff ? 2 : 1) * meta[k]), tool, args);
      EXPECT_EQ(r.exit_code, tool == CKPT_VALIDATE_BIN ? 1 : 0)
          << tool << ": " << r.err;
      rss[k] = r.max_rss_bytes;
    }
    const double per_byte = (static_cast<double>(rss[1]) - rss[0]) /
                            ((diff ? 2 : 1) * (meta[1] - meta[0]));
    EXPECT_LT(per_byte, 16) << tool;
    RecordProperty(
        absl::StrCat(tool.substr(tool.rfind('/') + 1), "_bytes_per_byte"),
        absl::StrFormat("%.1f", per_byte));
  }
}

// 2^16 valid scalar entries of one chunk each (3 MB of metadata): ckpt-diff
// loaded them entry by entry, two Reader::Loads per entry, each planning
// and starting its threads (2.3 s here, 53 s for 2^20); it loads them in
// batches now (ckpt/ops/diff.h; counted by
// DiffTest.SmallEntriesAreLoadedInBatches): 0.75 s, within the bound of
// reading the metadata twice.
TEST_F(ResourceBounds, DiffOfManySmallEntriesLoadsThemInBatches) {
  const std::string ckpt = Write("scalar-entries", ScalarEntries(1u << 16));
  CliResult d =
      RunLimited(MetadataBound(2 * metadata_), CKPT_DIFF_BIN, {ckpt, ckpt});
  EXPECT_EQ(d.exit_code, 0) << d.err;
  EXPECT_NE(d.out.find("result: equal (65536 entries, 256 KiB compared)"),
            std::string::npos)
      << d.out;
  EXPECT_LT(seconds_, 10);
}

// Four zstd blocks of 256 MiB of zeros in a shard of 32 KB: legal, and
// each tool holds one block at a time (ckpt-reshard held three blocks'
// worth, ckpt-validate one per thread).
TEST_F(ResourceBounds, LargeBlocksAreHeldOneAtATime) {
  const uint64_t block = 256 * kMiB;
  const std::string ckpt = Write("zeros", ZeroBlocks(block, 4));
  const uint64_t limit = MetadataBound(metadata_) + block;
  CliResult v = RunLimited(limit, CKPT_VALIDATE_BIN, {"--threads", "4", ckpt});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  CliResult r = RunLimited(limit, CKPT_RESHARD_BIN,
                           {"--threads", "4", "--to", "2", ckpt, dir_ / "out"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

// --json written one element at a time (tools/common/json_writer.h): the
// chunk map of an entry of 2^18 chunks without elements (5 MB of metadata)
// held whole as one JSON document passed the bound (out of memory, exit
// 2); it takes 45 MB now. ckpt-validate's findings are written the same
// way.
TEST_F(ResourceBounds, JsonIsWrittenOneElementAtATime) {
  const std::string ckpt =
      Write("chunks", EmptyChunks(1u << 18, /*indexed=*/true));
  const uint64_t limit = MetadataBound(metadata_);
  CliResult i =
      RunLimited(limit, CKPT_INSPECT_BIN, {"--json", "--entry", "e", ckpt});
  EXPECT_EQ(i.exit_code, 0) << i.err;
  EXPECT_TRUE(absl::EndsWith(i.out, "}\n      ]\n    }\n  ]\n}\n"));
  CliResult v = RunLimited(limit, CKPT_VALIDATE_BIN, {"--json", ckpt});
  EXPECT_EQ(v.exit_code, 0) << v.err;
  EXPECT_TRUE(absl::EndsWith(v.out, "\"findings\": []\n}\n")) << v.out;
}

}  // namespace
}  // namespace ckpt::testing

// One test per problem ckpt-validate reports, and per way it refuses to
// run. Checkpoints come from tests/tools/inspect/fixture.h (format codecs,
// exact control) and, in the *Writer* tests, from ckpt::Writer.
#include "validate/validate.h"

#include <atomic>
#include <filesystem>
#include <sstream>

#include "ckpt/format/latest.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "ckpt/testing/fault_injection.h"
#include "ckpt/testing/forwarding_storage.h"
#include "ckpt/writer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "testing/status_matchers.h"
#include "tools/inspect/fixture.h"
#include "util/mutex.h"

namespace ckpt::tools {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;
using testing::ChunkOffset;
using testing::FixtureSpec;
using testing::FlipByte;
using ::testing::HasSubstr;
using testing::StandardSpec;
using testing::WriteCheckpoint;

ValidateReport MustValidate(const std::string& path, bool quick = false,
                            bool check_finite = false) {
  ValidateOptions o;
  o.path = path;
  o.quick = quick;
  o.check_finite = check_finite;
  o.threads = 2;
  auto r = Validate(o);
  EXPECT_THAT(r, ::ckpt::testing::IsOk());
  return r.ok() ? *std::move(r) : ValidateReport();
}

std::string AllFindings(const ValidateReport& r) {
  std::string s;
  for (const Finding& f : r.findings)
    s += std::string(SeverityName(f.severity)) + ": " + FindingText(f) + "\n";
  return s;
}

TEST(Validate, ValidCheckpoint) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  ValidateReport r = MustValidate(tmp.path());
  EXPECT_TRUE(r.valid()) << AllFindings(r);
  EXPECT_EQ(r.root, tmp.path());
  EXPECT_EQ(r.checkpoint_dir, dir);
  EXPECT_EQ(r.shards, 4u);
  EXPECT_EQ(r.shards_ok, 4u);
  EXPECT_EQ(r.entries, 16u);
  EXPECT_EQ(r.bytes_verified, r.payload_bytes);
  // lm_head.w: 2 chunks of 2 blocks; every other non-empty chunk has one.
  EXPECT_EQ(r.blocks_verified, r.chunks + 2);
}

TEST(Validate, CheckpointDirectoryIsNotARoot) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  fs::create_directory(tmp / ".tmp-step-00000009-0123456789abcdef");
  ValidateReport r = MustValidate(dir);
  EXPECT_TRUE(r.valid()) << AllFindings(r);
  EXPECT_EQ(r.root, "");
}

TEST(Validate, MissingDirectory) {
  TempDir tmp;
  ValidateOptions o;
  o.path = tmp / "nope";
  EXPECT_THAT(
      Validate(o),
      StatusIs(absl::StatusCode::kNotFound,
               tmp / "nope" + ": no such checkpoint or checkpoint root"));
}

TEST(Validate, NotACheckpoint) {
  TempDir tmp;
  fs::create_directory(tmp / "data");
  ValidateOptions o;
  o.path = tmp / "data";
  EXPECT_THAT(Validate(o),
              StatusIs(absl::StatusCode::kNotFound,
                       tmp / "data" + ": not a checkpoint (no MANIFEST) nor a "
                                      "checkpoint root (no 'latest')"));
}

TEST(Validate, QuickWithCheckFiniteIsRefused) {
  ValidateOptions o;
  o.path = "/";
  o.quick = o.check_finite = true;
  EXPECT_THAT(Validate(o),
              StatusIs(absl::StatusCode::kInvalidArgument, "--quick"));
}

TEST(Validate, NewerManifestVersionIsUnsupported) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  std::string m = testing::ReadBytes(dir + "/MANIFEST");
  m[8] = 2;  // major version 2
  testing::WriteBytes(dir + "/MANIFEST", m);
  ValidateOptions o;
  o.path = dir;
  EXPECT_THAT(Validate(o), StatusIs(absl::StatusCode::kFailedPrecondition,
                                    dir + "/MANIFEST: "));
}

TEST(Validate, CorruptManifest) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  FlipByte(dir + "/MANIFEST", 60);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].file, dir + "/MANIFEST");
  EXPECT_THAT(r.findings[0].message, HasSubstr("checksum"));
  EXPECT_FALSE(r.manifest_ok);
}

TEST(Validate, CorruptedBlockNamesFileEntryChunkAndBlock) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  // Chunk 1 of layers.0.attn.w is the box [0:4, 4:8] on shard 1.
  FlipByte(dir + "/shard-00001.ckpt",
           ChunkOffset(dir, "layers.0.attn.w", 1) + 3);
  ValidateReport r = MustValidate(tmp.path());
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  const Finding& f = r.findings[0];
  EXPECT_EQ(f.severity, Severity::kError);
  EXPECT_EQ(f.file, dir + "/shard-00001.ckpt");
  EXPECT_EQ(f.entry, "layers.0.attn.w");
  EXPECT_EQ(f.chunk, 1);
  EXPECT_EQ(f.region, "[0:4, 4:8]");
  EXPECT_EQ(f.block, 0);
  EXPECT_THAT(f.message, HasSubstr("checksum 0x"));
  EXPECT_EQ(FindingText(f).rfind(
                dir + "/shard-00001.ckpt: block 0 of chunk 1 [0:4, 4:8] of "
                      "'layers.0.attn.w': checksum 0x",
                0),
            0u);
  EXPECT_EQ(r.blocks_verified, r.chunks + 2 - 1);
}

TEST(Validate, CorruptedSecondBlockOfZstdChunk) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  auto m =
      format::DecodeManifest(testing::ReadBytes(dir + "/MANIFEST")).value();
  // lm_head.w chunk 0 lies on shard 0; its second block ends its payload.
  const format::ChunkRecord* c = nullptr;
  for (const auto& e : m.entries) {
    if (e.name == "lm_head.w") c = &e.chunks[0];
  }
  ASSERT_NE(c, nullptr);
  FlipByte(dir + "/shard-00000.ckpt", c->data_offset + c->stored_length - 1);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].entry, "lm_head.w");
  EXPECT_EQ(r.findings[0].chunk, 0);
  EXPECT_EQ(r.findings[0].block, 1);
}

TEST(Validate, TruncatedShard) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  const std::string shard = dir + "/shard-00003.ckpt";
  const uint64_t size = fs::file_size(shard);
  fs::resize_file(shard, size - 100);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].file, shard);
  EXPECT_EQ(r.findings[0].message,
            absl::StrCat("file is ", size - 100, " bytes, the manifest says ",
                         size, " (truncated)"));
  EXPECT_EQ(r.shards_ok, 3u);
}

TEST(Validate, TruncatedBelowTheHeader) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  fs::resize_file(dir + "/shard-00003.ckpt", 20);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_THAT(r.findings[0].message, HasSubstr("shard header"));
}

TEST(Validate, MissingShardFile) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  fs::remove(dir + "/shard-00002.ckpt");
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].file, dir + "/shard-00002.ckpt");
  EXPECT_EQ(r.findings[0].message,
            "shard file is missing (shard 2 in the manifest)");
}

TEST(Validate, ShardFromAnotherCheckpoint) {
  TempDir tmp, other;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  FixtureSpec spec = StandardSpec();
  spec.id[0] = 0xee;
  std::string odir = WriteCheckpoint(other.path(), spec);
  fs::copy_file(odir + "/shard-00001.ckpt", dir + "/shard-00001.ckpt",
                fs::copy_options::overwrite_existing);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].file, dir + "/shard-00001.ckpt");
  EXPECT_EQ(r.findings[0].message,
            "checkpoint id ee1112131415161718191a1b1c1d1e1f != manifest's "
            "101112131415161718191a1b1c1d1e1f: this shard belongs to another "
            "checkpoint");
}

TEST(Validate, ShardIdMismatch) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  fs::copy_file(dir + "/shard-00000.ckpt", dir + "/shard-00001.ckpt",
                fs::copy_options::overwrite_existing);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].message, "shard id 0 != 1 in the manifest");
}

TEST(Validate, CorruptShardIndex) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  const std::string shard = dir + "/shard-00001.ckpt";
  FlipByte(shard, fs::file_size(shard) - 40);  // in the index, before the tail
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].file, shard);
  EXPECT_THAT(r.findings[0].message, HasSubstr("checksum"));
}

TEST(Validate, IndexInfoDiffersFromManifest) {
  TempDir tmp;
  FixtureSpec spec = StandardSpec();
  spec.edit_index = [](uint32_t shard, format::ShardIndex* index) {
    if (shard == 1)
      index->info.created_unix_ns += 5;  // as a rank with its own clock would
  };
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].message,
            "CHECKPOINT_INFO differs from the manifest's: created_unix_ns "
            "1795219200000000005 "
            "!= 1795219200000000000 (index != manifest)");
}

TEST(Validate, IndexMetadataDiffersFromManifest) {
  TempDir tmp;
  FixtureSpec spec = StandardSpec();
  spec.edit_index = [](uint32_t shard, format::ShardIndex* index) {
    if (shard == 2) index->metadata = {{"run", "other"}};
  };
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_THAT(r.findings[0].message, HasSubstr("METADATA differs"));
}

// §5.6: a METADATA section that is present but empty is compared too.
TEST(Validate, EmptyIndexMetadataSectionWhenTheManifestHasPairs) {
  TempDir tmp;
  FixtureSpec spec = StandardSpec();
  spec.edit_index = [](uint32_t shard, format::ShardIndex* index) {
    if (shard != 1) return;
    index->metadata.clear();
    index->metadata_present = true;
  };
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].file, dir + "/shard-00001.ckpt");
  EXPECT_EQ(r.findings[0].message,
            "METADATA differs from the manifest's (0 pairs in the index, 1 in "
            "the manifest)");
}

// §5.6: an index without METADATA is not compared.
TEST(Validate, IndexWithoutMetadataSectionIsAccepted) {
  TempDir tmp;
  FixtureSpec spec = StandardSpec();
  spec.edit_index = [](uint32_t shard, format::ShardIndex* index) {
    if (shard == 1) index->metadata.clear();
  };
  ValidateReport r = MustValidate(WriteCheckpoint(tmp.path(), spec));
  EXPECT_TRUE(r.findings.empty()) << AllFindings(r);
}

// §5.7: an entry with no chunk in any shard ("empty" of StandardSpec, which
// the fixture lists in shard 0) MUST appear in some index.
TEST(Validate, ChunklessEntryInNoShardIndex) {
  TempDir tmp;
  FixtureSpec spec = StandardSpec();
  spec.edit_index = [](uint32_t, format::ShardIndex* index) {
    auto& v = index->entries;
    v.erase(std::remove_if(v.begin(), v.end(),
                           [](auto& e) { return e.name == "empty"; }),
            v.end());
  };
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(FindingText(r.findings[0]),
            dir +
                ": entry 'empty': has no chunk in any shard, and no shard "
                "index lists it "
                "with zero chunks (spec/FORMAT.md §5.7)");
}

// §9: a bool byte other than 0x00 and 0x01 is corrupt.
TEST(Validate, BoolByteOtherThanZeroOrOne) {
  TempDir tmp;
  FixtureSpec spec = StandardSpec();
  for (auto& t : spec.tensors) {
    if (t.name == "mask") t.data[4] = 2;
  }
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(FindingText(r.findings[0]),
            dir +
                "/shard-00003.ckpt: block 0 of chunk 0 [0:10] of 'mask': bool "
                "element 4 of "
                "the chunk is 0x02, not 0x00 or 0x01 (spec/FORMAT.md §9)");
}

TEST(Validate, ChunkMissingFromIndex) {
  TempDir tmp;
  FixtureSpec spec = StandardSpec();
  spec.edit_index = [](uint32_t shard, format::ShardIndex* index) {
    if (shard != 3) return;
    for (auto& e : index->entries) {
      if (e.name == "embed.w") e.chunks.clear();
    }
  };
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].entry, "embed.w");
  EXPECT_EQ(r.findings[0].chunk, 3);
  EXPECT_THAT(r.findings[0].message, HasSubstr("not in the shard index"));
}

TEST(Validate, EntryMissingFromIndex) {
  TempDir tmp;
  FixtureSpec spec = StandardSpec();
  spec.edit_index = [](uint32_t shard, format::ShardIndex* index) {
    if (shard != 3) return;
    auto& v = index->entries;
    v.erase(std::remove_if(v.begin(), v.end(),
                           [](auto& e) { return e.name == "mask"; }),
            v.end());
  };
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].entry, "mask");
  EXPECT_THAT(r.findings[0].message,
              HasSubstr("the shard index does not list the entry"));
}

TEST(Validate, IndexChunkNotInManifest) {
  TempDir tmp;
  FixtureSpec spec = StandardSpec();
  spec.edit_index = [](uint32_t shard, format::ShardIndex* index) {
    if (shard != 0) return;
    for (auto& e : index->entries) {
      if (e.name == "sparse") return;
    }
    // Shard 0 claims an empty chunk of 'sparse', which the manifest lacks.
    format::EntryRecord e;
    e.name = "sparse";
    e.shape = {10};
    e.flags = format::kEntryFlagPartial;
    format::ChunkRecord c;
    c.region = FlatRange{9, 0};
    e.chunks.push_back(c);
    index->entries.push_back(e);
  };
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].entry, "sparse");
  EXPECT_THAT(r.findings[0].message,
              HasSubstr("that the manifest does not list"));
}

TEST(Validate, IndexEntryDescribedDifferently) {
  TempDir tmp;
  FixtureSpec spec = StandardSpec();
  spec.edit_index = [](uint32_t shard, format::ShardIndex* index) {
    if (shard != 1) return;
    for (auto& e : index->entries) {
      if (e.name == "tokens") e.dtype = DType::kUInt32;
    }
  };
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].message,
            "the shard index has tensor uint32 [6], the manifest has tensor "
            "int32 [6]");
}

TEST(Validate, OverlappingChunks) {
  TempDir tmp;
  FixtureSpec spec = StandardSpec();
  for (auto& t : spec.tensors) {
    if (t.name == "layers.0.attn.w.exp_avg")
      t.pieces[1].region = FlatRange{4, 15};
  }
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].file, dir + "/MANIFEST");
  EXPECT_EQ(r.findings[0].entry, "layers.0.attn.w.exp_avg");
  EXPECT_THAT(r.findings[0].message, HasSubstr("overlap"));
}

TEST(Validate, UncoveredElements) {
  TempDir tmp;
  FixtureSpec spec = StandardSpec();
  for (auto& t : spec.tensors) {
    if (t.name == "embed.w") t.pieces.pop_back();
  }
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].entry, "embed.w");
  EXPECT_THAT(r.findings[0].message, HasSubstr("not covered"));
}

TEST(Validate, ObjectWithoutItsBytes) {
  TempDir tmp;
  FixtureSpec spec = StandardSpec();
  for (auto& t : spec.tensors) {
    if (t.name == "rng.rank1") t.pieces.clear();
  }
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].entry, "rng.rank1");
  EXPECT_THAT(r.findings[0].message, HasSubstr("not covered by any chunk"));
}

TEST(Validate, ReadErrorIsAFindingAndTheRestGoesOn) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  FaultInjectingStorage faulty(DefaultStorage());
  faulty.OnlyPathsContaining("shard-00001");
  faulty.FailAt(StorageOp::kRead, 4, absl::InternalError("Input/output error"));
  ValidateOptions o;
  o.path = dir;
  o.storage = &faulty;
  o.threads = 1;
  CKPT_ASSERT_OK_AND_ASSIGN(ValidateReport r, Validate(o));
  // Reads 1-3 of shard 1 are its header, tail and index; the 4th is payload.
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].file, dir + "/shard-00001.ckpt");
  EXPECT_THAT(r.findings[0].message, HasSubstr("injected fault: pread"));
  EXPECT_THAT(r.findings[0].message, HasSubstr("chunks not verified"));
  EXPECT_EQ(r.shards_ok, 4u);
  EXPECT_GT(r.blocks_verified, 0u);
}

TEST(Validate, StrayTempDirIsAWarning) {
  TempDir tmp;
  WriteCheckpoint(tmp.path(), StandardSpec());
  fs::create_directory(tmp / ".tmp-step-00000008-00112233aabbccdd");
  testing::WriteBytes(tmp / ".tmp-latest-0011223344556677", "x");
  ValidateReport r = MustValidate(tmp.path());
  ASSERT_EQ(r.findings.size(), 2u) << AllFindings(r);
  EXPECT_TRUE(r.valid());  // warnings alone
  EXPECT_EQ(r.errors(), 0u);
  EXPECT_EQ(r.warnings(), 2u);
  EXPECT_EQ(r.findings[0].file, tmp / ".tmp-latest-0011223344556677");
  EXPECT_EQ(r.findings[0].message,
            "stray temporary file left by an interrupted save; delete it if no "
            "save is running");
  EXPECT_EQ(r.findings[1].file, tmp / ".tmp-step-00000008-00112233aabbccdd");
  EXPECT_THAT(r.findings[1].message, HasSubstr("stray temporary directory"));
}

TEST(Validate, BrokenLatestFallsBackToTheNewestCheckpoint) {
  TempDir tmp;
  FixtureSpec older = StandardSpec();
  older.step = 5;
  WriteCheckpoint(tmp.path(), older);
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  testing::WriteBytes(tmp / "latest",
                      "ckpt-latest v1 step-00000007 0000000000000000\n");
  ValidateReport r = MustValidate(tmp.path());
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].file, tmp / "latest");
  EXPECT_THAT(r.findings[0].message, HasSubstr("broken pointer: "));
  EXPECT_THAT(r.findings[0].message,
              HasSubstr("; validating step-00000007, the newest committed "
                        "checkpoint, instead"));
  EXPECT_EQ(r.checkpoint_dir, dir);
  EXPECT_EQ(r.shards_ok, 4u);
}

TEST(Validate, LatestPointsToAMissingCheckpoint) {
  TempDir tmp;
  WriteCheckpoint(tmp.path(), StandardSpec());
  testing::WriteBytes(tmp / "latest", format::EncodeLatest("step-00000009"));
  ValidateReport r = MustValidate(tmp.path());
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].message,
            "points to 'step-00000009', which is not a committed checkpoint; "
            "validating "
            "step-00000007, the newest committed checkpoint, instead");
}

TEST(Validate, RootWithoutCommittedCheckpoint) {
  TempDir tmp;
  fs::create_directory(tmp / ".tmp-step-00000001-00112233aabbccdd");
  ValidateReport r = MustValidate(tmp.path());
  EXPECT_EQ(r.checkpoint_dir, "");
  ASSERT_EQ(r.findings.size(), 2u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].severity, Severity::kWarning);  // the .tmp- directory
  EXPECT_EQ(r.findings[1].file, tmp / "latest");
  EXPECT_EQ(r.findings[1].message,
            "missing; there is no committed checkpoint to validate");
}

TEST(Validate, QuickReadsNoPayload) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  FlipByte(dir + "/shard-00001.ckpt", ChunkOffset(dir, "layers.0.attn.w", 1));
  ValidateReport quick = MustValidate(dir, /*quick=*/true);
  EXPECT_TRUE(quick.valid()) << AllFindings(quick);
  EXPECT_EQ(quick.blocks_verified, 0u);
  ValidateReport full = MustValidate(dir);
  EXPECT_EQ(full.findings.size(), 1u) << AllFindings(full);

  // Byte count: the manifest, and per shard its header, tail and index.
  ::ckpt::testing::ReadCountingStorage counting;
  ValidateOptions o;
  o.path = dir;
  o.quick = true;
  o.storage = &counting;
  CKPT_ASSERT_OK(Validate(o));
  uint64_t metadata = fs::file_size(dir + "/MANIFEST");
  auto m =
      format::DecodeManifest(testing::ReadBytes(dir + "/MANIFEST")).value();
  for (const auto& s : m.shards) {
    std::string bytes = testing::ReadBytes(dir + "/" + s.file_name);
    auto tail =
        format::DecodeShardTail(bytes.substr(bytes.size() - 32), bytes.size())
            .value();
    metadata += 64 + 32 + tail.index_length;
  }
  EXPECT_EQ(counting.bytes_read(), metadata);
}

TEST(Validate, CheckFiniteReportsNaNAndInf) {
  TempDir tmp;
  FixtureSpec spec = StandardSpec();
  for (auto& t : spec.tensors) {
    if (t.name != "layers.0.attn.w") continue;
    float nan = NAN, inf = INFINITY;
    // Element (5, 6) is in chunk 3 ([4:8, 4:8]) at local index 1 * 4 + 2.
    std::memcpy(&t.data[(5 * 8 + 6) * 4], &nan, 4);
    std::memcpy(&t.data[(7 * 8 + 7) * 4], &inf, 4);
  }
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  EXPECT_TRUE(MustValidate(dir).valid());
  ValidateReport r = MustValidate(dir, false, /*check_finite=*/true);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(FindingText(r.findings[0]),
            dir +
                "/shard-00003.ckpt: block 0 of chunk 3 [4:8, 4:8] of "
                "'layers.0.attn.w': "
                "non-finite values: 1 NaN, 1 Inf; the first at [5, 6]");
}

TEST(Validate, MultipleProblemsReportedTogether) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  FlipByte(dir + "/shard-00000.ckpt", ChunkOffset(dir, "embed.w", 0));
  FlipByte(dir + "/shard-00000.ckpt", ChunkOffset(dir, "grads8", 0));
  fs::remove(dir + "/shard-00002.ckpt");
  fs::resize_file(dir + "/shard-00003.ckpt",
                  fs::file_size(dir + "/shard-00003.ckpt") - 1);
  fs::create_directory(tmp / ".tmp-step-00000008-00112233aabbccdd");
  ValidateReport r = MustValidate(tmp.path());
  ASSERT_EQ(r.findings.size(), 5u) << AllFindings(r);
  EXPECT_EQ(r.errors(), 4u);
  EXPECT_EQ(r.warnings(), 1u);
  EXPECT_EQ(r.findings[1].entry, "embed.w");
  EXPECT_EQ(r.findings[2].entry, "grads8");
  EXPECT_EQ(r.findings[3].file, dir + "/shard-00002.ckpt");
  EXPECT_EQ(r.findings[4].file, dir + "/shard-00003.ckpt");
  EXPECT_EQ(r.shards_ok, 2u);
}

TEST(Validate, FindingsBeyondTheLimitAreCounted) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  for (const char* name : {"embed.w", "grads8", "step", "rng.rank0"}) {
    FlipByte(dir + "/shard-00000.ckpt", ChunkOffset(dir, name, 0));
  }
  ValidateOptions o;
  o.path = dir;
  o.max_findings = 3;
  CKPT_ASSERT_OK_AND_ASSIGN(ValidateReport r, Validate(o));
  EXPECT_EQ(r.findings.size(), 3u);
  EXPECT_EQ(r.findings_dropped, 1u);
  EXPECT_FALSE(r.valid());
}

TEST(Validate, OnDataSeesEveryVerifiedByteOnce) {
  TempDir tmp;
  std::string dir = WriteCheckpoint(tmp.path(), StandardSpec());
  Mutex mu;
  std::map<std::pair<size_t, size_t>, uint64_t> bytes;
  ValidateOptions o;
  o.path = dir;
  o.threads = 3;
  o.on_data = [&](size_t e, const format::EntryRecord&, size_t c,
                  uint64_t offset, absl::string_view raw) {
    MutexLock l(&mu);
    bytes[{e, c}] += raw.size();
  };
  CKPT_ASSERT_OK_AND_ASSIGN(ValidateReport r, Validate(o));
  auto m =
      format::DecodeManifest(testing::ReadBytes(dir + "/MANIFEST")).value();
  for (size_t e = 0; e < m.entries.size(); ++e) {
    for (size_t c = 0; c < m.entries[e].chunks.size(); ++c) {
      uint64_t raw = RegionElements(m.entries[e].chunks[c].region) *
                     DTypeSize(m.entries[e].dtype);
      EXPECT_EQ(bytes[std::make_pair(e, c)], raw)
          << m.entries[e].name << " chunk " << c;
    }
  }
}

TEST(Validate, TinyChunksAcrossGranules) {
  // 300 chunks of 16 bytes, 4 KiB-block tensors: reads span chunks.
  TempDir tmp;
  FixtureSpec spec;
  spec.world = 2;
  spec.alignment = 1;
  testing::FixtureTensor t{"flat", DType::kFloat32, {1200}};
  for (uint32_t i = 0; i < 300; ++i)
    t.pieces.push_back({FlatRange{i * 4, 4}, i % 2});
  t.data = testing::Elements<float>(1200, [](uint64_t i) { return float(i); });
  spec.tensors.push_back(t);
  std::string dir = WriteCheckpoint(tmp.path(), spec);
  FlipByte(dir + "/shard-00001.ckpt", ChunkOffset(dir, "flat", 201) + 2);
  ValidateReport r = MustValidate(dir);
  ASSERT_EQ(r.findings.size(), 1u) << AllFindings(r);
  EXPECT_EQ(r.findings[0].chunk, 201);
  EXPECT_EQ(r.blocks_verified, 299u);
}

// A checkpoint saved by the real Writer (one rank: see the next test).
TEST(Validate, WriterCheckpointIsValid) {
  TempDir tmp;
  std::string w =
      testing::Elements<float>(64 * 32, [](uint64_t i) { return i * 0.5f; });
  auto writer = Writer::Create({}).value();
  CKPT_ASSERT_OK(writer->AddTensor("w", DType::kFloat32, {64, 32},
                                   FullBox({64, 32}), w.data()));
  CKPT_ASSERT_OK(writer->SetObject("rng", "state"));
  SaveOptions so;
  so.codec = format::Codec::kZstd;
  so.block_size = 4096;
  CKPT_ASSERT_OK(writer->Save(tmp.path(), 3, so).status());
  ValidateReport r = MustValidate(tmp.path(), false, true);
  EXPECT_TRUE(r.valid()) << AllFindings(r);
  EXPECT_EQ(r.blocks_verified, 3u);
}

// Regression: ckpt::Writer once gave each rank's shard index its own
// created_unix_ns and fingerprint (spec/FORMAT.md §7.1).
TEST(Validate, MultiRankWriterCheckpointIsValid) {
  TempDir tmp;
  const int kWorld = 4;
  std::string w =
      testing::Elements<float>(64 * 32, [](uint64_t i) { return i * 0.5f; });
  InProcessWorld world(kWorld);
  CKPT_ASSERT_OK(RunRanks(world, [&](Communicator& comm) -> absl::Status {
    Writer::Options wo;
    wo.comm = &comm;
    CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
    const uint64_t r = comm.rank();
    CKPT_RETURN_IF_ERROR(writer->AddTensor("w", DType::kFloat32, {64, 32},
                                           Box{{r * 16, 0}, {16, 32}},
                                           w.data() + r * 16 * 32 * 4));
    return writer->Save(tmp.path(), 3, SaveOptions{}).status();
  }));
  ValidateReport r = MustValidate(tmp.path());
  EXPECT_TRUE(r.valid()) << AllFindings(r);
}

// The findings are written one at a time as the document nlohmann would
// write held whole: parsing the output and dumping it again gives the same
// text, for a report with findings (a name that is not ASCII, a byte that is
// not UTF-8) and for one without.
TEST(PrintValidateJson, SameTextAsTheDocument) {
  ValidateReport r;
  r.checkpoint_dir = "/ckpt/step-00000001";
  Finding f;
  f.file = r.checkpoint_dir + "/MANIFEST";
  f.entry = "w\xc3\xa9\x1b";
  f.chunk = 3;
  f.region = "[0:4]";
  f.message = "bad \xff byte";
  r.findings = {f, Finding{}};
  for (int findings : {2, 0}) {
    r.findings.resize(findings);
    std::ostringstream out;
    PrintValidateJson(r, out);
    const auto j = nlohmann::ordered_json::parse(out.str());
    EXPECT_EQ(j["findings"].size(), static_cast<size_t>(findings));
    EXPECT_EQ(out.str(), j.dump(2, ' ', true) + "\n");
  }
}

}  // namespace
}  // namespace ckpt::tools

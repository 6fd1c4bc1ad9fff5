// Corruption: seeded, reproducible damage to every kind of file of a
// checkpoint root (MANIFEST, shard header, payload, index and tail,
// `latest`): bit flips, zeroed ranges, truncation, extension, and shard
// files swapped in from other checkpoints. After each case:
//
//  - ckpt-validate's checks (the tool's library, and the binary itself for
//    a sample) report an error naming the damaged file, and, for damage
//    inside one payload block, the entry and the block: exit 1;
//  - a load through the Reader fails with DataLoss;
//  - never a crash, a hang, or a load that returns wrong bytes.
//
// Two exceptions follow from the spec, and are checked as such:
//  - damage confined to padding (payload bytes that belong to no chunk,
//    spec/FORMAT.md §5.2, which readers MUST ignore) is harmless: validate
//    finds nothing and the load is exact;
//  - damage that turns a header's major version into one above 1 makes the
//    file "Unsupported" (§5.1 step 3, §6.2 step 2): the load fails with
//    FailedPrecondition, and for the MANIFEST ckpt-validate stops with that
//    error (exit 2, "upgrade ckpt") instead of exit 1.
//
// The root holds two checkpoints of two ranks (step 1 uncompressed, step 2
// zstd; tests/reliability/model.h), block size 64 KiB, alignment 4096 (so
// there is padding). Damage goes to a copy of one file at a time, which is
// restored after the case.
//
// CKPT_CORRUPTION_CASES scales the number of cases of each test (default:
// 1916 cases in all); CKPT_CORRUPTION_SEED (default 1) seeds them. A failure
// prints the seed and the case, which replays alone with
// CKPT_CORRUPTION_ONLY=<case number>.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/shard.h"
#include "ckpt/in_process.h"
#include "ckpt/ops/validate.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "reliability/model.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#ifdef CKPT_VALIDATE_BIN
#include "reliability/subprocess.h"
#endif

namespace ckpt::reliability {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::TempDir;

constexpr int kScale = 1;
constexpr int kWorld = 2;

using ::ckpt::testing::ReadFileBytes;
using ::ckpt::testing::WriteFileBytes;

absl::Status SaveSteps(const std::string& root) {
  InProcessWorld w(kWorld);
  return RunRanks(w, [&](Communicator& comm) -> absl::Status {
    CKPT_ASSIGN_OR_RETURN(auto state, RankState::Create(&comm, kScale));
    SaveConfig c;
    c.scale = kScale;
    // One I/O thread: zstd chunks take file offsets in the order they are
    // compressed, so several threads would vary the layout from run to
    // run, and a seed would not name the same damage.
    c.io_threads = 1;
    for (uint64_t step : {1, 2})
      CKPT_RETURN_IF_ERROR(state->Save(root, step, c).status());
    return absl::OkStatus();
  });
}

// The parts of a file that damage is aimed at.
enum class Part {
  kManifest,
  kLatest,
  kHeader,
  kPayload,
  kPadding,
  kIndex,
  kTail
};

const char* PartName(Part p) {
  switch (p) {
    case Part::kManifest:
      return "manifest";
    case Part::kLatest:
      return "latest";
    case Part::kHeader:
      return "shard header";
    case Part::kPayload:
      return "payload";
    case Part::kPadding:
      return "padding";
    case Part::kIndex:
      return "shard index";
    case Part::kTail:
      return "shard tail";
  }
  return "?";
}

// One stored block of a chunk: where it lies in its shard file.
struct BlockSpan {
  uint64_t begin, end;
  std::string entry;
  int64_t block;
};

// A file of the root, with its pristine bytes and, for a shard, the layout
// decoded from its own index.
struct FileInfo {
  std::string path;
  std::string
      checkpoint;  // the checkpoint directory it belongs to ("" for latest)
  bool is_shard = false;
  bool is_manifest = false;
  std::string pristine;
  std::vector<BlockSpan> blocks;  // sorted by begin
  uint64_t index_offset =
      0;  // shards: the index and the tail are [index_offset, size)

  // The block holding byte `off`, or null (padding, or outside the payload).
  const BlockSpan* BlockAt(uint64_t off) const {
    auto it = std::upper_bound(
        blocks.begin(), blocks.end(), off,
        [](uint64_t o, const BlockSpan& b) { return o < b.begin; });
    if (it == blocks.begin()) return nullptr;
    --it;
    return off < it->end ? &*it : nullptr;
  }
  bool IsPadding(uint64_t off) const {
    return is_shard && off >= format::kShardHeaderSize && off < index_offset &&
           BlockAt(off) == nullptr;
  }
};

FileInfo LoadShard(const std::string& path, const std::string& checkpoint) {
  FileInfo f;
  f.path = path;
  f.checkpoint = checkpoint;
  f.is_shard = true;
  f.pristine = ReadFileBytes(path);
  const std::string& b = f.pristine;
  auto header = format::DecodeShardHeader(
      absl::string_view(b).substr(0, format::kShardHeaderSize));
  EXPECT_THAT(header, IsOk()) << path;
  auto tail = format::DecodeShardTail(
      absl::string_view(b).substr(b.size() - format::kShardTailSize), b.size());
  EXPECT_THAT(tail, IsOk()) << path;
  if (!header.ok() || !tail.ok()) return f;
  f.index_offset = tail->index_offset;
  auto index = format::DecodeShardIndex(
      absl::string_view(b).substr(tail->index_offset, tail->index_length),
      *header, *tail);
  EXPECT_THAT(index, IsOk()) << path;
  if (!index.ok()) return f;
  for (const format::EntryRecord& e : index->entries) {
    for (const format::ChunkRecord& c : e.chunks) {
      uint64_t off = c.data_offset;
      for (size_t k = 0; k < c.blocks.size(); ++k) {
        const uint64_t n = c.blocks[k].stored_size;
        if (n > 0)
          f.blocks.push_back({off, off + n, e.name, static_cast<int64_t>(k)});
        off += n;
      }
    }
  }
  std::sort(
      f.blocks.begin(), f.blocks.end(),
      [](const BlockSpan& x, const BlockSpan& y) { return x.begin < y.begin; });
  return f;
}

// What a case did to a file, for the checks and for the failure message.
struct Damage {
  std::string what;  // "flip 2 bit(s) in the payload at 70.3 4000.1" (byte.bit)
  std::string bytes;  // the damaged file
  bool only_padding = false;
  bool unsupported = false;          // a header now claims a major version > 1
  const BlockSpan* block = nullptr;  // all changed bytes lie in this one block
};

class CorruptionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    root_ = *dir_ / "root";
    other_ = *dir_ / "other";
    ASSERT_THAT(SaveSteps(root_), IsOk());
    ASSERT_THAT(SaveSteps(other_), IsOk());  // same data, other checkpoint ids
    files_ = new std::vector<FileInfo>();
    for (uint64_t step : {1, 2}) {
      const std::string ckpt = JoinPath(root_, format::StepDirName(step));
      FileInfo m;
      m.path = JoinPath(ckpt, format::kManifestFileName);
      m.checkpoint = ckpt;
      m.is_manifest = true;
      m.pristine = ReadFileBytes(m.path);
      files_->push_back(std::move(m));
      for (uint32_t r = 0; r < kWorld; ++r) {
        files_->push_back(
            LoadShard(JoinPath(ckpt, format::ShardFileName(r)), ckpt));
      }
    }
    FileInfo latest;
    latest.path = JoinPath(root_, format::kLatestFileName);
    latest.pristine = ReadFileBytes(latest.path);
    files_->push_back(std::move(latest));
  }
  static void TearDownTestSuite() {
    delete files_;
    delete dir_;
  }

  void SetUp() override {
    // Every case starts from the pristine root; a test that failed midway
    // must not leave damage for the next.
    for (const FileInfo& f : *files_) WriteFileBytes(f.path, f.pristine);
    auto clean = ops::Validate(ValidateOptionsFor(root_));
    ASSERT_THAT(clean, IsOk());
    ASSERT_TRUE(clean->valid()) << ops::FindingText(clean->findings.at(0));
  }

  static ops::ValidateOptions ValidateOptionsFor(const std::string& path) {
    ops::ValidateOptions o;
    o.path = path;
    o.threads = 1;
    return o;
  }

  // The shard files of both checkpoints.
  static std::vector<const FileInfo*> Shards() {
    std::vector<const FileInfo*> out;
    for (const FileInfo& f : *files_) {
      if (f.is_shard) out.push_back(&f);
    }
    return out;
  }

  // Picks a file (uniformly) and a part of it to aim at: in a shard, the
  // header 25%, a payload block 35%, the index 20%, the tail 15% and
  // padding 5% (the harmless case).
  static std::pair<const FileInfo*, Part> PickTarget(std::mt19937_64& rng) {
    const FileInfo& f = (*files_)[rng() % files_->size()];
    if (f.is_manifest) return {&f, Part::kManifest};
    if (!f.is_shard) return {&f, Part::kLatest};
    const uint64_t x = rng() % 100;
    Part p = x < 25   ? Part::kHeader
             : x < 60 ? Part::kPayload
             : x < 80 ? Part::kIndex
             : x < 95 ? Part::kTail
                      : Part::kPadding;
    return {&f, p};
  }

  // A byte offset inside `part` of `f`.
  static uint64_t PickOffset(std::mt19937_64& rng, const FileInfo& f,
                             Part part) {
    const uint64_t size = f.pristine.size();
    switch (part) {
      case Part::kHeader:
        return rng() % format::kShardHeaderSize;
      case Part::kPayload: {
        const BlockSpan& b = f.blocks[rng() % f.blocks.size()];
        return b.begin + rng() % (b.end - b.begin);
      }
      case Part::kPadding: {
        for (;;) {  // padding is most of [64, 4096) in every shard
          uint64_t off = format::kShardHeaderSize +
                         rng() % (f.index_offset - format::kShardHeaderSize);
          if (f.IsPadding(off)) return off;
        }
      }
      case Part::kIndex:
        return f.index_offset +
               rng() % (size - format::kShardTailSize - f.index_offset);
      case Part::kTail:
        return size - format::kShardTailSize + rng() % format::kShardTailSize;
      default:
        return rng() % size;
    }
  }

  // Fills in the classification of `d` against the pristine bytes of `f`.
  static void Classify(const FileInfo& f, Damage* d) {
    const std::string& a = f.pristine;
    const std::string& b = d->bytes;
    bool any = a.size() != b.size(),
         padding_only = a.size() == b.size() && f.is_shard;
    const BlockSpan* block = nullptr;
    bool one_block = a.size() == b.size() && f.is_shard;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      if (a[i] == b[i]) continue;
      any = true;
      if (!f.IsPadding(i)) padding_only = false;
      const BlockSpan* bl = f.is_shard ? f.BlockAt(i) : nullptr;
      if (bl == nullptr || (block != nullptr && block != bl)) one_block = false;
      block = bl;
    }
    EXPECT_TRUE(any) << "case made no change: " << d->what;
    d->only_padding = padding_only;
    d->block = one_block ? block : nullptr;
    // Bytes 8-9 are the major version of both a manifest and a shard
    // header; it counts only behind an intact magic (§5.1, §6.2).
    if ((f.is_manifest || f.is_shard) && b.size() >= 10 &&
        b.compare(0, format::kMagicSize, a, 0, format::kMagicSize) == 0) {
      const uint16_t major =
          static_cast<uint8_t>(b[8]) | static_cast<uint8_t>(b[9]) << 8;
      d->unsupported = major > format::kFormatMajor;
    }
  }

  // The checks of one case, with `f` holding `d.bytes`.
  void CheckCase(const FileInfo& f, const Damage& d, uint64_t case_no) {
    SCOPED_TRACE(absl::StrCat("case ", case_no, " (CKPT_CORRUPTION_SEED=",
                              Seed(), "): ", f.path, ": ", d.what));
    WriteFileBytes(f.path, d.bytes);
    ++cases_;
    // The checkpoint's directory, or the root when the damage is to
    // `latest` or to the checkpoint it names (validate and load follow it).
    const std::string latest_ckpt = JoinPath(root_, format::StepDirName(2));
    const std::string path = f.checkpoint.empty() || f.checkpoint == latest_ckpt
                                 ? root_
                                 : f.checkpoint;

    auto report = ops::Validate(ValidateOptionsFor(path));
    auto loaded = VerifyCheckpoint(path, kScale);
    ASSERT_FALSE(!loaded.ok() && IsWrongData(loaded.status()))
        << loaded.status();

    if (d.only_padding) {
      ++harmless_;
      ASSERT_THAT(report, IsOk());
      EXPECT_TRUE(report->valid()) << "padding is not checked (§5.2), yet: "
                                   << ops::FindingText(report->findings.at(0));
      EXPECT_THAT(loaded, IsOk());
      return;
    }
    EXPECT_FALSE(loaded.ok()) << "damage went unnoticed by the load";
    if (d.unsupported) {
      ++unsupported_;
      EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition)
          << loaded.status();
      if (f.is_manifest) {
        EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition)
            << report.status();
        return;
      }
    } else {
      EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss)
          << loaded.status();
    }
    ASSERT_THAT(report, IsOk());
    EXPECT_FALSE(report->valid());
    bool named = false;
    for (const ops::Finding& x : report->findings) {
      if (x.severity != ops::Severity::kError || x.file != f.path) continue;
      if (d.block != nullptr &&
          (x.entry != d.block->entry || x.block != d.block->block))
        continue;
      named = true;
    }
    std::string all;
    for (const ops::Finding& x : report->findings)
      absl::StrAppend(&all, "\n  ", ops::FindingText(x));
    EXPECT_TRUE(named) << "no error names " << f.path
                       << (d.block ? absl::StrCat(", entry '", d.block->entry,
                                                  "', block ", d.block->block)
                                   : "")
                       << "; findings:" << all;
    if (!d.unsupported) {
      EXPECT_TRUE(absl::StrContains(loaded.status().message(),
                                    f.path.substr(f.path.rfind('/') + 1)))
          << "the load's error does not name the file: " << loaded.status();
    }
#ifdef CKPT_VALIDATE_BIN
    if (case_no % 97 == 0) RunBinary(path, f.path);
#endif
  }

#ifdef CKPT_VALIDATE_BIN
  // The binary itself: exit 1 and the file named on stdout.
  void RunBinary(const std::string& path, const std::string& file) {
    TempDir out;
    auto child = Child::Start({CKPT_VALIDATE_BIN, path}, out / "validate");
    ASSERT_THAT(child, IsOk());
    const int st = child->Wait();
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1)
        << "ckpt-validate " << path << ": " << DescribeWaitStatus(st) << "\n"
        << child->Stdout() << child->Stderr();
    EXPECT_TRUE(absl::StrContains(child->Stdout(), file)) << child->Stdout();
    ++binary_runs_;
  }
#endif

  // Runs `n` cases of `make` (which damages the bytes of the file it is
  // given), restoring the file after each.
  template <typename Make>
  void RunCases(const char* label, uint64_t n, Make make) {
    std::mt19937_64 rng(Seed() * 1000003 + std::hash<std::string>()(label));
    const uint64_t only = EnvOr("CKPT_CORRUPTION_ONLY", 0);
    const uint64_t before = cases_;
    for (uint64_t i = 1; i <= n; ++i) {
      auto [f, part] = PickTarget(rng);
      Damage d;
      d.bytes = f->pristine;
      // Damage that changes nothing (zeroing zeros) is drawn again.
      for (int tries = 0; d.bytes == f->pristine && tries < 100; ++tries) {
        d.bytes = f->pristine;
        make(rng, *f, part, &d);
      }
      if (only != 0 && i != only) continue;
      Classify(*f, &d);
      CheckCase(*f, d, i);
      WriteFileBytes(f->path, f->pristine);
      if (HasFatalFailure()) return;
    }
    std::printf(
        "[ corruption ] %s: %llu cases (%llu harmless: padding only; %llu "
        "unsupported "
        "major version; %llu also through the ckpt-validate binary), seed "
        "%llu\n",
        label, static_cast<unsigned long long>(cases_ - before),
        static_cast<unsigned long long>(harmless_),
        static_cast<unsigned long long>(unsupported_),
        static_cast<unsigned long long>(binary_runs_),
        static_cast<unsigned long long>(Seed()));
  }

  static uint64_t Seed() { return EnvOr("CKPT_CORRUPTION_SEED", 1); }
  // CKPT_CORRUPTION_CASES: cases of the bit-flip test; the others scale.
  static uint64_t Cases(uint64_t fraction_of_800) {
    return std::max<uint64_t>(
        1, EnvOr("CKPT_CORRUPTION_CASES", 800) * fraction_of_800 / 800);
  }

  static TempDir* dir_;
  static std::string root_, other_;
  static std::vector<FileInfo>* files_;
  uint64_t cases_ = 0, harmless_ = 0, unsupported_ = 0, binary_runs_ = 0;
};

TempDir* CorruptionTest::dir_ = nullptr;
std::string CorruptionTest::root_;
std::string CorruptionTest::other_;
std::vector<FileInfo>* CorruptionTest::files_ = nullptr;

TEST_F(CorruptionTest, BitFlipsInEveryFileKind) {
  RunCases("bit flips", Cases(800),
           [](std::mt19937_64& rng, const FileInfo& f, Part part, Damage* d) {
             const int bits = 1 + static_cast<int>(rng() % 4);
             d->what = absl::StrCat("flip ", bits, " bit(s) in the ",
                                    PartName(part), " at");
             for (int k = 0; k < bits; ++k) {
               const uint64_t off = PickOffset(rng, f, part);
               const int bit = static_cast<int>(rng() % 8);
               d->bytes[off] = static_cast<char>(d->bytes[off] ^ (1 << bit));
               absl::StrAppend(&d->what, " ", off, ".", bit);
             }
           });
}

TEST_F(CorruptionTest, ZeroedRangesInEveryFileKind) {
  RunCases("zeroed ranges", Cases(500),
           [](std::mt19937_64& rng, const FileInfo& f, Part part, Damage* d) {
             const uint64_t off = PickOffset(rng, f, part);
             // Lengths from 1 byte to a whole 4 KiB page, at most to the end of
             // the file.
             const uint64_t len = std::min<uint64_t>(
                 1 + rng() % (rng() % 2 ? 16 : 4096), f.pristine.size() - off);
             std::fill(d->bytes.begin() + off, d->bytes.begin() + off + len,
                       '\0');
             d->what = absl::StrCat("zero [", off, ", ", off + len,
                                    ") from the ", PartName(part));
           });
}

TEST_F(CorruptionTest, TruncationOfEveryFileKind) {
  RunCases("truncation", Cases(300),
           [](std::mt19937_64& rng, const FileInfo& f, Part part, Damage* d) {
             // Cut inside the part aimed at (so every part's boundary is
             // reached), sometimes to nothing, sometimes by one byte.
             const uint64_t x = rng() % 10;
             const uint64_t size = f.pristine.size();
             const uint64_t keep = x == 0   ? 0
                                   : x == 1 ? size - 1
                                            : PickOffset(rng, f, part);
             d->bytes.resize(keep);
             d->what = absl::StrCat("truncate from ", size, " to ", keep,
                                    " bytes (in the ", PartName(part), ")");
           });
}

TEST_F(CorruptionTest, ExtensionOfEveryFileKind) {
  RunCases("extension", Cases(300),
           [](std::mt19937_64& rng, const FileInfo& f, Part, Damage* d) {
             const uint64_t x = rng() % 4;
             const uint64_t n = x == 0 ? 1 : 1 + rng() % (x == 1 ? 64 : 8192);
             const bool zeros = rng() % 2;
             for (uint64_t i = 0; i < n; ++i)
               d->bytes.push_back(zeros ? '\0' : static_cast<char>(rng()));
             // A copy of the file's own last bytes is the most plausible
             // extension (a tail that still parses, a repeated line of
             // `latest`).
             if (x == 3)
               d->bytes = f.pristine + f.pristine.substr(f.pristine.size() / 2);
             d->what = absl::StrCat("extend from ", f.pristine.size(), " to ",
                                    d->bytes.size(), " bytes",
                                    x == 3  ? " (its own second half appended)"
                                    : zeros ? " (zeros)"
                                            : " (random bytes)");
           });
}

// A shard file of another checkpoint in place of one of this checkpoint's:
// from another root with identical data (same sizes, other checkpoint id),
// from the other step of the same root, and the sibling shard of the same
// checkpoint (right id, wrong shard id).
TEST_F(CorruptionTest, ShardSwappedInFromAnotherCheckpoint) {
  uint64_t case_no = 0;
  for (const FileInfo* f : Shards()) {
    const std::string name = f->path.substr(f->path.rfind('/') + 1);
    const std::string step_dir =
        f->checkpoint.substr(f->checkpoint.rfind('/') + 1);
    const std::string other_step = step_dir == format::StepDirName(1)
                                       ? format::StepDirName(2)
                                       : format::StepDirName(1);
    const std::string sibling = name == format::ShardFileName(0)
                                    ? format::ShardFileName(1)
                                    : format::ShardFileName(0);
    const std::vector<std::pair<std::string, std::string>> sources = {
        {"the same shard of the same step of another root",
         JoinPath(JoinPath(other_, step_dir), name)},
        {"the same shard of the other step of this root",
         JoinPath(JoinPath(root_, other_step), name)},
        {"the same shard of the other step of another root",
         JoinPath(JoinPath(other_, other_step), name)},
        {"the other shard of the same checkpoint",
         JoinPath(f->checkpoint, sibling)},
    };
    for (const auto& [what, source] : sources) {
      Damage d;
      d.what = absl::StrCat("replaced by ", what, " (", source, ")");
      d.bytes = ReadFileBytes(source);
      Classify(*f, &d);
      d.block = nullptr;  // a whole file is wrong, not one block
      CheckCase(*f, d, ++case_no);
      WriteFileBytes(f->path, f->pristine);
      if (HasFatalFailure()) return;
    }
  }
  std::printf("[ corruption ] swapped shards: %llu cases\n",
              static_cast<unsigned long long>(cases_));
  EXPECT_EQ(cases_, 16u);
}

}  // namespace
}  // namespace ckpt::reliability

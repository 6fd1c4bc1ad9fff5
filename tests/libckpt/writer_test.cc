// Single-process save: commit protocol, options, and crash safety under
// injected faults at every storage operation of a save.
#include "ckpt/writer.h"

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "ckpt/format/latest.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/reader.h"
#include "ckpt/testing/fault_injection.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::ReferenceBytes;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;

struct Model {
  std::string w = ReferenceBytes(DType::kFloat32, {64, 32}, 1);
  std::string b = ReferenceBytes(DType::kBFloat16, {32}, 2);

  absl::Status Register(Writer& writer) {
    CKPT_RETURN_IF_ERROR(writer.AddTensor("w", DType::kFloat32, {64, 32},
                                          FullBox({64, 32}), w.data()));
    CKPT_RETURN_IF_ERROR(writer.AddTensor("b", DType::kBFloat16, {32},
                                          FlatRange{0, 32}, b.data()));
    return writer.SetObject("rng", "rng-state");
  }
};

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::string n = e.path().filename();
    if (n == ".ckpt-save.lock" || n == ".ckpt-commit.lock")
      continue;  // writers' locks
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status LoadAndCheck(const std::string& root, const Model& m,
                          uint64_t want_step, Storage* storage = nullptr) {
  ReaderOptions ro;
  ro.storage = storage;
  CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(root, ro));
  if (reader->manifest().info.step != want_step) {
    return absl::InternalError(
        absl::StrCat("step ", reader->manifest().info.step));
  }
  std::string w(m.w.size(), 0), b(m.b.size(), 0), rng;
  std::vector<LoadRequest> reqs = {
      {"w", DType::kFloat32, {64, 32}, FullBox({64, 32}), w.data()},
      {"b", DType::kBFloat16, {32}, FlatRange{0, 32}, b.data()}};
  reqs.push_back({});
  reqs.back().name = "rng";
  reqs.back().object = &rng;
  CKPT_RETURN_IF_ERROR(reader->Load(reqs).status());
  if (w != m.w || b != m.b || rng != "rng-state")
    return absl::InternalError("values differ");
  return absl::OkStatus();
}

TEST(WriterTest, TensorSourceStreamsBytesOnDemand) {
  for (auto codec : {format::Codec::kNone, format::Codec::kZstd}) {
    TempDir dir;
    Model m;
    CKPT_ASSERT_OK_AND_ASSIGN(auto writer, Writer::Create({}));
    std::atomic<uint64_t> served{0};
    CKPT_ASSERT_OK(writer->AddTensorSource(
        "w", DType::kFloat32, {64, 32}, FullBox({64, 32}),
        [&](uint64_t off, void* dst, uint64_t n) {
          EXPECT_LE(off + n, m.w.size());
          std::memcpy(dst, m.w.data() + off, n);
          served += n;
          return absl::OkStatus();
        }));
    CKPT_ASSERT_OK(writer->AddTensor("b", DType::kBFloat16, {32},
                                     FlatRange{0, 32}, m.b.data()));
    CKPT_ASSERT_OK(writer->SetObject("rng", "rng-state"));
    SaveOptions so;
    so.codec = codec;
    so.block_size = 4096;  // several blocks, several calls
    CKPT_ASSERT_OK(writer->Save(dir.path(), 1, so).status());
    EXPECT_EQ(served.load(), m.w.size());  // each byte exactly once
    CKPT_ASSERT_OK(LoadAndCheck(dir.path(), m, 1));
  }
}

TEST(WriterTest, TensorSourceErrorFailsTheSaveNamingTheEntry) {
  TempDir dir;
  CKPT_ASSERT_OK_AND_ASSIGN(auto writer, Writer::Create({}));
  CKPT_ASSERT_OK(
      writer->AddTensorSource("w", DType::kFloat32, {64}, FlatRange{0, 64},
                              [](uint64_t, void*, uint64_t) {
                                return absl::UnavailableError("upstream gone");
                              }));
  auto r = writer->Save(dir.path(), 1, {});
  EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kUnavailable,
                                   "entry 'w': source at byte 0"));
  EXPECT_EQ(Names(dir.path()), std::vector<std::string>{});
}

// A reader rejects bool bytes other than 0/1 (spec §9), so the writer must
// refuse them rather than commit a checkpoint that can never load.
TEST(WriterTest, BoolByteOtherThanZeroOrOneFailsTheSave) {
  for (format::Codec codec : {format::Codec::kNone, format::Codec::kZstd}) {
    TempDir dir;
    CKPT_ASSERT_OK_AND_ASSIGN(auto writer, Writer::Create({}));
    const uint8_t mask[4] = {1, 0, 2, 1};
    CKPT_ASSERT_OK(
        writer->AddTensor("mask", DType::kBool, {4}, FullBox({4}), mask));
    SaveOptions so;
    so.codec = codec;
    auto r = writer->Save(dir.path(), 1, so);
    EXPECT_THAT(r.status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "bool tensor 'mask': element 2 of this rank's region "
                         "is 0x02"));
    EXPECT_EQ(Names(dir.path()), std::vector<std::string>{});
  }
}

TEST(WriterTest, LeftoverTemporariesAreRemovedByTheNextSave) {
  TempDir dir;
  Model m;
  std::filesystem::create_directories(dir /
                                      ".tmp-step-00000009-0123456789abcdef");
  std::ofstream(dir / ".tmp-step-00000009-0123456789abcdef/shard-00000.ckpt")
      << "partial";
  std::ofstream(dir / ".tmp-latest-0123456789abcdef") << "partial";
  CKPT_ASSERT_OK_AND_ASSIGN(auto writer, Writer::Create({}));
  CKPT_ASSERT_OK(m.Register(*writer));
  CKPT_ASSERT_OK(writer->Save(dir.path(), 1, {}).status());
  EXPECT_EQ(Names(dir.path()),
            (std::vector<std::string>{"latest", "step-00000001"}));
}

TEST(WriterTest, TemporariesOfASaveInProgressAreLeftAlone) {
  TempDir dir;
  Model m;
  std::filesystem::create_directories(dir /
                                      ".tmp-step-00000009-0123456789abcdef");
  // Another writer's save in progress holds the save lock shared.
  CKPT_ASSERT_OK_AND_ASSIGN(
      auto other,
      DefaultStorage()->Lock(dir / ".ckpt-save.lock", LockMode::kShared, true));
  CKPT_ASSERT_OK_AND_ASSIGN(auto writer, Writer::Create({}));
  CKPT_ASSERT_OK(m.Register(*writer));
  CKPT_ASSERT_OK(writer->Save(dir.path(), 1, {}).status());
  EXPECT_EQ(Names(dir.path()),
            (std::vector<std::string>{".tmp-step-00000009-0123456789abcdef",
                                      "latest", "step-00000001"}));
  other.reset();
  CKPT_ASSERT_OK(writer->Save(dir.path(), 2, {}).status());
  EXPECT_EQ(
      Names(dir.path()),
      (std::vector<std::string>{"latest", "step-00000001", "step-00000002"}));
}

TEST(WriterTest, SaveCommitsAndMovesLatest) {
  TempDir dir;
  Model m;
  auto writer = Writer::Create({}).value();
  CKPT_ASSERT_OK(m.Register(*writer));
  auto r1 = writer->Save(dir.path(), 100, {});
  CKPT_ASSERT_OK(r1);
  EXPECT_EQ(r1->path, dir / "step-00000100");
  EXPECT_EQ(r1->logical_bytes, 64u * 32 * 4 + 32 * 2 + 9);
  CKPT_ASSERT_OK(writer->Save(dir.path(), 200, {}));
  EXPECT_EQ(
      Names(dir.path()),
      (std::vector<std::string>{"latest", "step-00000100", "step-00000200"}));
  CKPT_EXPECT_OK(LoadAndCheck(dir.path(), m, 200));
  CKPT_EXPECT_OK(LoadAndCheck(dir / "step-00000100", m, 100));
}

TEST(WriterTest, ExistingStepIsRefusedUnlessOverwrite) {
  TempDir dir;
  Model m;
  auto writer = Writer::Create({}).value();
  CKPT_ASSERT_OK(m.Register(*writer));
  CKPT_ASSERT_OK(writer->Save(dir.path(), 5, {}));
  EXPECT_THAT(writer->Save(dir.path(), 5, {}),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       "step-00000005: a checkpoint of step 5 already exists"));
  SaveOptions o;
  o.overwrite = true;
  m.w[0] ^= 1;
  CKPT_ASSERT_OK(writer->Save(dir.path(), 5, o));
  CKPT_EXPECT_OK(LoadAndCheck(dir.path(), m, 5));
  EXPECT_EQ(Names(dir.path()),
            (std::vector<std::string>{"latest", "step-00000005"}));
}

TEST(WriterTest, KeepLastPrunesOldSteps) {
  TempDir dir;
  Model m;
  auto writer = Writer::Create({}).value();
  CKPT_ASSERT_OK(m.Register(*writer));
  SaveOptions o;
  o.keep_last = 2;
  for (uint64_t s : {1, 2, 3, 4})
    CKPT_ASSERT_OK(writer->Save(dir.path(), s, o));
  EXPECT_EQ(
      Names(dir.path()),
      (std::vector<std::string>{"latest", "step-00000003", "step-00000004"}));
}

TEST(WriterTest, OlderStepDoesNotMoveLatestBack) {
  TempDir dir;
  Model m;
  auto writer = Writer::Create({}).value();
  CKPT_ASSERT_OK(m.Register(*writer));
  CKPT_ASSERT_OK(writer->Save(dir.path(), 10, {}));
  CKPT_ASSERT_OK(writer->Save(dir.path(), 7, {}));
  CKPT_EXPECT_OK(LoadAndCheck(dir.path(), m, 10));
}

TEST(WriterTest, BadRegistrations) {
  auto writer = Writer::Create({}).value();
  float x[4];
  EXPECT_THAT(
      writer->AddTensor("a/b", DType::kFloat32, {4}, FlatRange{0, 4}, x),
      StatusIs(absl::StatusCode::kInvalidArgument, "path separator"));
  EXPECT_THAT(writer->AddTensor("x", DType::kFloat32, {4}, FlatRange{2, 4}, x),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "entry 'x': flat range flat[2:6) exceeds"));
  EXPECT_THAT(
      writer->AddTensor("x", DType::kFloat32, {4}, FlatRange{0, 4}, nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, "data is null"));
  CKPT_ASSERT_OK(
      writer->AddTensor("x", DType::kFloat32, {4}, FlatRange{0, 4}, x));
  EXPECT_THAT(
      writer->AddTensor("x", DType::kFloat32, {4}, FlatRange{0, 4}, x),
      StatusIs(absl::StatusCode::kAlreadyExists, "'x' is already registered"));
  TensorOptions cuda;
  cuda.memory = MemoryKind::kCuda;
  EXPECT_THAT(
      writer->AddTensor("y", DType::kFloat32, {4}, FlatRange{0, 4}, x, cuda),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               "device_memory is not set"));
  EXPECT_THAT(writer->Remove("nope"),
              StatusIs(absl::StatusCode::kNotFound, "'nope'"));
}

TEST(WriterTest, UncoveredTensorFailsTheSaveAndWritesNothing) {
  TempDir dir;
  auto writer = Writer::Create({}).value();
  float x[4] = {};
  CKPT_ASSERT_OK(
      writer->AddTensor("half", DType::kFloat32, {8}, FlatRange{0, 4}, x));
  EXPECT_THAT(
      writer->Save(dir.path(), 1, {}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "entry 'half': elements not covered by any chunk, e.g. [4:8]"));
  EXPECT_TRUE(Names(dir.path()).empty());
  TensorOptions partial;
  partial.partial = true;
  CKPT_ASSERT_OK(writer->Remove("half"));
  CKPT_ASSERT_OK(writer->AddTensor("half", DType::kFloat32, {8},
                                   FlatRange{0, 4}, x, partial));
  CKPT_EXPECT_OK(writer->Save(dir.path(), 1, {}));
}

TEST(WriterTest, BadOptions) {
  TempDir dir;
  auto writer = Writer::Create({}).value();
  SaveOptions o;
  o.block_size = 1000;
  EXPECT_THAT(writer->Save(dir.path(), 1, o),
              StatusIs(absl::StatusCode::kInvalidArgument, "block_size 1000"));
}

// Fault injection at every storage operation of a save: the save fails, the
// earlier checkpoint and `latest` stay loadable, nothing partial is visible
// and the temporary directory is gone.
TEST(WriterTest, FaultAtEveryOperationOfASaveLeavesEarlierCheckpointIntact) {
  TempDir dir;
  Model m;
  {
    auto writer = Writer::Create({}).value();
    CKPT_ASSERT_OK(m.Register(*writer));
    CKPT_ASSERT_OK(writer->Save(dir.path(), 1, {}));
  }
  FaultInjectingStorage counter(DefaultStorage());
  {
    TempDir probe;
    Writer::Options wo;
    wo.storage = &counter;
    auto writer = Writer::Create(wo).value();
    CKPT_ASSERT_OK(m.Register(*writer));
    CKPT_ASSERT_OK(writer->Save(probe.path(), 1, {}));
  }
  int trials = 0;
  for (StorageOp op : {StorageOp::kOpen, StorageOp::kWrite, StorageOp::kSync,
                       StorageOp::kClose, StorageOp::kCreateDir,
                       StorageOp::kSyncDir, StorageOp::kRename}) {
    const int64_t n = counter.count(op);
    for (int64_t nth = 1; nth <= n; ++nth) {
      FaultInjectingStorage faulty(DefaultStorage());
      faulty.FailAt(op, nth,
                    absl::ResourceExhaustedError("No space left on device"));
      Writer::Options wo;
      wo.storage = &faulty;
      auto writer = Writer::Create(wo).value();
      CKPT_ASSERT_OK(m.Register(*writer));
      auto r = writer->Save(dir.path(), 2, {});
      ++trials;
      // A fault after the commit point (e.g. in fsync of the root after the
      // rename, or in updating `latest`) may leave step 2 committed; what
      // must hold is that whatever is visible is complete.
      std::vector<std::string> names = Names(dir.path());
      for (const std::string& n : names) {
        EXPECT_NE(n.rfind(".tmp-", 0), 0u)
            << "temporary left: " << n << " op " << int(op) << " #" << nth;
      }
      if (!r.ok()) {
        EXPECT_THAT(r, StatusIs(absl::StatusCode::kResourceExhausted,
                                "injected fault"));
      }
      bool has2 =
          std::find(names.begin(), names.end(), "step-00000002") != names.end();
      CKPT_EXPECT_OK(LoadAndCheck(dir / "step-00000001", m, 1));
      if (has2) {
        CKPT_EXPECT_OK(LoadAndCheck(dir / "step-00000002", m, 2));
      }
      auto latest = Reader::Open(dir.path());
      CKPT_EXPECT_OK(latest);
      if (has2) std::filesystem::remove_all(dir / "step-00000002");
      // Point latest back at step 1 for the next trial.
      std::ofstream(dir / "latest") << format::EncodeLatest("step-00000001");
    }
  }
  EXPECT_GE(trials, 15);
}

}  // namespace
}  // namespace ckpt

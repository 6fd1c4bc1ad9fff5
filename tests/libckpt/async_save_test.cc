// Writer::SaveAsync and the staged save of device tensors, without a GPU:
// host tensors, and device tensors through the fake asynchronous device
// (tests/testing/fake_device.h). What is checked is what users of async
// checkpointing report broken elsewhere: dirty snapshots, unbounded staging
// memory, errors lost in the background, collectives on a shared
// communicator, partial checkpoints.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "ckpt/reader.h"
#include "ckpt/testing/fake_device.h"
#include "ckpt/testing/fault_injection.h"
#include "ckpt/testing/forwarding_storage.h"
#include "ckpt/writer.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "testing/status_matchers.h"
#include "util/mutex.h"

namespace ckpt {
namespace {

using ::ckpt::testing::FakeDevice;
using ::ckpt::testing::IsOk;
using ::ckpt::testing::ReferenceBytes;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;

constexpr uint64_t kBuf = 2 << 20;  // staging buffers of one write granule

TensorOptions OnDevice() {
  TensorOptions o;
  o.memory = MemoryKind::kCuda;
  return o;
}

SaveOptions SmallBlocks() {
  SaveOptions so;
  so.block_size = 16 << 10;
  return so;
}

// Loads tensor `name` ({n} bytes as uint8) from the latest checkpoint.
std::string LoadBytes(const std::string& root, const std::string& name,
                      uint64_t n) {
  auto reader = Reader::Open(root).value();
  std::string out(n, 0);
  LoadOptions lo;
  lo.allow_unrequested = true;
  EXPECT_THAT(
      reader->Load({{name, DType::kUInt8, {n}, FlatRange{0, n}, out.data()}},
                   lo),
      IsOk());
  return out;
}

Writer::Options SmallStaging(DeviceMemory* dev, uint64_t cap) {
  Writer::Options wo;
  wo.device_memory = dev;
  wo.staging_bytes = cap;
  wo.staging_buffer_bytes = kBuf;
  return wo;
}

TEST(SaveAsyncTest, BuffersModifiedAfterReturnNeverReachTheCheckpoint) {
  TempDir dir;
  FakeDevice dev;
  std::string host = ReferenceBytes(DType::kUInt8, {300000}, 1);
  std::string device = ReferenceBytes(DType::kUInt8, {500000}, 2);
  const std::string host0 = host, device0 = device;
  auto writer = Writer::Create(SmallStaging(&dev, 32 * kBuf)).value();
  CKPT_ASSERT_OK(writer->AddTensor("h", DType::kUInt8, {host.size()},
                                   FlatRange{0, host.size()}, host.data()));
  CKPT_ASSERT_OK(writer->AddTensor("d", DType::kUInt8, {device.size()},
                                   FlatRange{0, device.size()}, device.data(),
                                   OnDevice()));
  CKPT_ASSERT_OK(writer->SetObject("rng", "state-1"));
  SaveHandle handle = writer->SaveAsync(dir.path(), 1, SmallBlocks()).value();
  // The trainer goes on at once: new values, a new object, a removed entry.
  std::fill(host.begin(), host.end(), 'x');
  std::fill(device.begin(), device.end(), 'y');
  CKPT_ASSERT_OK(writer->SetObject("rng", "state-2"));
  CKPT_ASSERT_OK(writer->Remove("h"));
  CKPT_ASSERT_OK_AND_ASSIGN(SaveResult r, handle.Wait());
  EXPECT_TRUE(handle.Done());
  EXPECT_EQ(LoadBytes(dir.path(), "h", host0.size()), host0);
  EXPECT_EQ(LoadBytes(dir.path(), "d", device0.size()), device0);
  EXPECT_EQ(Reader::Open(dir.path()).value()->ReadObject("rng").value(),
            "state-1");
  EXPECT_GT(r.peak_staging_bytes, 0u);
  EXPECT_EQ(r.staging_cap_bytes, 32 * kBuf);
}

TEST(SaveAsyncTest, StagingNeverExceedsTheCapWhenTheStateIsLarger) {
  TempDir dir;
  FakeDevice dev;
  std::string a = ReferenceBytes(DType::kUInt8, {10 * kBuf}, 3);
  std::string b = ReferenceBytes(DType::kUInt8, {6 * kBuf}, 4);
  auto writer = Writer::Create(SmallStaging(&dev, 4 * kBuf)).value();
  CKPT_ASSERT_OK(writer->AddTensor("a", DType::kUInt8, {a.size()},
                                   FlatRange{0, a.size()}, a.data()));
  CKPT_ASSERT_OK(writer->AddTensor("b", DType::kUInt8, {b.size()},
                                   FlatRange{0, b.size()}, b.data(),
                                   OnDevice()));
  for (uint64_t step = 1; step <= 3; ++step) {
    SaveHandle h = writer->SaveAsync(dir.path(), step, SmallBlocks()).value();
    CKPT_ASSERT_OK_AND_ASSIGN(SaveResult r, h.Wait());
    EXPECT_LE(r.peak_staging_bytes, 4 * kBuf);
    EXPECT_LE(static_cast<uint64_t>(dev.allocated_bytes), 4 * kBuf);
  }
  // Pinned once, reused by every later save.
  EXPECT_LE(dev.allocations, 4);
  EXPECT_EQ(LoadBytes(dir.path(), "a", a.size()), a);
  EXPECT_EQ(LoadBytes(dir.path(), "b", b.size()), b);
}

TEST(DeviceSaveTest, DeviceCopiesOverlapTheWrites) {
  TempDir dir;
  FaultInjectingStorage storage(DefaultStorage());
  FakeDevice dev;
  // At every device copy, how many writes had the shard seen?
  std::atomic<int64_t> writes_at_last_copy{0};
  dev.OnCopy([&] { writes_at_last_copy = storage.count(StorageOp::kWrite); });
  std::string d = ReferenceBytes(DType::kUInt8, {16 * kBuf}, 5);
  Writer::Options wo = SmallStaging(&dev, 64 * kBuf);
  wo.storage = &storage;
  auto writer = Writer::Create(wo).value();
  CKPT_ASSERT_OK(writer->AddTensor("d", DType::kUInt8, {d.size()},
                                   FlatRange{0, d.size()}, d.data(),
                                   OnDevice()));
  CKPT_ASSERT_OK_AND_ASSIGN(SaveResult r,
                            writer->Save(dir.path(), 1, SmallBlocks()));
  // The synchronous save stages only a few buffers ahead of the writer: the
  // last copies ran after payload writes (header + at least one payload).
  EXPECT_GE(writes_at_last_copy, 2);
  EXPECT_LT(r.peak_staging_bytes, d.size());
  EXPECT_EQ(dev.sync_calls, 0);  // all through streams, batched
  EXPECT_EQ(LoadBytes(dir.path(), "d", d.size()), d);
}

TEST(DeviceSaveTest, DeviceCopyErrorFailsTheSaveAndCommitsNothing) {
  TempDir dir;
  FakeDevice dev;
  dev.FailAfterBytes(3 * kBuf, absl::InternalError("illegal address"));
  std::string d(8 * kBuf, 'd');
  auto writer = Writer::Create(SmallStaging(&dev, 8 * kBuf)).value();
  CKPT_ASSERT_OK(writer->AddTensor("d", DType::kUInt8, {d.size()},
                                   FlatRange{0, d.size()}, d.data(),
                                   OnDevice()));
  EXPECT_THAT(writer->Save(dir.path(), 1, SmallBlocks()),
              StatusIs(absl::StatusCode::kInternal, "illegal address"));
  SaveHandle h = writer->SaveAsync(dir.path(), 2, SmallBlocks()).value();
  EXPECT_THAT(h.Wait(),
              StatusIs(absl::StatusCode::kInternal, "illegal address"));
  EXPECT_FALSE(Reader::Open(dir.path()).ok());  // nothing committed
}

TEST(SaveAsyncTest, StorageErrorReachesWaitAndCommitsNothing) {
  TempDir dir;
  FaultInjectingStorage storage(DefaultStorage());
  std::string a = ReferenceBytes(DType::kUInt8, {8 * kBuf}, 6);
  Writer::Options wo = SmallStaging(nullptr, 8 * kBuf);
  wo.storage = &storage;
  auto writer = Writer::Create(wo).value();
  CKPT_ASSERT_OK(writer->AddTensor("a", DType::kUInt8, {a.size()},
                                   FlatRange{0, a.size()}, a.data()));
  CKPT_ASSERT_OK(
      writer->SaveAsync(dir.path(), 1, SmallBlocks()).value().Wait());
  auto listing = [&] {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
      names.insert(e.path().filename().string());
    }
    return names;
  };
  const std::set<std::string> before = listing();
  storage.Reset();
  storage.FailAt(StorageOp::kWrite, 3,
                 absl::ResourceExhaustedError("No space left on device"));
  SaveHandle h = writer->SaveAsync(dir.path(), 2, SmallBlocks()).value();
  EXPECT_THAT(h.Wait(),
              StatusIs(absl::StatusCode::kResourceExhausted, "No space left"));
  EXPECT_THAT(h.Wait(),
              StatusIs(absl::StatusCode::kResourceExhausted, "No space left"));
  // Step 1 is still the latest; no temporary directory is left behind.
  EXPECT_EQ(Reader::Open(dir.path()).value()->manifest().info.step, 1u);
  EXPECT_EQ(listing(), before);
}

// Regression: a failed write leaves its staged buffers unreleased and the
// later tasks unstarted; with a state larger than the cap, staging then
// waited for space and the writer threads for staged bytes, forever.
TEST(SaveAsyncTest, WriteErrorWithAStateLargerThanTheCapFailsInsteadOfHanging) {
  TempDir dir;
  FaultInjectingStorage storage(DefaultStorage());
  FakeDevice dev;
  std::string a = ReferenceBytes(DType::kUInt8, {12 * kBuf}, 10);
  Writer::Options wo = SmallStaging(&dev, 2 * kBuf);
  wo.storage = &storage;
  auto writer = Writer::Create(wo).value();
  CKPT_ASSERT_OK(writer->AddTensor("a", DType::kUInt8, {a.size()},
                                   FlatRange{0, a.size()}, a.data(),
                                   OnDevice()));
  storage.FailAt(StorageOp::kWrite, 3, absl::DataLossError("EIO"));
  SaveHandle h = writer->SaveAsync(dir.path(), 1, SmallBlocks()).value();
  EXPECT_THAT(h.Wait(), StatusIs(absl::StatusCode::kDataLoss, "EIO"));
  storage.Reset();
  storage.FailAt(StorageOp::kWrite, 3, absl::DataLossError("EIO"));
  EXPECT_THAT(writer->Save(dir.path(), 2, SmallBlocks()),
              StatusIs(absl::StatusCode::kDataLoss, "EIO"));
  EXPECT_FALSE(Reader::Open(dir.path()).ok());
}

TEST(SaveAsyncTest, OneSaveInFlightANewSaveWaitsOrFailsFast) {
  TempDir dir;
  FakeDevice dev(std::chrono::milliseconds(2));  // slow device: saves last
  std::string d(16 * kBuf, 'd');
  auto writer = Writer::Create(SmallStaging(&dev, 64 * kBuf)).value();
  CKPT_ASSERT_OK(writer->AddTensor("d", DType::kUInt8, {d.size()},
                                   FlatRange{0, d.size()}, d.data(),
                                   OnDevice()));
  SaveHandle first = writer->SaveAsync(dir.path(), 1, SmallBlocks()).value();
  SaveOptions busy = SmallBlocks();
  busy.fail_if_busy = true;
  if (!first.Done()) {
    EXPECT_THAT(writer->SaveAsync(dir.path(), 2, busy).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition, "in flight"));
  }
  // Without fail_if_busy the next save waits for the first one.
  SaveHandle second = writer->SaveAsync(dir.path(), 3, SmallBlocks()).value();
  EXPECT_TRUE(first.Done());
  CKPT_EXPECT_OK(first.Wait());
  CKPT_EXPECT_OK(second.Wait());
  EXPECT_EQ(Reader::Open(dir.path()).value()->manifest().info.step, 3u);
}

TEST(SaveAsyncTest, DestroyingTheWriterWaitsForTheSaveInFlight) {
  TempDir dir;
  FakeDevice dev(std::chrono::milliseconds(1));
  std::string d(16 * kBuf, 'd');
  SaveHandle h;
  {
    auto writer = Writer::Create(SmallStaging(&dev, 64 * kBuf)).value();
    CKPT_ASSERT_OK(writer->AddTensor("d", DType::kUInt8, {d.size()},
                                     FlatRange{0, d.size()}, d.data(),
                                     OnDevice()));
    h = writer->SaveAsync(dir.path(), 7, SmallBlocks()).value();
  }
  EXPECT_TRUE(h.Done());
  CKPT_EXPECT_OK(h.Wait());
  EXPECT_EQ(LoadBytes(dir.path(), "d", d.size()), d);
}

// Multi-rank: the commit's collectives run on the trainer's thread inside
// Wait() (no background communicator), or in the background on a
// dedicated one; in both, an error on one rank reaches Wait() everywhere.
void MultiRank(bool dedicated, int failing_rank) {
  TempDir dir;
  InProcessWorld world(3), background(3);
  std::vector<std::unique_ptr<FaultInjectingStorage>> storages;
  for (int r = 0; r < 3; ++r) {
    storages.push_back(
        std::make_unique<FaultInjectingStorage>(DefaultStorage()));
  }
  std::string global = ReferenceBytes(DType::kUInt8, {3 * 3 * kBuf}, 9);
  absl::Status status =
      RunRanks(world, [&](Communicator& comm) -> absl::Status {
        const int rank = comm.rank();
        Writer::Options wo = SmallStaging(nullptr, 4 * kBuf);
        wo.comm = &comm;
        wo.storage = storages[rank].get();
        if (dedicated) wo.background_comm = background.comm(rank);
        CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
        const uint64_t n = 3 * kBuf;
        std::string mine = global.substr(rank * n, n);
        CKPT_RETURN_IF_ERROR(
            writer->AddTensor("t", DType::kUInt8, {global.size()},
                              FlatRange{rank * n, n}, mine.data()));
        if (rank == failing_rank) {
          storages[rank]->FailAt(StorageOp::kSync, 1,
                                 absl::DataLossError("EIO on fsync"));
        }
        CKPT_ASSIGN_OR_RETURN(SaveHandle h,
                              writer->SaveAsync(dir.path(), 1, SmallBlocks()));
        std::fill(mine.begin(), mine.end(), 0);
        absl::StatusOr<SaveResult> r = h.Wait();
        if (failing_rank >= 0) {
          EXPECT_THAT(r.status(),
                      StatusIs(absl::StatusCode::kDataLoss, "EIO on fsync"))
              << "rank " << rank;
          return absl::OkStatus();
        }
        return r.status();
      });
  CKPT_ASSERT_OK(status);
  if (failing_rank >= 0) {
    EXPECT_FALSE(Reader::Open(dir.path()).ok());
  } else {
    EXPECT_EQ(LoadBytes(dir.path(), "t", global.size()), global);
  }
}

TEST(SaveAsyncMultiRankTest, CommitOnTheTrainerThreadInWait) {
  MultiRank(false, -1);
}
TEST(SaveAsyncMultiRankTest, CommitInTheBackgroundOnADedicatedCommunicator) {
  MultiRank(true, -1);
}
TEST(SaveAsyncMultiRankTest, FailingRankFailsWaitOnEveryRank) {
  MultiRank(false, 1);
}
TEST(SaveAsyncMultiRankTest,
     FailingRankFailsWaitOnEveryRankWithDedicatedCommunicator) {
  MultiRank(true, 2);
}

// A storage whose files' fsync waits until the test opens the gate: a
// rank whose save stays in flight for as long as the test wants.
class GatedStorage final : public testing::ForwardingStorage {
 public:
  void OpenGate() {
    MutexLock l(&mu_);
    open_ = true;
    opened_.SignalAll();
  }
  absl::StatusOr<std::unique_ptr<File>> Open(
      const std::string& path, OpenMode mode,
      const OpenOptions& options) override {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> f,
                          ForwardingStorage::Open(path, mode, options));
    return std::unique_ptr<File>(new GatedFile(std::move(f), this));
  }

 private:
  class GatedFile final : public testing::ForwardingFile {
   public:
    GatedFile(std::unique_ptr<File> f, GatedStorage* s)
        : ForwardingFile(std::move(f)), s_(s) {}
    absl::Status Sync() override {
      {
        MutexLock l(&s_->mu_);
        while (!s_->open_) s_->opened_.Wait(&s_->mu_);
      }
      return ForwardingFile::Sync();
    }

   private:
    GatedStorage* s_;
  };

  Mutex mu_;
  CondVar opened_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
};

// fail_if_busy is decided by all ranks: rank 0's save is done, rank 1's is
// still writing; the next save fails fast on both, not only on rank 1 (rank
// 0 would otherwise start a save whose collectives rank 1 never joins).
TEST(SaveAsyncMultiRankTest, FailIfBusyFailsOnEveryRankWhenOneRankIsBusy) {
  TempDir dir;
  InProcessWorld world(2);
  GatedStorage gated;
  std::string global = ReferenceBytes(DType::kUInt8, {2 * kBuf}, 11);
  CKPT_ASSERT_OK(RunRanks(world, [&](Communicator& comm) -> absl::Status {
    const int rank = comm.rank();
    Writer::Options wo = SmallStaging(nullptr, 4 * kBuf);
    wo.comm = &comm;
    if (rank == 1) wo.storage = &gated;
    CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
    std::string mine = global.substr(rank * kBuf, kBuf);
    CKPT_RETURN_IF_ERROR(writer->AddTensor("t", DType::kUInt8, {global.size()},
                                           FlatRange{rank * kBuf, kBuf},
                                           mine.data()));
    CKPT_ASSIGN_OR_RETURN(SaveHandle first,
                          writer->SaveAsync(dir.path(), 1, SmallBlocks()));
    if (rank == 0) {
      while (!first.Done()) std::this_thread::yield();
    }
    SaveOptions busy = SmallBlocks();
    busy.fail_if_busy = true;
    EXPECT_THAT(writer->SaveAsync(dir.path(), 2, busy).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition, "in flight"))
        << "rank " << rank;
    if (rank == 1) gated.OpenGate();
    CKPT_RETURN_IF_ERROR(first.Wait().status());
    // Nothing is in flight anywhere now: the same call goes ahead.
    CKPT_ASSIGN_OR_RETURN(SaveHandle second,
                          writer->SaveAsync(dir.path(), 2, busy));
    return second.Wait().status();
  }));
  EXPECT_EQ(Reader::Open(dir.path()).value()->manifest().info.step, 2u);
  EXPECT_EQ(LoadBytes(dir.path(), "t", global.size()), global);
}

TEST(SaveAsyncTest, FirstSaveAsyncCommitsTheStagingMemoryLaterOnesReuseIt) {
  TempDir dir;
  FakeDevice dev;
  std::string a = ReferenceBytes(DType::kUInt8, {5 * kBuf}, 12);
  auto writer = Writer::Create(SmallStaging(&dev, 64 * kBuf)).value();
  CKPT_ASSERT_OK(writer->AddTensor("a", DType::kUInt8, {a.size()},
                                   FlatRange{0, a.size()}, a.data()));
  SaveHandle h = writer->SaveAsync(dir.path(), 1, SmallBlocks()).value();
  // Every buffer the snapshot can use was allocated before its copies (the
  // state and one buffer of slack), not one by one as they were needed.
  const int64_t allocated = dev.allocations;
  EXPECT_EQ(allocated, 6);
  CKPT_ASSERT_OK(h.Wait());
  for (uint64_t step = 2; step <= 3; ++step) {
    CKPT_ASSERT_OK(
        writer->SaveAsync(dir.path(), step, SmallBlocks()).value().Wait());
  }
  EXPECT_EQ(dev.allocations, allocated);
  EXPECT_EQ(LoadBytes(dir.path(), "a", a.size()), a);
}

Writer::Options DeviceSnapshot(FakeDevice* dev, uint64_t device_bytes) {
  Writer::Options wo = SmallStaging(dev, 64 * kBuf);
  wo.device_snapshot_bytes = device_bytes;
  return wo;
}

SaveOptions ToDevice() {
  SaveOptions so = SmallBlocks();
  so.snapshot_to_device = true;
  return so;
}

// The stall is the device-to-device copy: the copies to host staging
// memory are held back by the device until after SaveAsync returned, and
// the device tensor is overwritten meanwhile; the checkpoint has the
// values at the call.
TEST(DeviceSnapshotTest, SaveAsyncReturnsAfterTheDeviceCopyAndStagesLater) {
  TempDir dir;
  FakeDevice dev;
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  std::atomic<int> copies{0};
  dev.OnCopy([&] {
    if (++copies == 1) return;  // the device-to-device copy
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return open; });
  });
  std::string d = ReferenceBytes(DType::kUInt8, {3 * kBuf + 100}, 13);
  std::string h = ReferenceBytes(DType::kUInt8, {kBuf}, 14);
  const std::string d0 = d, h0 = h;
  auto writer = Writer::Create(DeviceSnapshot(&dev, 8 * kBuf)).value();
  CKPT_ASSERT_OK(writer->AddTensor("d", DType::kUInt8, {d.size()},
                                   FlatRange{0, d.size()}, d.data(),
                                   OnDevice()));
  CKPT_ASSERT_OK(writer->AddTensor("h", DType::kUInt8, {h.size()},
                                   FlatRange{0, h.size()}, h.data()));
  SaveHandle handle = writer->SaveAsync(dir.path(), 1, ToDevice()).value();
  EXPECT_EQ(dev.d2d_calls, 1);
  EXPECT_FALSE(handle.Done());  // its device-to-host copies are held back
  std::fill(d.begin(), d.end(), 'x');
  std::fill(h.begin(), h.end(), 'y');
  {
    std::lock_guard<std::mutex> l(mu);
    open = true;
  }
  cv.notify_all();
  CKPT_ASSERT_OK_AND_ASSIGN(SaveResult r, handle.Wait());
  EXPECT_EQ(r.device_snapshot_bytes, d0.size());
  EXPECT_EQ(LoadBytes(dir.path(), "d", d0.size()), d0);
  EXPECT_EQ(LoadBytes(dir.path(), "h", h0.size()), h0);
  // The device memory was allocated once and is reused.
  CKPT_ASSERT_OK(writer->SaveAsync(dir.path(), 2, ToDevice()).value().Wait());
  EXPECT_EQ(dev.device_allocations, 1);
  EXPECT_EQ(dev.device_allocated_bytes, static_cast<int64_t>(8 * kBuf));
  writer.reset();
  EXPECT_EQ(dev.device_allocated_bytes, 0);  // freed with the Writer
}

// SaveResult::snapshot_seconds: the part of the stall spent copying (a
// slow device snapshot here), plan_seconds another part.
TEST(DeviceSnapshotTest, SnapshotSecondsIsThePartOfTheStallSpentCopying) {
  TempDir dir;
  FakeDevice dev;
  dev.OnCopy([&] {
    if (dev.d2d_calls == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
  });
  std::string d = ReferenceBytes(DType::kUInt8, {kBuf}, 15);
  auto writer = Writer::Create(DeviceSnapshot(&dev, 2 * kBuf)).value();
  CKPT_ASSERT_OK(writer->AddTensor("d", DType::kUInt8, {d.size()},
                                   FlatRange{0, d.size()}, d.data(),
                                   OnDevice()));
  CKPT_ASSERT_OK_AND_ASSIGN(
      SaveResult r,
      writer->SaveAsync(dir.path(), 1, ToDevice()).value().Wait());
  EXPECT_GE(r.snapshot_seconds, 0.03);
  EXPECT_LE(r.snapshot_seconds + r.plan_seconds, r.stall_seconds);
  // A save without a slow copy has a short snapshot.
  CKPT_ASSERT_OK_AND_ASSIGN(
      SaveResult again,
      writer->SaveAsync(dir.path(), 2, ToDevice()).value().Wait());
  EXPECT_GT(again.snapshot_seconds, 0);
  EXPECT_LT(again.snapshot_seconds, 0.03);
  EXPECT_LE(again.snapshot_seconds + again.plan_seconds, again.stall_seconds);
}

TEST(DeviceSnapshotTest, TensorsBeyondTheDeviceCapGoToHostStagingAtOnce) {
  TempDir dir;
  FakeDevice dev;
  std::string a = ReferenceBytes(DType::kUInt8, {2 * kBuf}, 15);
  std::string b = ReferenceBytes(DType::kUInt8, {2 * kBuf}, 16);
  auto writer = Writer::Create(DeviceSnapshot(&dev, 3 * kBuf)).value();
  CKPT_ASSERT_OK(writer->AddTensor("a", DType::kUInt8, {a.size()},
                                   FlatRange{0, a.size()}, a.data(),
                                   OnDevice()));
  CKPT_ASSERT_OK(writer->AddTensor("b", DType::kUInt8, {b.size()},
                                   FlatRange{0, b.size()}, b.data(),
                                   OnDevice()));
  SaveHandle handle = writer->SaveAsync(dir.path(), 1, ToDevice()).value();
  std::fill(a.begin(), a.end(), 'x');
  std::fill(b.begin(), b.end(), 'y');
  CKPT_ASSERT_OK_AND_ASSIGN(SaveResult r, handle.Wait());
  EXPECT_EQ(r.device_snapshot_bytes, 2 * kBuf);  // "a" only
  EXPECT_EQ(LoadBytes(dir.path(), "a", 2 * kBuf),
            ReferenceBytes(DType::kUInt8, {2 * kBuf}, 15));
  EXPECT_EQ(LoadBytes(dir.path(), "b", 2 * kBuf),
            ReferenceBytes(DType::kUInt8, {2 * kBuf}, 16));
}

TEST(DeviceSnapshotTest, WithoutDeviceMemoryTheSnapshotGoesToHostStaging) {
  TempDir dir;
  FakeDevice dev;
  dev.device_memory_enabled = false;
  std::string d = ReferenceBytes(DType::kUInt8, {kBuf}, 17);
  const std::string d0 = d;
  auto writer = Writer::Create(DeviceSnapshot(&dev, 8 * kBuf)).value();
  CKPT_ASSERT_OK(writer->AddTensor("d", DType::kUInt8, {d.size()},
                                   FlatRange{0, d.size()}, d.data(),
                                   OnDevice()));
  SaveHandle handle = writer->SaveAsync(dir.path(), 1, ToDevice()).value();
  std::fill(d.begin(), d.end(), 'x');
  CKPT_ASSERT_OK_AND_ASSIGN(SaveResult r, handle.Wait());
  EXPECT_EQ(r.device_snapshot_bytes, 0u);
  EXPECT_EQ(dev.d2d_calls, 0);
  EXPECT_EQ(LoadBytes(dir.path(), "d", d0.size()), d0);
}

TEST(DeviceSnapshotTest, DeviceCopyErrorFailsSaveAsyncAndCommitsNothing) {
  TempDir dir;
  FakeDevice dev;
  dev.FailAfterBytes(0, absl::InternalError("illegal address"));
  std::string d(kBuf, 'd');
  auto writer = Writer::Create(DeviceSnapshot(&dev, 8 * kBuf)).value();
  CKPT_ASSERT_OK(writer->AddTensor("d", DType::kUInt8, {d.size()},
                                   FlatRange{0, d.size()}, d.data(),
                                   OnDevice()));
  EXPECT_THAT(writer->SaveAsync(dir.path(), 1, ToDevice()).status(),
              StatusIs(absl::StatusCode::kInternal, "device snapshot"));
  EXPECT_FALSE(Reader::Open(dir.path()).ok());
}

TEST(SaveAsyncTest, NegativeSnapshotThreadsAreRefused) {
  TempDir dir;
  auto writer = Writer::Create(Writer::Options{}).value();
  SaveOptions so;
  so.snapshot_threads = -1;
  EXPECT_THAT(writer->SaveAsync(dir.path(), 1, so).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "snapshot_threads"));
}

}  // namespace
}  // namespace ckpt

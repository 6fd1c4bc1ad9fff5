// Cooperative loads into device destinations through a communicator with a
// device data plane (libckpt/load/coop/device_exchange.h): on in-process ranks
// with the fake device (device memory is host memory) and a communicator that
// reports SupportsDeviceMemory() and runs AllToAll(kCuda) as the host one.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "ckpt/reader.h"
#include "ckpt/testing/fake_device.h"
#include "ckpt/writer.h"
#include "gtest/gtest.h"
#include "libckpt/forwarding_communicator.h"
#include "libckpt/row_bands.h"
#include "libckpt/test_util.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::Extract;
using ::ckpt::testing::FakeDevice;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kRanks = 4;
constexpr uint64_t kRows = 64, kCols = 48;  // float32, 4 KiB blocks

std::string Name(int i) { return "t" + std::to_string(i); }

// An in-process rank whose AllToAll takes "device memory" (fake device
// pointers are host pointers), counting the bytes of each kind it moves.
class DeviceComm final : public testing::ForwardingCommunicator {
 public:
  DeviceComm(Communicator* base, bool device)
      : ForwardingCommunicator(base, testing::Delivery::kAllToAll),
        base_(base),
        device_(device) {}
  absl::Status AllToAll(absl::Span<const SendBuffer> send,
                        absl::Span<const RecvBuffer> recv,
                        MemoryKind memory) override {
    CKPT_RETURN_IF_ERROR(
        CheckAllToAllArguments(send.size(), recv.size(), memory));
    uint64_t bytes = 0;
    for (size_t d = 0; d < send.size(); ++d) {
      if (static_cast<int>(d) != rank()) bytes += send[d].size;
    }
    if (memory == MemoryKind::kCuda) {
      ++device_calls;
      device_bytes += bytes;
    } else {
      host_bytes += bytes;
    }
    return base_->AllToAll(send, recv, MemoryKind::kHost);
  }
  bool SupportsDeviceMemory() const override { return device_; }

  int device_calls = 0;
  uint64_t device_bytes = 0, host_bytes = 0;  // sent to other ranks

 private:
  Communicator* base_;
  bool device_;
};

// Three float32 tensors of kRows x kCols, rank r holding rows
// [16 r, 16 r + 16) of each; returns the global bytes.
std::vector<std::string> SaveRows(const std::string& root) {
  return testing::SaveRowBands(root, kRanks, 3, kRows, kCols, 20);
}

// What each rank loads of tensor i: its column block (rows to columns), or
// the whole tensor (a replicated load).
Box RegionOf(int rank, bool replicated) {
  if (replicated) return Box{{0, 0}, {kRows, kCols}};
  return Box{{0, rank * kCols / kRanks}, {kRows, kCols / kRanks}};
}

// One cooperative load on kRanks in-process ranks, each with its own fake
// device; `on_device(rank, i)`: tensor i of `rank` goes to device memory.
struct DeviceLoad {
  bool replicated = false;
  bool supports_device = true;
  std::function<bool(int, int)> on_device = [](int, int) { return true; };
  uint64_t round_bytes = 32ull << 20;
  std::vector<std::unique_ptr<FakeDevice>> devices;
  std::vector<std::unique_ptr<DeviceComm>> comms;
  std::vector<std::vector<std::string>> bufs;
  std::vector<std::atomic<int>> completions =
      std::vector<std::atomic<int>>(kRanks * 3);
  std::vector<absl::Status> status = std::vector<absl::Status>(kRanks);

  DeviceLoad() {
    for (int r = 0; r < kRanks; ++r) {
      devices.push_back(
          std::make_unique<FakeDevice>(std::chrono::microseconds(0)));
    }
  }

  absl::Status LoadRank(Communicator& base, const std::string& dir) {
    const int rank = base.rank();
    DeviceComm* comm = comms[rank].get();
    ReaderOptions ro;
    ro.communicator = comm;
    ro.device_memory = devices[rank].get();
    CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(dir, ro));
    std::vector<LoadRequest> reqs;
    for (int i = 0; i < 3; ++i) {
      const Box b = RegionOf(rank, replicated);
      bufs[rank][i].assign(RegionElements(b) * 4, '\xEE');
      LoadRequest q{
          Name(i), DType::kFloat32, {kRows, kCols}, b, bufs[rank][i].data()};
      if (on_device(rank, i)) q.memory = MemoryKind::kCuda;
      q.on_complete = [this, rank, i] { ++completions[rank * 3 + i]; };
      reqs.push_back(std::move(q));
    }
    LoadOptions lo;
    lo.exchange_bytes_per_round = round_bytes;
    // Host bytes through AllToAll, where DeviceComm counts them (not
    // shared memory, which in-process ranks could use too).
    lo.shared_memory_exchange = false;
    return reader->Load(reqs, lo).status();
  }

  // Runs the load on every rank; OK if every rank's load was.
  absl::Status Run(const std::string& dir) {
    InProcessWorld w(kRanks);
    comms.clear();
    for (int r = 0; r < kRanks; ++r) {
      comms.push_back(std::make_unique<DeviceComm>(w.comm(r), supports_device));
    }
    bufs.assign(kRanks, std::vector<std::string>(3));
    return RunRanks(w, [&](Communicator& comm) {
      status[comm.rank()] = LoadRank(comm, dir);
      return status[comm.rank()];
    });
  }

  void CheckBytes(const std::vector<std::string>& global) {
    for (int r = 0; r < kRanks; ++r) {
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(bufs[r][i], Extract(global[i], DType::kFloat32,
                                      {kRows, kCols}, RegionOf(r, replicated)))
            << "rank " << r << " tensor " << i;
        EXPECT_EQ(completions[r * 3 + i], 1) << "rank " << r << " tensor " << i;
      }
      EXPECT_EQ(devices[r]->device_allocated_bytes, 0) << "rank " << r;
    }
  }
  uint64_t HostBytes() const {
    uint64_t n = 0;
    for (const auto& c : comms) n += c->host_bytes;
    return n;
  }
  uint64_t DeviceBytes() const {
    uint64_t n = 0;
    for (const auto& c : comms) n += c->device_bytes;
    return n;
  }
};

TEST(CooperativeDeviceLoadTest, RowsToColumnsMoveDeviceBytesOnTheDevice) {
  TempDir dir;
  const auto global = SaveRows(dir.path());
  DeviceLoad load;
  CKPT_ASSERT_OK(load.Run(dir.path()));
  load.CheckBytes(global);
  EXPECT_EQ(load.HostBytes(), 0u);
  // Every rank receives 3/4 of its columns from the other ranks.
  EXPECT_EQ(load.DeviceBytes(), 3 * kRows * kCols * 4 * 3 / 4);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_GT(load.comms[r]->device_calls, 0) << "rank " << r;
    EXPECT_GT(load.devices[r]->d2d_calls, 0) << "rank " << r;
    EXPECT_GT(load.devices[r]->device_allocations, 0) << "rank " << r;
  }
}

TEST(CooperativeDeviceLoadTest, ReplicatedLoadMovesDeviceBytesOnTheDevice) {
  TempDir dir;
  const auto global = SaveRows(dir.path());
  DeviceLoad load;
  load.replicated = true;
  CKPT_ASSERT_OK(load.Run(dir.path()));
  load.CheckBytes(global);
  EXPECT_EQ(load.HostBytes(), 0u);
  EXPECT_EQ(load.DeviceBytes(), 3 * kRows * kCols * 4 * (kRanks - 1));
}

TEST(CooperativeDeviceLoadTest, SmallRoundsReuseTheDeviceBuffers) {
  TempDir dir;
  const auto global = SaveRows(dir.path());
  DeviceLoad load;
  load.round_bytes = 1000;  // below one read: a read per round
  CKPT_ASSERT_OK(load.Run(dir.path()));
  load.CheckBytes(global);
  EXPECT_EQ(load.HostBytes(), 0u);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_GT(load.comms[r]->device_calls, 3) << "rank " << r;
    // Buffers grow only: far fewer allocations than rounds.
    EXPECT_LT(load.devices[r]->device_allocations, load.comms[r]->device_calls)
        << "rank " << r;
  }
}

TEST(CooperativeDeviceLoadTest, MixedHostAndDeviceDestinations) {
  TempDir dir;
  const auto global = SaveRows(dir.path());
  DeviceLoad load;
  load.on_device = [](int rank, int i) { return (rank + i) % 2 == 0; };
  CKPT_ASSERT_OK(load.Run(dir.path()));
  load.CheckBytes(global);
  EXPECT_GT(load.HostBytes(), 0u);
  EXPECT_GT(load.DeviceBytes(), 0u);
  EXPECT_EQ(load.HostBytes() + load.DeviceBytes(),
            3 * kRows * kCols * 4 * 3 / 4);
}

TEST(CooperativeDeviceLoadTest, ARankWithoutDeviceDestinationsKeepsHostPath) {
  TempDir dir;
  const auto global = SaveRows(dir.path());
  DeviceLoad load;
  load.on_device = [](int rank, int) { return rank != 1; };
  CKPT_ASSERT_OK(load.Run(dir.path()));
  load.CheckBytes(global);
  EXPECT_EQ(load.DeviceBytes(), 0u);
  for (const auto& c : load.comms) EXPECT_EQ(c->device_calls, 0);
}

TEST(CooperativeDeviceLoadTest, WithoutDeviceSupportTheHostPathRuns) {
  TempDir dir;
  const auto global = SaveRows(dir.path());
  DeviceLoad load;
  load.supports_device = false;
  CKPT_ASSERT_OK(load.Run(dir.path()));
  load.CheckBytes(global);
  EXPECT_EQ(load.DeviceBytes(), 0u);
  EXPECT_EQ(load.HostBytes(), 3 * kRows * kCols * 4 * 3 / 4);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(load.comms[r]->device_calls, 0);
    EXPECT_EQ(load.devices[r]->device_allocations, 0);
  }
}

TEST(CooperativeDeviceLoadTest, ADeviceCopyErrorFailsEveryRankAlike) {
  TempDir dir;
  SaveRows(dir.path());
  DeviceLoad load;
  load.devices[2]->FailAfterBytes(0, absl::DataLossError("fake ECC error"));
  EXPECT_FALSE(load.Run(dir.path()).ok());
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(load.status[r], load.status[0]) << "rank " << r;
    EXPECT_EQ(load.devices[r]->device_allocated_bytes, 0) << "rank " << r;
  }
  EXPECT_EQ(load.status[0].code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(load.status[0].message()),
              HasSubstr("rank 2 of 4: "));
  EXPECT_THAT(std::string(load.status[0].message()),
              HasSubstr("fake ECC error"));
}

TEST(CooperativeDeviceLoadTest, NoDeviceBufferFailsEveryRankAlike) {
  TempDir dir;
  SaveRows(dir.path());
  DeviceLoad load;
  load.devices[1]->device_memory_enabled = false;  // AllocateDevice fails
  EXPECT_FALSE(load.Run(dir.path()).ok());
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(load.status[r], load.status[0]) << "rank " << r;
    EXPECT_EQ(load.devices[r]->device_allocated_bytes, 0) << "rank " << r;
  }
  EXPECT_EQ(load.status[0].code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(load.status[0].message()),
              HasSubstr("rank 1 of 4: "));
  EXPECT_THAT(std::string(load.status[0].message()),
              HasSubstr("device exchange buffer"));
}

}  // namespace
}  // namespace ckpt

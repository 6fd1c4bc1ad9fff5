// NcclCommunicator with one rank (NCCL needs a device per rank, so one GPU
// runs one rank): the device exchange (self-send), the size check, the
// delegation of host buffers and metadata to the CPU communicator, and the
// mapping of NCCL errors. Tests that need a device skip without one.
#include "ckpt/gpu/nccl_communicator.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "ckpt/communicator.h"
#include "ckpt/gpu/device.h"
#include "gmock/gmock.h"
#include "gpu/have_device.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::gpu {
namespace {

using ::ckpt::testing::StatusIs;

// A world of one that counts what reaches it.
class CountingCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::StatusOr<std::vector<std::string>> AllGather(
      absl::string_view mine) override {
    ++all_gathers;
    return inner_.AllGather(mine);
  }
  absl::Status Broadcast(std::string* data, int root) override {
    ++broadcasts;
    return inner_.Broadcast(data, root);
  }
  absl::Status Barrier() override {
    ++barriers;
    return inner_.Barrier();
  }
  absl::Status AllReduceMax(std::vector<int64_t>* values) override {
    return inner_.AllReduceMax(values);
  }
  absl::Status AllToAll(absl::Span<const SendBuffer> send,
                        absl::Span<const RecvBuffer> recv,
                        MemoryKind memory) override {
    ++all_to_alls;
    return inner_.AllToAll(send, recv, memory);
  }

  int all_gathers = 0, broadcasts = 0, barriers = 0, all_to_alls = 0;

 private:
  SingleProcessCommunicator inner_;
};

// Device memory freed at the end of the scope.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : size_(n) {
    EXPECT_EQ(cudaMalloc(&data_, n == 0 ? 1 : n), cudaSuccess);
  }
  ~DeviceBuffer() { (void)cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return data_; }
  size_t size() const { return size_; }
  void Fill(const std::string& bytes) {
    ASSERT_EQ(
        cudaMemcpy(data_, bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
        cudaSuccess);
  }
  std::string Read() const {
    std::string out(size_, '\0');
    EXPECT_EQ(cudaMemcpy(out.data(), data_, size_, cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }

 private:
  void* data_ = nullptr;
  size_t size_;
};

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 7 + i / 251);
  return s;
}

TEST(NcclErrorToStatusTest, NamesTheCallAndNcclsErrorString) {
  EXPECT_TRUE(
      internal::NcclErrorToStatus(ncclSuccess, "ncclSend", nullptr).ok());
  absl::Status s =
      internal::NcclErrorToStatus(ncclInvalidArgument, "ncclSend", nullptr);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          std::string("ncclSend failed: ") +
                              ncclGetErrorString(ncclInvalidArgument)));
  EXPECT_THAT(
      internal::NcclErrorToStatus(ncclRemoteError, "ncclGroupEnd()", nullptr),
      StatusIs(absl::StatusCode::kUnavailable, "ncclGroupEnd() failed: "));
  EXPECT_THAT(
      internal::NcclErrorToStatus(ncclInternalError, "ncclRecv", nullptr),
      StatusIs(absl::StatusCode::kInternal, "(ncclResult_t 3)"));
}

TEST(NcclCommunicatorTest, CreateRefusesANullCpuCommunicator) {
  EXPECT_THAT(NcclCommunicator::Create(nullptr, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, "null"));
}

// Checked before any CUDA or NCCL call: runs without a GPU too.
TEST(NcclCommunicatorTest, CreateRefusesANegativeDevice) {
  CountingCommunicator cpu;
  EXPECT_THAT(NcclCommunicator::Create(&cpu, -1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "device -1 is not a CUDA device ordinal"));
}

class NcclOneRankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
    auto comm = NcclCommunicator::Create(&cpu_, 0);
    ASSERT_TRUE(comm.ok()) << comm.status();
    comm_ = *std::move(comm);
  }

  CountingCommunicator cpu_;
  std::unique_ptr<NcclCommunicator> comm_;
};

TEST_F(NcclOneRankTest, RankAndSizeAreTheCpuCommunicators) {
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->size(), 1);
  EXPECT_TRUE(comm_->SupportsDeviceMemory());
  EXPECT_NE(comm_->nccl_comm(), nullptr);
  EXPECT_NE(comm_->stream(), nullptr);
}

TEST_F(NcclOneRankTest, SelfSendOfDeviceMemoryArrives) {
  const size_t n = (size_t{1} << 20) + 13;
  DeviceBuffer out(n), in(n);
  out.Fill(Pattern(n));
  std::vector<SendBuffer> send = {{out.data(), n}};
  std::vector<RecvBuffer> recv = {{in.data(), n}};
  const int before = cpu_.all_to_alls;
  CKPT_ASSERT_OK(comm_->AllToAll(send, recv, MemoryKind::kCuda));
  EXPECT_EQ(in.Read(), Pattern(n));
  EXPECT_EQ(cpu_.all_to_alls, before + 1) << "the sizes, over the CPU";
}

TEST_F(NcclOneRankTest, EmptyDeviceExchangeSucceeds) {
  std::vector<SendBuffer> send(1);
  std::vector<RecvBuffer> recv(1);
  CKPT_EXPECT_OK(comm_->AllToAll(send, recv, MemoryKind::kCuda));
}

TEST_F(NcclOneRankTest, SizeMismatchIsInvalidArgumentAndTheCommStaysUsable) {
  DeviceBuffer out(8), in(16);
  std::vector<SendBuffer> send = {{out.data(), 8}};
  std::vector<RecvBuffer> recv = {{in.data(), 16}};
  EXPECT_THAT(comm_->AllToAll(send, recv, MemoryKind::kCuda),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "AllToAll: rank 0 sends 8 bytes to rank 0, which "
                       "expects 16"));
  out.Fill("abcdefgh");
  recv[0].size = 8;
  CKPT_ASSERT_OK(comm_->AllToAll(send, recv, MemoryKind::kCuda));
  EXPECT_EQ(in.Read().substr(0, 8), "abcdefgh");
}

TEST_F(NcclOneRankTest, WrongNumberOfBuffersIsInvalidArgument) {
  std::vector<SendBuffer> send(2);
  std::vector<RecvBuffer> recv(2);
  EXPECT_THAT(comm_->AllToAll(send, recv, MemoryKind::kCuda),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "expected 1 send and receive buffers"));
}

TEST_F(NcclOneRankTest, HostMemoryPassedAsDeviceMemoryIsInvalidArgument) {
  std::string out = "host", in(4, '?');
  std::vector<SendBuffer> send = {{out.data(), 4}};
  std::vector<RecvBuffer> recv = {{in.data(), 4}};
  EXPECT_THAT(comm_->AllToAll(send, recv, MemoryKind::kCuda),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "AllToAll on rank 0: the send buffer for rank 0 is not "
                       "memory of CUDA device 0 (it is host memory)"));
}

TEST_F(NcclOneRankTest, HostBuffersGoToTheCpuCommunicator) {
  std::string out = "host bytes", in(out.size(), '?');
  std::vector<SendBuffer> send = {{out.data(), out.size()}};
  std::vector<RecvBuffer> recv = {{in.data(), in.size()}};
  const int before = cpu_.all_to_alls;
  CKPT_ASSERT_OK(comm_->AllToAll(send, recv, MemoryKind::kHost));
  EXPECT_EQ(in, out);
  EXPECT_EQ(cpu_.all_to_alls, before + 1);
}

TEST_F(NcclOneRankTest, MetadataCollectivesAreTheCpuCommunicators) {
  const int gathers = cpu_.all_gathers, broadcasts = cpu_.broadcasts,
            barriers = cpu_.barriers;
  auto all = comm_->AllGather("x");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, std::vector<std::string>{"x"});
  std::string data = "d";
  CKPT_EXPECT_OK(comm_->Broadcast(&data, 0));
  CKPT_EXPECT_OK(comm_->Barrier());
  EXPECT_EQ(cpu_.all_gathers, gathers + 1);
  EXPECT_EQ(cpu_.broadcasts, broadcasts + 1);
  EXPECT_EQ(cpu_.barriers, barriers + 1);
}

TEST_F(NcclOneRankTest, LeavesTheCallersCurrentDeviceAsItWas) {
  int before = -1, after = -1;
  ASSERT_EQ(cudaGetDevice(&before), cudaSuccess);
  DeviceBuffer out(4), in(4);
  std::vector<SendBuffer> send = {{out.data(), 4}};
  std::vector<RecvBuffer> recv = {{in.data(), 4}};
  CKPT_ASSERT_OK(comm_->AllToAll(send, recv, MemoryKind::kCuda));
  ASSERT_EQ(cudaGetDevice(&after), cudaSuccess);
  EXPECT_EQ(before, after);
}

}  // namespace
}  // namespace ckpt::gpu

// A cooperative load (ReaderOptions::communicator) into CUDA memory through
// NcclCommunicator, with one rank (NCCL needs a device per rank, so one
// GPU runs one rank): the device data plane
// (libckpt/load/coop/device_exchange.h) runs, every byte is read by this rank,
// and device and host destinations get their bytes. Skips without a device.
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "ckpt/communicator.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/gpu/cuda_device_memory.h"
#include "ckpt/gpu/device.h"
#include "ckpt/gpu/nccl_communicator.h"
#include "ckpt/reader.h"
#include "ckpt/writer.h"
#include "gpu/have_device.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "testing/status_matchers.h"

namespace ckpt::gpu {
namespace {

using ::ckpt::testing::Extract;
using ::ckpt::testing::ReferenceBytes;
using ::ckpt::testing::TempDir;

// Device memory of n bytes, freed at the end of the scope.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, n_), cudaSuccess);
    EXPECT_EQ(cudaMemset(p_, 0, n_), cudaSuccess);
  }
  ~DeviceBuffer() { (void)cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  std::string Read() const {
    std::string out(n_, '\0');
    EXPECT_EQ(cudaMemcpy(out.data(), p_, n_, cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }

 private:
  void* p_ = nullptr;
  size_t n_;
};

TEST(NcclCooperativeLoadTest, OneRankLoadsIntoDeviceAndHostMemory) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  TempDir dir;
  const Shape shape = {1024, 256};
  const std::string w = ReferenceBytes(DType::kFloat32, shape, 7);
  const std::string b = ReferenceBytes(DType::kFloat32, shape, 8);
  auto writer = Writer::Create({}).value();
  CKPT_ASSERT_OK(
      writer->AddTensor("w", DType::kFloat32, shape, FullBox(shape), w.data()));
  CKPT_ASSERT_OK(
      writer->AddTensor("b", DType::kFloat32, shape, FullBox(shape), b.data()));
  SaveOptions so;
  so.block_size = 64 << 10;
  CKPT_ASSERT_OK(writer->Save(dir.path(), 1, so));

  SingleProcessCommunicator cpu;
  auto nccl = NcclCommunicator::Create(&cpu, 0);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  CudaDeviceMemory cuda;
  ReaderOptions ro;
  ro.communicator = nccl->get();
  ro.device_memory = &cuda;
  auto reader = Reader::Open(dir.path(), ro);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const Region cols = Box{{0, 64}, {1024, 128}};
  DeviceBuffer out(1024 * 128 * 4);
  std::string host(1024 * 128 * 4, '\0');
  LoadRequest on_device{"w", DType::kFloat32, shape, cols, out.get()};
  on_device.memory = MemoryKind::kCuda;
  LoadRequest on_host{"b", DType::kFloat32, shape, cols, host.data()};
  LoadOptions lo;
  lo.exchange_bytes_per_round = 256 << 10;  // several rounds
  auto report = (*reader)->Load({on_device, on_host}, lo);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(out.Read(), Extract(w, DType::kFloat32, shape, cols));
  EXPECT_EQ(host, Extract(b, DType::kFloat32, shape, cols));
  EXPECT_EQ(report->bytes_received, 0u);  // one rank reads everything
}

}  // namespace
}  // namespace ckpt::gpu

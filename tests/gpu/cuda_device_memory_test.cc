// ckpt::gpu::CudaDeviceMemory and the device pipelines of Writer and Reader
// on a real GPU (label `gpu`). Every test skips itself cleanly when the
// process sees no CUDA device.
#include "ckpt/gpu/cuda_device_memory.h"

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "ckpt/format/status_macros.h"
#include "ckpt/gpu/device.h"
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

#define SKIP_WITHOUT_GPU() \
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device"

// Device memory holding `bytes`, freed at scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::string& bytes) : n_(bytes.size()) {
    EXPECT_EQ(cudaMalloc(&p_, n_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p_, bytes.data(), n_, cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  explicit DeviceBuffer(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, n_), cudaSuccess);
    EXPECT_EQ(cudaMemset(p_, 0, n_), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  void* get() const { return p_; }
  std::string Read() const {
    std::string out(n_, 0);
    EXPECT_EQ(cudaMemcpy(out.data(), p_, n_, cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }

 private:
  void* p_ = nullptr;
  size_t n_;
};

// A Writer over `cuda` with `snapshot_bytes` of device memory for
// SaveAsync's device snapshot.
std::unique_ptr<Writer> SnapshotWriter(CudaDeviceMemory* cuda,
                                       uint64_t snapshot_bytes) {
  Writer::Options wo;
  wo.device_memory = cuda;
  wo.device_snapshot_bytes = snapshot_bytes;
  return Writer::Create(wo).value();
}

TensorOptions OnDevice() {
  TensorOptions o;
  o.memory = MemoryKind::kCuda;
  return o;
}

TEST(CudaDeviceMemoryTest, StridedCopyIsOneCallAndExact) {
  SKIP_WITHOUT_GPU();
  CudaDeviceMemory cuda;
  std::string host = ReferenceBytes(DType::kUInt8, {64 * 256}, 1);
  DeviceBuffer dev(host.size());
  auto stream = cuda.CreateStream(0).value();
  DeviceCopy c;  // columns [32, 96) of 64 rows of 256 bytes
  c.dst = static_cast<char*>(dev.get()) + 32;
  c.src = host.data() + 32;
  c.row_bytes = 64;
  c.rows = 64;
  c.dst_pitch = c.src_pitch = 256;
  CKPT_ASSERT_OK(stream->CopyAsync(CopyKind::kHostToDevice, {&c, 1}));
  auto done = stream->Record().value();
  CKPT_ASSERT_OK(done->Wait());
  EXPECT_TRUE(done->Done());
  std::string out = dev.Read();
  for (int r = 0; r < 64; ++r) {
    EXPECT_EQ(out.substr(r * 256 + 32, 64), host.substr(r * 256 + 32, 64)) << r;
    EXPECT_EQ(out.substr(r * 256, 32), std::string(32, '\0')) << r;
  }
}

TEST(CudaDeviceMemoryTest, BadCopyBecomesAStatusNamingTheCall) {
  SKIP_WITHOUT_GPU();
  CudaDeviceMemory cuda;
  std::string host(16, 'x');
  absl::Status s = cuda.CopyFromHost(nullptr, host.data(), host.size(), 0);
  EXPECT_FALSE(s.ok());
  // "<call> failed at cuda_device_memory.cc:<line>: cudaError...": the
  // runtime may report it at the copy or at the synchronization.
  EXPECT_NE(s.message().find("failed at cuda_device_memory.cc:"),
            absl::string_view::npos)
      << s;
}

TEST(CudaPipelineTest,
     SaveFromAndLoadIntoDeviceMemoryByteExactlyWithHostTensorsMixedIn) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  CudaDeviceMemory cuda;
  std::string w = ReferenceBytes(DType::kBFloat16, {1024, 768}, 2);
  std::string opt =
      ReferenceBytes(DType::kFloat32, {1024, 768}, 3);  // offloaded: host
  DeviceBuffer dw(w);
  for (format::Codec codec : {format::Codec::kNone, format::Codec::kZstd}) {
    Writer::Options wo;
    wo.device_memory = &cuda;
    wo.staging_buffer_bytes = 1 << 20;
    auto writer = Writer::Create(wo).value();
    CKPT_ASSERT_OK(writer->AddTensor("w", DType::kBFloat16, {1024, 768},
                                     FullBox({1024, 768}), dw.get(),
                                     OnDevice()));
    CKPT_ASSERT_OK(writer->AddTensor("opt", DType::kFloat32, {1024, 768},
                                     FullBox({1024, 768}), opt.data()));
    SaveOptions so;
    so.codec = codec;
    so.overwrite = true;
    CKPT_ASSERT_OK(writer->Save(dir.path(), 1, so));

    ReaderOptions ro;
    ro.device_memory = &cuda;
    auto reader = Reader::Open(dir.path(), ro).value();
    DeviceBuffer back(w.size());
    std::string opt_back(opt.size(), 0);
    LoadRequest a{
        "w", DType::kBFloat16, {1024, 768}, FullBox({1024, 768}), back.get()};
    a.memory = MemoryKind::kCuda;
    LoadRequest b{"opt",
                  DType::kFloat32,
                  {1024, 768},
                  FullBox({1024, 768}),
                  opt_back.data()};
    CKPT_ASSERT_OK(reader->Load({a, b}));
    EXPECT_EQ(back.Read(), w);
    EXPECT_EQ(opt_back, opt);
  }
}

TEST(CudaPipelineTest, ColumnBlockLoadsIntoDeviceMemory) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  CudaDeviceMemory cuda;
  std::string w = ReferenceBytes(DType::kFloat32, {2048, 512}, 4);
  auto writer = Writer::Create({}).value();
  CKPT_ASSERT_OK(writer->AddTensor("w", DType::kFloat32, {2048, 512},
                                   FullBox({2048, 512}), w.data()));
  CKPT_ASSERT_OK(writer->Save(dir.path(), 1, {}));
  ReaderOptions ro;
  ro.device_memory = &cuda;
  auto reader = Reader::Open(dir.path(), ro).value();
  const Region cols = Box{{0, 128}, {2048, 256}};
  DeviceBuffer out(2048 * 256 * 4);
  LoadRequest r{"w", DType::kFloat32, {2048, 512}, cols, out.get()};
  r.memory = MemoryKind::kCuda;
  CKPT_ASSERT_OK(reader->Load({r}));
  EXPECT_EQ(out.Read(), Extract(w, DType::kFloat32, {2048, 512}, cols));
}

TEST(CudaPipelineTest, SaveAsyncKeepsTheSnapshotWhileTheTrainerKeepsWriting) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  CudaDeviceMemory cuda;
  const size_t n = 48 << 20;
  DeviceBuffer t(n);
  cudaStream_t train;
  ASSERT_EQ(cudaStreamCreateWithFlags(&train, cudaStreamNonBlocking),
            cudaSuccess);
  Writer::Options wo;
  wo.device_memory = &cuda;
  wo.staging_bytes =
      16 << 20;  // a third of the tensor: staged as writes free space
  wo.staging_buffer_bytes = 8 << 20;
  auto writer = Writer::Create(wo).value();
  CKPT_ASSERT_OK(writer->AddTensor("t", DType::kUInt8, {n}, FlatRange{0, n},
                                   t.get(), OnDevice()));
  for (int step = 1; step <= 3; ++step) {
    // The "kernel" of this step writes `step` everywhere, queued on the
    // trainer's stream; the save is ordered after it by an event only.
    ASSERT_EQ(cudaMemsetAsync(t.get(), step, n, train), cudaSuccess);
    auto ready = CudaDeviceMemory::RecordOn(train).value();
    SaveOptions so;
    so.device_ready = ready.get();
    SaveHandle h = writer->SaveAsync(dir.path(), step, so).value();
    // Training goes on at once and keeps modifying the tensor.
    for (int k = 0; k < 20; ++k) {
      ASSERT_EQ(cudaMemsetAsync(t.get(), 100 + k, n, train), cudaSuccess);
    }
    CKPT_ASSERT_OK_AND_ASSIGN(SaveResult r, h.Wait());
    EXPECT_LE(r.peak_staging_bytes, wo.staging_bytes);
    ASSERT_EQ(cudaStreamSynchronize(train), cudaSuccess);
    auto reader = Reader::Open(dir.path()).value();
    std::string out(n, 0);
    CKPT_ASSERT_OK(
        reader->Load({{"t", DType::kUInt8, {n}, FlatRange{0, n}, out.data()}}));
    EXPECT_EQ(out, std::string(n, static_cast<char>(step))) << "step " << step;
  }
  cudaStreamDestroy(train);
}

// The CUDA runtime's current device is per thread, and the library calls
// CUDA on the caller's thread (SaveAsync stages on it, the device snapshot
// copies from it, loads upload from it). A trainer that drives two GPUs
// from one thread keeps its current device across a save, an async save
// and a load of tensors that live on the other GPU.
TEST(CudaPipelineTest, SaveAndLoadLeaveTheCallersCurrentDeviceAsItWas) {
  SKIP_WITHOUT_GPU();
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  if (count < 2) GTEST_SKIP() << "needs two CUDA devices (" << count << ")";
  auto current = [] {
    int d = -1;
    EXPECT_EQ(cudaGetDevice(&d), cudaSuccess);
    return d;
  };
  const size_t n = 4 << 20;
  const std::string bytes = ReferenceBytes(DType::kUInt8, {n}, 6);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  DeviceBuffer t(bytes), back(n);  // both on device 0
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  TempDir dir;
  CudaDeviceMemory cuda;
  auto writer = SnapshotWriter(&cuda, n);
  CKPT_ASSERT_OK(writer->AddTensor("t", DType::kUInt8, {n}, FlatRange{0, n},
                                   t.get(), OnDevice()));
  CKPT_ASSERT_OK(writer->Save(dir.path(), 1, {}));
  EXPECT_EQ(current(), 1) << "after Save";
  for (const bool to_device : {false, true}) {
    SaveOptions so;
    so.snapshot_to_device = to_device;
    SaveHandle h = writer->SaveAsync(dir.path(), to_device ? 3 : 2, so).value();
    EXPECT_EQ(current(), 1)
        << "after SaveAsync, snapshot_to_device " << to_device;
    CKPT_ASSERT_OK(h.Wait());
    EXPECT_EQ(current(), 1) << "after Wait";
  }
  ReaderOptions ro;
  ro.device_memory = &cuda;
  auto reader = Reader::Open(dir.path(), ro).value();
  LoadRequest r{"t", DType::kUInt8, {n}, FlatRange{0, n}, back.get()};
  r.memory = MemoryKind::kCuda;
  CKPT_ASSERT_OK(reader->Load({r}));
  EXPECT_EQ(current(), 1) << "after Load";
  EXPECT_EQ(back.Read(), bytes);
}

TEST(CudaDeviceMemoryTest, BatchOfContiguousCopiesAroundAStridedOneIsExact) {
  SKIP_WITHOUT_GPU();
  CudaDeviceMemory cuda;
  std::string bytes = ReferenceBytes(DType::kUInt8, {1 << 20}, 3);
  DeviceBuffer dev(bytes);
  char* host = static_cast<char*>(cuda.AllocateHost(bytes.size()).value());
  std::vector<DeviceCopy> copies;
  for (size_t off : {0, 4096, 65536, 200000}) {  // a batch of four
    DeviceCopy c;
    c.dst = host + off;
    c.src = static_cast<const char*>(dev.get()) + off;
    c.row_bytes = 1000;
    copies.push_back(c);
  }
  DeviceCopy strided;  // then one strided copy, then one more contiguous
  strided.dst = host + 300000;
  strided.src = static_cast<const char*>(dev.get()) + 300000;
  strided.row_bytes = 100;
  strided.rows = 10;
  strided.dst_pitch = strided.src_pitch = 1000;
  copies.push_back(strided);
  copies.push_back(copies[0]);
  copies.back().dst = host + 900000;
  copies.back().src = static_cast<const char*>(dev.get()) + 900000;
  auto stream = cuda.CreateStream(0).value();
  CKPT_ASSERT_OK(stream->CopyAsync(CopyKind::kDeviceToHost, copies));
  CKPT_ASSERT_OK(stream->Record().value()->Wait());
  for (const DeviceCopy& c : copies) {
    const size_t off = static_cast<const char*>(c.dst) - host;
    for (size_t r = 0; r < c.rows; ++r) {
      const size_t at = off + r * (c.rows > 1 ? c.dst_pitch : 0);
      EXPECT_EQ(std::string(host + at, c.row_bytes),
                bytes.substr(at, c.row_bytes))
          << at;
    }
  }
  cuda.FreeHost(host, bytes.size());
}

TEST(CudaPipelineTest, SaveAsyncSnapshotsIntoSpareDeviceMemory) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  CudaDeviceMemory cuda;
  const size_t n = 32 << 20;
  DeviceBuffer t(n);
  DeviceBuffer u(n);  // beyond the device cap: staged to the host at once
  auto writer = SnapshotWriter(&cuda, n);
  CKPT_ASSERT_OK(writer->AddTensor("t", DType::kUInt8, {n}, FlatRange{0, n},
                                   t.get(), OnDevice()));
  CKPT_ASSERT_OK(writer->AddTensor("u", DType::kUInt8, {n}, FlatRange{0, n},
                                   u.get(), OnDevice()));
  ASSERT_EQ(cudaMemset(t.get(), 7, n), cudaSuccess);
  ASSERT_EQ(cudaMemset(u.get(), 8, n), cudaSuccess);
  SaveOptions so;
  so.snapshot_to_device = true;
  SaveHandle h = writer->SaveAsync(dir.path(), 1, so).value();
  ASSERT_EQ(cudaMemset(t.get(), 9, n), cudaSuccess);
  ASSERT_EQ(cudaMemset(u.get(), 9, n), cudaSuccess);
  CKPT_ASSERT_OK_AND_ASSIGN(SaveResult r, h.Wait());
  EXPECT_EQ(r.device_snapshot_bytes, n);
  // One load of both entries: a load that leaves an entry of the
  // checkpoint unrequested fails (FailedPrecondition) unless filtered.
  auto reader = Reader::Open(dir.path()).value();
  std::string out_t(n, 0), out_u(n, 0);
  CKPT_ASSERT_OK(
      reader->Load({{"t", DType::kUInt8, {n}, FlatRange{0, n}, out_t.data()},
                    {"u", DType::kUInt8, {n}, FlatRange{0, n}, out_u.data()}}));
  EXPECT_EQ(out_t, std::string(n, 7));  // from the device snapshot
  EXPECT_EQ(out_u, std::string(n, 8));  // staged to the host at the call
}

}  // namespace
}  // namespace ckpt::gpu

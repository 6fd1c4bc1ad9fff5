// The device-memory path of Writer and Reader, exercised without a GPU
// through a DeviceMemory that copies host memory and counts its calls.
#include <atomic>
#include <cstring>

#include "ckpt/reader.h"
#include "ckpt/writer.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::ReferenceBytes;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;

class FakeDevice : public DeviceMemory {
 public:
  absl::Status CopyToHost(void* dst, const void* src, size_t n,
                          int device) override {
    if (device != 3) return absl::InvalidArgumentError("wrong device");
    std::memcpy(dst, src, n);
    to_host += n;
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(void* dst, const void* src, size_t n,
                            int device) override {
    if (device != 3) return absl::InvalidArgumentError("wrong device");
    std::memcpy(dst, src, n);
    from_host += n;
    return absl::OkStatus();
  }
  std::atomic<uint64_t> to_host{0}, from_host{0};
};

TEST(DeviceMemoryTest, DeviceTensorsAreStagedOnSaveAndLoad) {
  for (format::Codec codec : {format::Codec::kNone, format::Codec::kZstd}) {
    TempDir dir;
    FakeDevice dev;
    std::string w = ReferenceBytes(DType::kBFloat16, {300, 40}, 1);
    Writer::Options wo;
    wo.device_memory = &dev;
    auto writer = Writer::Create(wo).value();
    TensorOptions on_gpu;
    on_gpu.memory = MemoryKind::kCuda;
    on_gpu.device = 3;
    CKPT_ASSERT_OK(writer->AddTensor("w", DType::kBFloat16, {300, 40},
                                     FullBox({300, 40}), w.data(), on_gpu));
    SaveOptions so;
    so.codec = codec;
    so.block_size = 4096;
    CKPT_ASSERT_OK(writer->Save(dir.path(), 1, so));
    EXPECT_EQ(dev.to_host, w.size());

    ReaderOptions ro;
    ro.device_memory = &dev;
    auto reader = Reader::Open(dir.path(), ro).value();
    std::string out(w.size(), 0);
    LoadRequest r{
        "w", DType::kBFloat16, {300, 40}, FullBox({300, 40}), out.data()};
    r.memory = MemoryKind::kCuda;
    r.device = 3;
    CKPT_ASSERT_OK(reader->Load({r}));
    EXPECT_EQ(out, w);
    EXPECT_EQ(dev.from_host, w.size());
  }
}

TEST(DeviceMemoryTest, DeviceDestinationWithoutDeviceMemoryIsRefused) {
  TempDir dir;
  std::string w = ReferenceBytes(DType::kFloat32, {8}, 1);
  auto writer = Writer::Create({}).value();
  CKPT_ASSERT_OK(
      writer->AddTensor("w", DType::kFloat32, {8}, FlatRange{0, 8}, w.data()));
  CKPT_ASSERT_OK(writer->Save(dir.path(), 1, {}));
  auto reader = Reader::Open(dir.path()).value();
  LoadRequest r{"w", DType::kFloat32, {8}, FlatRange{0, 8}, w.data()};
  r.memory = MemoryKind::kCuda;
  EXPECT_THAT(reader->Load({r}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "w: destination is CUDA memory but "
                       "ReaderOptions::device_memory is not set"));
}

TEST(DirectIoTest, SaveAndLoadWithODirect) {
  TempDir dir;
  std::string w = ReferenceBytes(DType::kFloat32, {512, 512}, 4);
  auto writer = Writer::Create({}).value();
  CKPT_ASSERT_OK(writer->AddTensor("w", DType::kFloat32, {512, 512},
                                   FullBox({512, 512}), w.data()));
  SaveOptions so;
  so.direct_io = true;
  CKPT_ASSERT_OK(writer->Save(dir.path(), 1, so));
  ReaderOptions ro;
  ro.direct_io = true;
  auto reader = Reader::Open(dir.path(), ro).value();
  std::string out(w.size(), 0);
  CKPT_ASSERT_OK(reader->Load({{"w",
                                DType::kFloat32,
                                {512, 512},
                                Box{{0, 0}, {512, 512}},
                                out.data()}}));
  EXPECT_EQ(out, w);
}

}  // namespace
}  // namespace ckpt

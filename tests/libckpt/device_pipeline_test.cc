// The staged device pipelines of Writer and Reader
// (libckpt/staging/save_stager.h, load_stager.h), without a GPU: through the
// fake asynchronous device of tests/testing/fake_device.h, whose copies run on
// stream threads after a latency and complete through events.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/reader.h"
#include "ckpt/testing/fake_device.h"
#include "ckpt/testing/fault_injection.h"
#include "ckpt/writer.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "staging/load_stager.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::Extract;
using ::ckpt::testing::FakeDevice;
using ::ckpt::testing::ReferenceBytes;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;

TEST(CoalesceRunsTest, EqualRunsWithConstantPitchesAreOneStridedCopy) {
  std::vector<internal::CopyRun> runs;
  for (uint64_t r = 0; r < 10; ++r) runs.push_back({r * 64, r * 256 + 32, 64});
  runs.push_back({640, 5000, 16});  // a different length: its own copy
  static char src[8192], dst[8192];
  std::vector<DeviceCopy> copies = internal::CoalesceRuns(runs, src, dst);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].rows, 10u);
  EXPECT_EQ(copies[0].row_bytes, 64u);
  EXPECT_EQ(copies[0].src_pitch, 64u);
  EXPECT_EQ(copies[0].dst_pitch, 256u);
  EXPECT_EQ(copies[0].dst, dst + 32);
  EXPECT_EQ(copies[1].rows, 1u);
  EXPECT_EQ(copies[1].bytes(), 16u);
}

TEST(CoalesceRunsTest, IrregularRunsStayContiguousCopies) {
  std::vector<internal::CopyRun> runs = {{0, 0, 8}, {8, 100, 8}, {16, 150, 8}};
  static char src[8192], dst[8192];
  std::vector<DeviceCopy> copies = internal::CoalesceRuns(runs, src, dst);
  uint64_t bytes = 0;
  for (const DeviceCopy& c : copies) bytes += c.bytes();
  EXPECT_EQ(bytes, 24u);
  EXPECT_EQ(copies.size(),
            2u);  // {0,0},{8,100} pitch 8/100; {16,150} breaks it
}

// Saves `w` (a 512 x 256 float32 matrix) from host memory.
void SaveMatrix(const std::string& root, const std::string& w) {
  auto writer = Writer::Create({}).value();
  CKPT_ASSERT_OK(writer->AddTensor("w", DType::kFloat32, {512, 256},
                                   FullBox({512, 256}), w.data()));
  CKPT_ASSERT_OK(writer->AddTensor("v", DType::kFloat32, {1000},
                                   FlatRange{0, 1000}, w.data()));
  SaveOptions so;
  so.block_size = 64 << 10;
  CKPT_ASSERT_OK(writer->Save(root, 1, so));
}

TEST(DeviceLoadTest, ColumnBlockIntoDeviceIsOneStridedCopyPerGranule) {
  TempDir dir;
  std::string w = ReferenceBytes(DType::kFloat32, {512, 256}, 7);
  SaveMatrix(dir.path(), w);
  FakeDevice dev;
  ReaderOptions ro;
  ro.device_memory = &dev;
  auto reader = Reader::Open(dir.path(), ro).value();
  const Region cols = Box{{0, 64}, {512, 64}};  // 512 rows of 256 bytes
  std::string out(512 * 64 * 4, 0);
  LoadRequest r{"w", DType::kFloat32, {512, 256}, cols, out.data()};
  r.memory = MemoryKind::kCuda;
  LoadOptions lo;
  lo.allow_unrequested = true;
  CKPT_ASSERT_OK(reader->Load({r}, lo));
  EXPECT_EQ(out, Extract(w, DType::kFloat32, {512, 256}, cols));
  // 512 KiB stored in 1 MiB granules: the 512 rows are one 2-D copy, not 512.
  EXPECT_EQ(dev.copy_calls, 1);
  EXPECT_EQ(dev.strided_calls, 1);
  EXPECT_EQ(dev.sync_calls, 0);
}

TEST(DeviceLoadTest, MixedHostAndDeviceDestinationsInOneLoad) {
  TempDir dir;
  std::string w = ReferenceBytes(DType::kFloat32, {512, 256}, 8);
  SaveMatrix(dir.path(), w);
  FakeDevice dev;
  ReaderOptions ro;
  ro.device_memory = &dev;
  ro.io_threads = 3;
  auto reader = Reader::Open(dir.path(), ro).value();
  std::string on_device(w.size(), 0), on_host(4000, 0);
  std::atomic<int> completed{0};
  LoadRequest a{
      "w", DType::kFloat32, {512, 256}, FullBox({512, 256}), on_device.data()};
  a.memory = MemoryKind::kCuda;
  // Completion is reported only once the device copies finished.
  a.on_complete = [&] {
    EXPECT_EQ(on_device, w);
    ++completed;
  };
  LoadRequest b{
      "v", DType::kFloat32, {1000}, FlatRange{0, 1000}, on_host.data()};
  b.on_complete = [&] { ++completed; };
  CKPT_ASSERT_OK(reader->Load({a, b}));
  EXPECT_EQ(on_device, w);
  EXPECT_EQ(on_host, w.substr(0, 4000));
  EXPECT_EQ(completed, 2);
  EXPECT_EQ(dev.bytes_copied, w.size());
  // Pinned buffers are made once per Reader, not per load.
  const int64_t allocations = dev.allocations;
  CKPT_ASSERT_OK(reader->Load({a, b}));
  EXPECT_EQ(dev.allocations, allocations);
}

TEST(DeviceLoadTest, CopiesToTheDeviceWaitForTheCallersEvent) {
  TempDir dir;
  std::string w = ReferenceBytes(DType::kFloat32, {512, 256}, 10);
  SaveMatrix(dir.path(), w);
  FakeDevice dev;
  ReaderOptions ro;
  ro.device_memory = &dev;
  auto reader = Reader::Open(dir.path(), ro).value();
  std::string out(w.size(), 0);
  // The caller's last "kernel" still writes the destination: the load's
  // copies must come after it, or its bytes would win.
  auto caller = dev.CreateStream(0).value();
  static_cast<::ckpt::testing::FakeStream*>(caller.get())->Launch([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::fill(out.begin(), out.end(), 'k');
  });
  auto ready = caller->Record().value();
  LoadRequest r{
      "w", DType::kFloat32, {512, 256}, FullBox({512, 256}), out.data()};
  r.memory = MemoryKind::kCuda;
  LoadOptions lo;
  lo.allow_unrequested = true;
  lo.device_ready = ready.get();
  CKPT_ASSERT_OK(reader->Load({r}, lo));
  EXPECT_EQ(out, w);
}

TEST(DeviceLoadTest, DeviceCopyErrorFailsTheLoad) {
  TempDir dir;
  std::string w = ReferenceBytes(DType::kFloat32, {512, 256}, 9);
  SaveMatrix(dir.path(), w);
  FakeDevice dev;
  dev.FailAfterBytes(100000, absl::InternalError("device lost"));
  ReaderOptions ro;
  ro.device_memory = &dev;
  auto reader = Reader::Open(dir.path(), ro).value();
  std::string out(w.size(), 0);
  LoadRequest r{
      "w", DType::kFloat32, {512, 256}, FullBox({512, 256}), out.data()};
  r.memory = MemoryKind::kCuda;
  bool completed = false;
  r.on_complete = [&] { completed = true; };
  LoadOptions lo;
  lo.allow_unrequested = true;
  EXPECT_THAT(reader->Load({r}, lo),
              StatusIs(absl::StatusCode::kInternal, "device lost"));
  EXPECT_FALSE(completed);
}

}  // namespace
}  // namespace ckpt

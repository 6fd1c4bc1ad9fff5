// The staging pool and the SaveStager (libckpt/staging/staging_pool.h,
// save_stager.h), through the fake asynchronous device.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/testing/fake_device.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "staging/save_stager.h"
#include "staging/staging_pool.h"
#include "testing/status_matchers.h"

namespace ckpt::internal {
namespace {

using ::ckpt::testing::FakeDevice;
using ::ckpt::testing::FakeEvent;
using ::ckpt::testing::ReferenceBytes;
using ::ckpt::testing::SharedEvent;
using ::ckpt::testing::StatusIs;

constexpr uint64_t kBuf = 64 << 10;

TEST(StagingPoolTest, GrowsOnDemandUpToTheCapAndReusesBuffers) {
  FakeDevice dev;
  auto pool = StagingPool::Create(&dev, kBuf, 3 * kBuf).value();
  EXPECT_EQ(dev.allocations, 0);  // nothing until needed
  for (int round = 0; round < 3; ++round) {
    std::vector<StagingPool::Lease> leases;
    for (int i = 0; i < 3; ++i) leases.push_back(pool->Acquire().value());
    EXPECT_EQ(pool->allocated_bytes(), 3 * kBuf);
  }
  EXPECT_EQ(dev.allocations, 3);  // allocated once, reused by every round
  EXPECT_EQ(pool->peak_leased_bytes(), 3 * kBuf);
  pool.reset();
  EXPECT_EQ(dev.allocated_bytes, 0);  // freed with the pool
}

TEST(StagingPoolTest, AcquireAtTheCapWaitsForARelease) {
  auto pool = StagingPool::Create(nullptr, kBuf, kBuf).value();
  StagingPool::Lease held = pool->Acquire().value();
  std::atomic<bool> got{false};
  std::thread t([&] {
    StagingPool::Lease l = pool->Acquire().value();
    got = true;
  });
  for (int i = 0; i < 20 && !got; ++i) std::this_thread::yield();
  EXPECT_FALSE(got);
  char* data = held.data();
  held.Release();
  t.join();
  EXPECT_TRUE(got);
  EXPECT_EQ(pool->Acquire().value().data(), data);  // the same buffer again
}

TEST(StagingPoolTest, BadSizesAreRefused) {
  EXPECT_THAT(StagingPool::Create(nullptr, 0, kBuf).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "buffer size"));
  EXPECT_THAT(StagingPool::Create(nullptr, 2 * kBuf, kBuf).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "at most the cap"));
  EXPECT_THAT(StagingPool::Create(nullptr, 1000, 4 * kBuf).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "multiple of 4096"));
}

class FailingAllocDevice : public FakeDevice {
 public:
  absl::StatusOr<void*> AllocateHost(size_t n) override {
    if (allocations >= ok_allocations)
      return absl::ResourceExhaustedError("cannot pin");
    return FakeDevice::AllocateHost(n);
  }
  int ok_allocations = 0;
};

TEST(StagingPoolTest, FirstAllocationErrorIsReturned) {
  FailingAllocDevice dev;
  auto pool = StagingPool::Create(&dev, kBuf, 4 * kBuf).value();
  EXPECT_THAT(pool->Acquire().status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "cannot pin"));
}

TEST(StagingPoolTest, LaterAllocationErrorStopsGrowthInsteadOfFailing) {
  FailingAllocDevice dev;
  dev.ok_allocations = 1;
  auto pool = StagingPool::Create(&dev, kBuf, 4 * kBuf).value();
  StagingPool::Lease a = pool->Acquire().value();
  std::thread t([&] { a.Release(); });
  StagingPool::Lease b = pool->Acquire().value();  // waits for `a`
  t.join();
  EXPECT_EQ(pool->allocated_bytes(), kBuf);
}

TEST(StagingPoolTest, ReserveAllocatesAheadUpToTheCapAndAcquireReusesIt) {
  FakeDevice dev;
  auto pool = StagingPool::Create(&dev, kBuf, 3 * kBuf).value();
  CKPT_ASSERT_OK(pool->Reserve(2 * kBuf - 1));  // rounded up to buffers
  EXPECT_EQ(dev.allocations, 2);
  CKPT_ASSERT_OK(pool->Reserve(100 * kBuf));  // never past the cap
  EXPECT_EQ(dev.allocations, 3);
  EXPECT_EQ(pool->allocated_bytes(), 3 * kBuf);
  std::vector<StagingPool::Lease> leases;
  for (int i = 0; i < 3; ++i) leases.push_back(pool->Acquire().value());
  EXPECT_EQ(dev.allocations, 3);  // taken, not allocated
}

TEST(StagingPoolTest, ReserveReturnsTheFirstAllocationErrorOnly) {
  FailingAllocDevice none;
  auto empty = StagingPool::Create(&none, kBuf, 4 * kBuf).value();
  EXPECT_THAT(empty->Reserve(4 * kBuf),
              StatusIs(absl::StatusCode::kResourceExhausted, "cannot pin"));
  FailingAllocDevice one;
  one.ok_allocations = 1;
  auto pool = StagingPool::Create(&one, kBuf, 4 * kBuf).value();
  CKPT_ASSERT_OK(pool->Reserve(4 * kBuf));  // stops growing at one buffer
  EXPECT_EQ(pool->allocated_bytes(), kBuf);
}

// Consumes every item as the shard writer does (segment-sized ranges), on
// `threads` threads, and returns the concatenated bytes of each item.
std::vector<std::string> Consume(const std::vector<StagedBytes*>& views,
                                 const std::vector<uint64_t>& sizes,
                                 uint64_t seg, absl::Status* status) {
  std::vector<std::string> out(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    for (uint64_t off = 0; off < sizes[i]; off += seg) {
      uint64_t n = std::min(seg, sizes[i] - off);
      absl::StatusOr<const char*> p = views[i]->Acquire(off, n);
      if (!p.ok()) {
        *status = p.status();
        return out;
      }
      out[i].append(*p, n);
      views[i]->Release(off, n);
    }
  }
  return out;
}

TEST(StagerTest, HostDeviceAndSourceItemsAreStagedByteExact) {
  FakeDevice dev;
  auto pool = StagingPool::Create(&dev, kBuf, 2 * kBuf).value();
  const uint64_t seg = 16 << 10;
  std::string host = ReferenceBytes(DType::kUInt8, {100000}, 1);
  std::string device = ReferenceBytes(DType::kUInt8, {300000}, 2);
  std::string sourced = ReferenceBytes(DType::kUInt8, {5000}, 3);
  TensorSource source = [&](uint64_t off, void* dst, uint64_t n) {
    std::memcpy(dst, sourced.data() + off, n);
    return absl::OkStatus();
  };
  SaveStager stager(pool.get(), &dev, nullptr, seg, 0);
  std::vector<StagedBytes*> views = {
      stager.Add(
          {"h", host.size(), host.data(), MemoryKind::kHost, 0, nullptr}),
      stager.Add(
          {"d", device.size(), device.data(), MemoryKind::kCuda, 0, nullptr}),
      stager.Add({"empty", 0, nullptr, MemoryKind::kHost, 0, nullptr}),
      stager.Add(
          {"s", sourced.size(), nullptr, MemoryKind::kHost, 0, &source})};
  absl::Status run;
  std::thread t([&] { run = stager.Run(); });
  absl::Status consumed;
  auto out = Consume(views, {host.size(), device.size(), 0, sourced.size()},
                     seg, &consumed);
  t.join();
  stager.Finish();
  CKPT_ASSERT_OK(run);
  CKPT_ASSERT_OK(consumed);
  EXPECT_EQ(out[0], host);
  EXPECT_EQ(out[1], device);
  EXPECT_EQ(out[3], sourced);
  EXPECT_LE(stager.peak_bytes(), 2 * kBuf);  // 400 KB through 128 KiB
  EXPECT_GE(dev.copy_calls, 1);
  EXPECT_LT(dev.batches, dev.copy_calls + 1);
}

TEST(StagerTest, HostBytesCopiedBySeveralThreadsAreByteExact) {
  // Items of odd sizes, packed into buffers, each split among 3 threads.
  auto pool = StagingPool::Create(nullptr, 8 << 20, 16 << 20).value();
  const uint64_t seg = 64 << 10;
  std::vector<std::string> data = {
      ReferenceBytes(DType::kUInt8, {(9 << 20) + 123}, 7),
      ReferenceBytes(DType::kUInt8, {77777}, 8),
      ReferenceBytes(DType::kUInt8, {(5 << 20) + 5}, 9)};
  SaveStager stager(pool.get(), nullptr, nullptr, seg, 0, /*copy_threads=*/3);
  std::vector<StagedBytes*> views;
  std::vector<uint64_t> sizes;
  for (const std::string& d : data) {
    views.push_back(
        stager.Add({"h", d.size(), d.data(), MemoryKind::kHost, 0, nullptr}));
    sizes.push_back(d.size());
  }
  absl::Status run;
  std::thread t([&] { run = stager.Run(); });
  absl::Status consumed;
  auto out = Consume(views, sizes, seg, &consumed);
  t.join();
  stager.Finish();
  CKPT_ASSERT_OK(run);
  CKPT_ASSERT_OK(consumed);
  for (size_t i = 0; i < data.size(); ++i) EXPECT_EQ(out[i], data[i]) << i;
}

TEST(StagerTest, RunStopsBeforeTheGivenItemAndTheNextRunGoesOnFromThere) {
  FakeDevice dev;
  auto pool = StagingPool::Create(&dev, kBuf, 8 * kBuf).value();
  std::string a = ReferenceBytes(DType::kUInt8, {kBuf + 10}, 21);
  std::string empty;
  std::string b = ReferenceBytes(DType::kUInt8, {3000}, 22);
  SaveStager stager(pool.get(), &dev, nullptr, 4096, 0);
  StagedBytes* va =
      stager.Add({"a", a.size(), a.data(), MemoryKind::kHost, 0, nullptr});
  stager.Add({"empty", 0, nullptr, MemoryKind::kHost, 0, nullptr});
  StagedBytes* vb =
      stager.Add({"b", b.size(), b.data(), MemoryKind::kCuda, 0, nullptr});
  CKPT_ASSERT_OK(stager.Run(2));  // "a" and the empty item
  EXPECT_EQ(dev.copy_calls, 0);   // "b" not yet
  const std::string a0 = a;
  std::fill(a.begin(), a.end(), 'x');  // "a" was staged already
  stager.ForgetReadyEvent();
  CKPT_ASSERT_OK(stager.Run());
  absl::Status consumed;
  auto out = Consume({va, vb}, {a.size(), b.size()}, 4096, &consumed);
  stager.Finish();
  CKPT_ASSERT_OK(consumed);
  EXPECT_EQ(out[0], a0);
  EXPECT_EQ(out[1], b);
}

TEST(StagerTest, DeviceCopiesWaitForTheCallersEvent) {
  FakeDevice dev;
  auto pool = StagingPool::Create(&dev, kBuf, 2 * kBuf).value();
  std::string tensor(10000, 'a');
  // The caller's "kernel" writes the final values; its event completes after.
  auto caller = dev.CreateStream(0).value();
  auto* caller_stream = static_cast<::ckpt::testing::FakeStream*>(caller.get());
  caller_stream->Launch([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::fill(tensor.begin(), tensor.end(), 'b');
  });
  auto ready = caller->Record().value();
  SaveStager stager(pool.get(), &dev, ready.get(), 4096, 0);
  StagedBytes* v = stager.Add(
      {"t", tensor.size(), tensor.data(), MemoryKind::kCuda, 0, nullptr});
  CKPT_ASSERT_OK(stager.Run());
  const char* p = v->Acquire(0, tensor.size()).value();
  EXPECT_EQ(std::string(p, tensor.size()), std::string(10000, 'b'));
  stager.Finish();
}

TEST(StagerTest, LimitBoundsBuffersHeldAndRunWaitsForReleases) {
  FakeDevice dev;
  auto pool = StagingPool::Create(&dev, kBuf, 8 * kBuf).value();
  std::string device = ReferenceBytes(DType::kUInt8, {10 * kBuf}, 5);
  SaveStager stager(pool.get(), &dev, nullptr, kBuf, /*max_buffers=*/2);
  StagedBytes* v = stager.Add(
      {"d", device.size(), device.data(), MemoryKind::kCuda, 0, nullptr});
  absl::Status run;
  std::thread t([&] { run = stager.Run(); });
  absl::Status consumed;
  auto out = Consume({v}, {device.size()}, kBuf, &consumed);
  t.join();
  stager.Finish();
  CKPT_ASSERT_OK(run);
  EXPECT_EQ(out[0], device);
  EXPECT_LE(stager.peak_bytes(), 2 * kBuf);
  EXPECT_LE(pool->allocated_bytes(), 2 * kBuf);
}

// AsyncSave starts the shard's writer (the consumer) in before_waiting, or
// after Run: with the whole snapshot fitting, the copies run alone.
TEST(StagerTest, BeforeWaitingRunsOnceWhenRunNeedsABufferOnlyAConsumerFrees) {
  for (const bool pool_full : {true, false}) {  // the pool's cap, or the limit
    FakeDevice dev;
    auto pool =
        StagingPool::Create(&dev, kBuf, (pool_full ? 2 : 8) * kBuf).value();
    CKPT_ASSERT_OK(pool->Reserve(2 * kBuf));
    std::string host = ReferenceBytes(DType::kUInt8, {5 * kBuf}, 9);
    SaveStager stager(pool.get(), &dev, nullptr, kBuf,
                      /*max_buffers=*/pool_full ? 0 : 2);
    StagedBytes* v = stager.Add(
        {"h", host.size(), host.data(), MemoryKind::kHost, 0, nullptr});
    int calls = 0;
    absl::Status consumed;
    std::vector<std::string> out;
    std::thread consumer;
    stager.set_before_waiting([&] {
      ++calls;
      consumer = std::thread(
          [&] { out = Consume({v}, {host.size()}, kBuf, &consumed); });
    });
    CKPT_ASSERT_OK(stager.Run());  // without the hook's consumer: a deadlock
    consumer.join();
    stager.Finish();
    EXPECT_EQ(calls, 1) << pool_full;
    EXPECT_EQ(out[0], host);
  }
}

TEST(StagerTest, BeforeWaitingIsNotCalledWhenEverythingFits) {
  FakeDevice dev;
  auto pool = StagingPool::Create(&dev, kBuf, 8 * kBuf).value();
  CKPT_ASSERT_OK(pool->Reserve(8 * kBuf));  // as MakeAsyncSnapshot does
  std::string host = ReferenceBytes(DType::kUInt8, {5 * kBuf}, 9);
  SaveStager stager(pool.get(), &dev, nullptr, kBuf, 0);
  StagedBytes* v = stager.Add(
      {"h", host.size(), host.data(), MemoryKind::kHost, 0, nullptr});
  int calls = 0;
  stager.set_before_waiting([&] { ++calls; });
  CKPT_ASSERT_OK(stager.Run());  // no consumer runs meanwhile
  EXPECT_EQ(calls, 0);
  absl::Status consumed;
  auto out = Consume({v}, {host.size()}, kBuf, &consumed);
  stager.Finish();
  EXPECT_EQ(out[0], host);
}

TEST(StagerTest, DeviceCopyErrorReachesRunAndConsumers) {
  FakeDevice dev;
  dev.FailAfterBytes(3 * kBuf, absl::DataLossError("ECC error"));
  auto pool = StagingPool::Create(&dev, kBuf, 8 * kBuf).value();
  std::string device(6 * kBuf, 'x');
  SaveStager stager(pool.get(), &dev, nullptr, kBuf, 0);
  StagedBytes* v = stager.Add(
      {"d", device.size(), device.data(), MemoryKind::kCuda, 0, nullptr});
  EXPECT_THAT(stager.Run(), StatusIs(absl::StatusCode::kDataLoss, "ECC error"));
  EXPECT_THAT(v->Acquire(5 * kBuf, kBuf).status(),
              StatusIs(absl::StatusCode::kDataLoss, "ECC error"));
  stager.Finish();
}

TEST(StagerTest, FinishStopsARunWaitingForSpace) {
  FakeDevice dev;
  auto pool = StagingPool::Create(&dev, kBuf, kBuf).value();
  std::string host(4 * kBuf, 'x');
  SaveStager stager(pool.get(), &dev, nullptr, kBuf, 0);
  stager.Add({"h", host.size(), host.data(), MemoryKind::kHost, 0, nullptr});
  absl::Status run;
  std::thread t([&] { run = stager.Run(); });  // stages 1 buffer, then waits
  stager.Finish();  // a consumer that failed and will release nothing
  t.join();
  EXPECT_THAT(run, StatusIs(absl::StatusCode::kCancelled, "staging stopped"));
  EXPECT_TRUE(pool->Acquire().ok());  // every buffer went back
}

TEST(StagerTest, RangesCrossingASegmentAreAnInternalError) {
  auto pool = StagingPool::Create(nullptr, kBuf, 2 * kBuf).value();
  std::string host(2 * kBuf, 'x');
  SaveStager stager(pool.get(), nullptr, nullptr, kBuf, 0);
  StagedBytes* v = stager.Add(
      {"h", host.size(), host.data(), MemoryKind::kHost, 0, nullptr});
  CKPT_ASSERT_OK(stager.Run());
  EXPECT_THAT(v->Acquire(kBuf / 2, kBuf).status(),
              StatusIs(absl::StatusCode::kInternal, "cross a staging segment"));
  stager.Finish();
}

}  // namespace
}  // namespace ckpt::internal

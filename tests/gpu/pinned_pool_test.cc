#include "ckpt/gpu/pinned_pool.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ckpt/gpu/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::gpu {
namespace {

using ::testing::HasSubstr;
using Lease = PinnedStagingPool::Lease;

std::unique_ptr<PinnedStagingPool> MakeTestPool(size_t bytes, int n) {
  auto pool = PinnedStagingPool::CreateForTesting(bytes, n);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *std::move(pool) : nullptr;
}

TEST(PinnedStagingPoolTest, RejectsZeroBufferBytes) {
  auto pool = PinnedStagingPool::CreateForTesting(0, 2);
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(pool.status().message(), HasSubstr("buffer_bytes"));
}

TEST(PinnedStagingPoolTest, RejectsNonPositiveBufferCount) {
  for (int n : {0, -1}) {
    auto pool = PinnedStagingPool::CreateForTesting(4096, n);
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(pool.status().message(), HasSubstr("num_buffers"));
  }
}

TEST(PinnedStagingPoolTest, CreateValidatesArgumentsBeforeTouchingCuda) {
  // Holds on machines without a driver too: no CUDA call is made.
  auto pool = PinnedStagingPool::Create(0, 1);
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PinnedStagingPoolTest, BuffersAreDistinctSizedAndAligned) {
  auto pool = MakeTestPool(1000, 3);
  ASSERT_NE(pool, nullptr);
  EXPECT_FALSE(pool->pinned());
  EXPECT_EQ(pool->buffer_bytes(), 1000u);
  EXPECT_EQ(pool->num_buffers(), 3);

  std::vector<Lease> leases;
  std::set<int> indices;
  std::set<const std::byte*> addresses;
  for (int i = 0; i < 3; ++i) {
    leases.push_back(pool->Acquire());
    const Lease& l = leases.back();
    ASSERT_TRUE(l.valid());
    EXPECT_EQ(l.size(), 1000u);
    EXPECT_EQ(
        reinterpret_cast<uintptr_t>(l.data()) % PinnedStagingPool::kAlignment,
        0u);
    std::memset(l.data(), i, l.size());  // Whole buffer is writable.
    indices.insert(l.index());
    addresses.insert(l.data());
  }
  EXPECT_EQ(indices, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(addresses.size(), 3u);
  EXPECT_EQ(pool->num_available(), 0);
}

TEST(PinnedStagingPoolTest, TryAcquireReturnsEmptyWhenExhausted) {
  auto pool = MakeTestPool(64, 2);
  ASSERT_NE(pool, nullptr);
  Lease a = pool->TryAcquire();
  Lease b = pool->TryAcquire();
  ASSERT_TRUE(a.valid());
  ASSERT_TRUE(b.valid());
  Lease c = pool->TryAcquire();
  EXPECT_FALSE(c.valid());
  EXPECT_EQ(c.index(), -1);
  EXPECT_TRUE(c.bytes().empty());
}

TEST(PinnedStagingPoolTest, DestroyingLeaseReturnsBuffer) {
  auto pool = MakeTestPool(64, 1);
  ASSERT_NE(pool, nullptr);
  {
    Lease a = pool->Acquire();
    EXPECT_EQ(pool->num_available(), 0);
    EXPECT_FALSE(pool->TryAcquire().valid());
  }
  EXPECT_EQ(pool->num_available(), 1);
  EXPECT_TRUE(pool->TryAcquire().valid());
}

TEST(PinnedStagingPoolTest, ReleaseEmptiesLeaseAndIsIdempotent) {
  auto pool = MakeTestPool(64, 1);
  ASSERT_NE(pool, nullptr);
  Lease a = pool->Acquire();
  a.Release();
  EXPECT_FALSE(a.valid());
  EXPECT_EQ(a.index(), -1);
  EXPECT_EQ(pool->num_available(), 1);
  a.Release();  // No-op on an empty lease.
  EXPECT_EQ(pool->num_available(), 1);
}

TEST(PinnedStagingPoolTest, MoveTransfersOwnership) {
  auto pool = MakeTestPool(64, 2);
  ASSERT_NE(pool, nullptr);
  Lease a = pool->Acquire();
  const int index = a.index();
  Lease b = std::move(a);
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): contract.
  ASSERT_TRUE(b.valid());
  EXPECT_EQ(b.index(), index);
  EXPECT_EQ(pool->num_available(), 1);

  // Move-assigning over a valid lease returns the buffer it held.
  Lease c = pool->Acquire();
  EXPECT_EQ(pool->num_available(), 0);
  c = std::move(b);
  EXPECT_EQ(c.index(), index);
  EXPECT_EQ(pool->num_available(), 1);

  // Self-move keeps the lease.
  Lease& alias = c;
  c = std::move(alias);
  EXPECT_TRUE(c.valid());
  EXPECT_EQ(pool->num_available(), 1);
}

TEST(PinnedStagingPoolTest, LeaseCanBeReleasedOnAnotherThread) {
  auto pool = MakeTestPool(64, 1);
  ASSERT_NE(pool, nullptr);
  Lease a = pool->Acquire();
  std::thread t([lease = std::move(a)]() mutable { lease.Release(); });
  t.join();
  EXPECT_EQ(pool->num_available(), 1);
}

TEST(PinnedStagingPoolTest, AcquireBlocksUntilABufferIsReturned) {
  auto pool = MakeTestPool(64, 1);
  ASSERT_NE(pool, nullptr);
  Lease held = pool->Acquire();
  const int held_index = held.index();

  absl::Notification started;
  std::atomic<bool> acquired{false};
  int got_index = -1;
  std::thread waiter([&] {
    started.Notify();
    Lease l = pool->Acquire();
    got_index = l.index();
    acquired = true;
  });
  started.WaitForNotification();
  // Every buffer is leased, so the waiter cannot have one, however long it
  // has been running.
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(acquired.load());

  held.Release();
  waiter.join();
  EXPECT_TRUE(acquired.load());
  EXPECT_EQ(got_index, held_index);
}

TEST(PinnedStagingPoolTest, AcquireForTimesOutWhenExhausted) {
  auto pool = MakeTestPool(64, 1);
  ASSERT_NE(pool, nullptr);
  Lease held = pool->Acquire();
  const absl::Time start = absl::Now();
  Lease l = pool->AcquireFor(absl::Milliseconds(20));
  EXPECT_FALSE(l.valid());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(20));
  EXPECT_FALSE(pool->AcquireFor(absl::ZeroDuration()).valid());
  held.Release();
  EXPECT_TRUE(pool->AcquireFor(absl::ZeroDuration()).valid());
}

TEST(PinnedStagingPoolTest, AcquireForWakesOnReturn) {
  auto pool = MakeTestPool(64, 1);
  ASSERT_NE(pool, nullptr);
  Lease held = pool->Acquire();
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(10));
    held.Release();
  });
  Lease l = pool->AcquireFor(absl::Seconds(30));
  releaser.join();
  EXPECT_TRUE(l.valid());
}

// Guards "async save reuses staging buffers too early": while one owner
// still holds a buffer (its bytes not yet written out), no other owner may
// be handed the same buffer. Each worker marks its buffer as in use, fills
// it with its own id, yields, and checks nobody else wrote to it.
TEST(PinnedStagingPoolTest, StagingBufferNotReusedBeforeRelease) {
  constexpr int kBuffers = 2;
  constexpr int kThreads = 6;
  constexpr int kIterations = 300;
  constexpr size_t kBytes = 256;
  auto pool = MakeTestPool(kBytes, kBuffers);
  ASSERT_NE(pool, nullptr);

  std::atomic<bool> in_use[kBuffers] = {};
  std::atomic<int> double_handouts{0};
  std::atomic<int> corrupted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const auto mark = static_cast<std::byte>(t + 1);
      for (int i = 0; i < kIterations; ++i) {
        Lease l = (i % 3 == 0) ? pool->AcquireFor(absl::Seconds(30))
                               : pool->Acquire();
        if (!l.valid()) continue;
        if (in_use[l.index()].exchange(true)) ++double_handouts;
        std::memset(l.data(), static_cast<int>(mark), l.size());
        std::this_thread::yield();
        for (std::byte b : l.bytes()) {
          if (b != mark) {
            ++corrupted;
            break;
          }
        }
        in_use[l.index()] = false;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(double_handouts.load(), 0);
  EXPECT_EQ(corrupted.load(), 0);
  EXPECT_EQ(pool->num_available(), kBuffers);
}

TEST(PinnedStagingPoolDeathTest, DestroyingPoolWithOutstandingLeaseAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto pool = MakeTestPool(64, 1);
        Lease l = pool->Acquire();
        pool.reset();
      },
      "Lease is outstanding");
}

// The real thing needs a CUDA driver: cudaHostAlloc fails without one.
TEST(PinnedStagingPoolTest, CreatePinsMemoryOnAGpuMachine) {
  auto devices = QueryDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  if (devices->empty()) GTEST_SKIP() << "no CUDA device";

  auto pool = PinnedStagingPool::Create(1 << 20, 2);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_TRUE((*pool)->pinned());
  Lease l = (*pool)->Acquire();
  ASSERT_TRUE(l.valid());
  EXPECT_EQ(
      reinterpret_cast<uintptr_t>(l.data()) % PinnedStagingPool::kAlignment,
      0u);
  std::memset(l.data(), 0xab, l.size());
}

}  // namespace
}  // namespace ckpt::gpu

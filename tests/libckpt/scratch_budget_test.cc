#include "read/scratch_budget.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace ckpt::internal {
namespace {

TEST(ScratchLease, SmallLeasesAreNotCounted) {
  ScratchLease a(kSmallScratchBytes);
  EXPECT_EQ(ScratchLeasedBytes(), 0u);
}

TEST(ScratchLease, ALeaseAboveTheBudgetGoesAheadAlone) {
  {
    ScratchLease big(2 * kScratchBudgetBytes);
    EXPECT_EQ(ScratchLeasedBytes(), 2 * kScratchBudgetBytes);
  }
  EXPECT_EQ(ScratchLeasedBytes(), 0u);
}

// Two blocks of 600 MiB never hold scratch at the same time: the second
// waits until the first is released.
TEST(ScratchLease, LeasesPastTheBudgetWait) {
  const uint64_t block = 600ull << 20;
  std::atomic<bool> second_in{false};
  std::thread t;
  {
    ScratchLease first(block);
    t = std::thread([&] {
      ScratchLease second(block);
      second_in = true;
      EXPECT_EQ(ScratchLeasedBytes(), block);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(second_in.load());
  }
  t.join();
  EXPECT_TRUE(second_in.load());
  EXPECT_EQ(ScratchLeasedBytes(), 0u);
}

TEST(ReleaseLargeScratch, FreesOnlyLargeBuffers) {
  std::string small(1 << 20, 'x'), large(kSmallScratchBytes + 1, 'x');
  ReleaseLargeScratch(small);
  ReleaseLargeScratch(large);
  EXPECT_EQ(small.size(), 1u << 20);
  EXPECT_EQ(large.capacity() <= kSmallScratchBytes, true);
}

}  // namespace
}  // namespace ckpt::internal

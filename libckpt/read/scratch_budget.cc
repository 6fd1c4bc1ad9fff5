#include "read/scratch_budget.h"

#include "util/mutex.h"

namespace ckpt::internal {
namespace {

struct Budget {
  Mutex mu;
  CondVar freed;
  uint64_t leased ABSL_GUARDED_BY(mu) = 0;
};

Budget& Global() {
  static Budget* b = new Budget;
  return *b;
}

}  // namespace

ScratchLease::ScratchLease(uint64_t bytes)
    : bytes_(bytes > kSmallScratchBytes ? bytes : 0) {
  if (bytes_ == 0) return;
  Budget& b = Global();
  MutexLock l(&b.mu);
  // Alone, any lease goes ahead: a block needs what it needs.
  while (b.leased != 0 && (b.leased >= kScratchBudgetBytes ||
                           bytes_ > kScratchBudgetBytes - b.leased)) {
    b.freed.Wait(&b.mu);
  }
  b.leased += bytes_;
}

ScratchLease::~ScratchLease() {
  if (bytes_ == 0) return;
  Budget& b = Global();
  MutexLock l(&b.mu);
  b.leased -= bytes_;
  b.freed.SignalAll();
}

uint64_t ScratchLeasedBytes() {
  Budget& b = Global();
  MutexLock l(&b.mu);
  return b.leased;
}

}  // namespace ckpt::internal

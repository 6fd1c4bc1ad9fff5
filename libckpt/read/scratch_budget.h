// Scratch memory for blocks handled outside their destination (spec §10,
// "Memory per block in flight"): the stored bytes of a granule read for
// verification and the raw bytes a zstd block decodes to. A block may be
// 1 GiB (§10), so a reader with many threads could otherwise hold many of
// them at once from a file of a few KiB; the budget holds the process to
// about one such block at a time, whatever the number of threads.
#ifndef CKPT_LIBCKPT_READ_SCRATCH_BUDGET_H_
#define CKPT_LIBCKPT_READ_SCRATCH_BUDGET_H_

#include <cstdint>

namespace ckpt::internal {

// Scratch of up to this many bytes per thread is not counted.
inline constexpr uint64_t kSmallScratchBytes = 16ull << 20;
// Counted scratch of all threads together: at most this much at a time,
// unless one lease alone needs more (it then waits until it is alone).
inline constexpr uint64_t kScratchBudgetBytes = 1ull << 30;

// Holds `bytes` of the process's scratch budget from construction (which
// waits while the budget is taken) to destruction. Leases of at most
// kSmallScratchBytes never wait. Thread-safe. A thread must not hold a
// lease while it waits for another thread that may need one (the budget is
// meant for the read, verify and copy of one granule).
class ScratchLease {
 public:
  explicit ScratchLease(uint64_t bytes);
  ~ScratchLease();
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;

 private:
  uint64_t bytes_;  // counted: 0 when small
};

// Bytes of counted scratch leased now (for tests).
uint64_t ScratchLeasedBytes();

// Frees the memory of `buf` (a std::string or std::vector used as scratch)
// when it grew past kSmallScratchBytes, so that a thread does not keep a
// large block's memory after the block.
template <typename Buffer>
void ReleaseLargeScratch(Buffer& buf) {
  if (buf.capacity() > kSmallScratchBytes) Buffer().swap(buf);
}

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_READ_SCRATCH_BUDGET_H_

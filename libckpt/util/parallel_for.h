// Internal: run tasks on a few short-lived threads.
#ifndef CKPT_LIBCKPT_UTIL_PARALLEL_FOR_H_
#define CKPT_LIBCKPT_UTIL_PARALLEL_FOR_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "util/mutex.h"

namespace ckpt::internal {

// Threads worth running for `requested` I/O threads. Buffered I/O is a
// memory copy into or out of the page cache, bound by CPU: more threads than
// cores only adds contention. Direct I/O waits on the device, so the
// requested count (queue depth) is kept.
inline int EffectiveIoThreads(int requested, bool direct_io) {
  int hw = static_cast<int>(std::thread::hardware_concurrency());
  if (direct_io || hw <= 0) return std::max(1, requested);
  return std::max(1, std::min(requested, hw));
}

// Calls fn(thread_index, task) for every task in [0, num_tasks) on up to
// `threads` threads (tasks are taken in order). Stops handing out tasks
// after the first error and returns it.
inline absl::Status ParallelFor(
    int threads, size_t num_tasks,
    absl::FunctionRef<absl::Status(int, size_t)> fn) {
  if (num_tasks == 0) return absl::OkStatus();
  size_t n = std::max<size_t>(1, std::min<size_t>(threads, num_tasks));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  Mutex mu;
  absl::Status first;  // guarded by mu
  auto worker = [&](int t) {
    while (!failed.load(std::memory_order_relaxed)) {
      size_t i = next.fetch_add(1);
      if (i >= num_tasks) break;
      absl::Status s = fn(t, i);
      if (!s.ok()) {
        MutexLock l(&mu);
        if (first.ok()) first = s;
        failed = true;
      }
    }
  };
  if (n == 1) {
    worker(0);
    MutexLock l(&mu);
    return first;
  }
  std::vector<std::thread> pool;
  pool.reserve(n - 1);
  for (size_t t = 1; t < n; ++t) pool.emplace_back(worker, static_cast<int>(t));
  worker(0);
  for (auto& th : pool) th.join();
  MutexLock l(&mu);
  return first;
}

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_UTIL_PARALLEL_FOR_H_

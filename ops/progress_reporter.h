// Internal to ckpt_ops: reporting one phase of an operation's progress
// through its ProgressFn from several threads.
#ifndef CKPT_OPS_PROGRESS_REPORTER_H_
#define CKPT_OPS_PROGRESS_REPORTER_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "ckpt/ops/progress.h"
#include "util/mutex.h"

namespace ckpt::ops::internal {

// Starts phase `phase` of `total` bytes (an update of done 0), reports what
// Add adds, and ends the phase (a finished update) in Finish or, at the
// latest, on destruction. `fn` is borrowed; unset, nothing is reported.
// Thread-safe: Add may be called from any thread, and fn is called under a
// lock, so that its calls are serialized.
class ProgressReporter {
 public:
  ProgressReporter(const ProgressFn& fn, absl::string_view phase,
                   uint64_t total);
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  void Add(uint64_t n) ABSL_LOCKS_EXCLUDED(mu_);
  // REQUIRES: no Add after it.
  void Finish() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const ProgressFn& fn_;
  const std::string phase_;
  const uint64_t total_;
  Mutex mu_;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ckpt::ops::internal

#endif  // CKPT_OPS_PROGRESS_REPORTER_H_

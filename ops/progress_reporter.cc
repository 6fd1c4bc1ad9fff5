#include "progress_reporter.h"

namespace ckpt::ops::internal {

ProgressReporter::ProgressReporter(const ProgressFn& fn,
                                   absl::string_view phase, uint64_t total)
    : fn_(fn), phase_(phase), total_(total) {
  if (fn_) fn_(ProgressUpdate{phase_, 0, total_, false});
}

ProgressReporter::~ProgressReporter() { Finish(); }

void ProgressReporter::Add(uint64_t n) {
  if (!fn_) return;
  MutexLock l(&mu_);
  done_ += n;
  fn_(ProgressUpdate{phase_, done_, total_, false});
}

void ProgressReporter::Finish() {
  if (!fn_) return;
  MutexLock l(&mu_);
  if (finished_) return;
  finished_ = true;
  fn_(ProgressUpdate{phase_, done_, total_, true});
}

}  // namespace ckpt::ops::internal

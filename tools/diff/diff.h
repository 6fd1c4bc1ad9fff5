// ckpt-diff: prints what ops::Diff (ckpt/ops/diff.h) finds between two
// checkpoints, as text or one JSON document, and maps it to an exit code.
#ifndef CKPT_TOOLS_DIFF_DIFF_H_
#define CKPT_TOOLS_DIFF_DIFF_H_

#include <ostream>

#include "absl/status/statusor.h"
#include "ckpt/ops/diff.h"
#include "common/diff_report.h"

namespace ckpt::tools {

// The operation's report, as this tool prints it.
using ops::DiffNote;
using ops::DiffReport;
using ops::StructuralDiff;
using ops::Tolerance;
using ops::ValueDiff;

// What ckpt-diff runs: the operation's options, and whether to draw
// progress bars on stderr (only when it is a terminal).
struct DiffOptions : ops::DiffOptions {
  bool progress = true;
};

// ops::Diff, with progress bars when options.progress.
absl::StatusOr<DiffReport> Diff(const DiffOptions& options);

// What main() runs: Diff, then print; returns the exit code (0 equal,
// 1 different); errors are returned as a Status (exit code 2).
absl::StatusOr<int> RunDiff(const DiffOptions& options, bool json,
                            std::ostream& out);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_DIFF_DIFF_H_

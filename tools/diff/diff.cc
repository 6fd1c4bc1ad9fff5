#include "diff/diff.h"

#include "ckpt/format/status_macros.h"
#include "common/escaped_output.h"
#include "common/tool_util.h"

namespace ckpt::tools {
absl::StatusOr<DiffReport> Diff(const DiffOptions& options) {
  ops::DiffOptions o = options;
  ProgressBars bars([](absl::string_view) { return "ckpt-diff"; });
  if (options.progress) o.on_progress = bars.Callback();
  auto report = ops::Diff(o);
  bars.Finish();
  return report;
}

absl::StatusOr<int> RunDiff(const DiffOptions& options, bool json,
                            std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(DiffReport report, Diff(options));
  if (json) {
    out << JsonText(DiffToJson(report)) << "\n";
  } else {
    PrintDiffText(report, out);
  }
  return report.equal() ? kExitOk : kExitFindings;
}

}  // namespace ckpt::tools

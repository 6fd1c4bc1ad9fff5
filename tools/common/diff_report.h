// The report of ops::Diff (ckpt/ops/diff.h) as ckpt-diff prints it, and as
// ckpt-reshard --verify prints the comparison of its output with SRC.
#ifndef CKPT_TOOLS_COMMON_DIFF_REPORT_H_
#define CKPT_TOOLS_COMMON_DIFF_REPORT_H_

#include <ostream>

#include "ckpt/ops/diff.h"
#include "nlohmann/json.hpp"

namespace ckpt::tools {

// The human-readable report (format in tools/README.md (ckpt-diff)).
void PrintDiffText(const ops::DiffReport& report, std::ostream& out);
// The --json document (schema in tools/README.md (ckpt-diff)).
nlohmann::ordered_json DiffToJson(const ops::DiffReport& report);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_COMMON_DIFF_REPORT_H_

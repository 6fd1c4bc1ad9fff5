// ckpt-validate: prints what ops::Validate (ckpt/ops/validate.h) finds in a
// checkpoint, as text or one JSON document, and maps it to an exit code.
#ifndef CKPT_TOOLS_VALIDATE_VALIDATE_H_
#define CKPT_TOOLS_VALIDATE_VALIDATE_H_

#include <ostream>

#include "absl/status/statusor.h"
#include "ckpt/ops/validate.h"

namespace ckpt::tools {

// The operation and its report, as this tool prints them.
using ops::Finding;
using ops::FindingText;
using ops::Severity;
using ops::SeverityName;
using ops::Validate;
using ops::ValidateOptions;
using ops::ValidateReport;

// Human-readable report (what ckpt-validate prints).
void PrintValidateText(const ValidateReport& report, std::ostream& out);
// The --json document (schema in tools/README.md (ckpt-validate)), written
// one finding at a time.
void PrintValidateJson(const ValidateReport& report, std::ostream& out);

// Runs ckpt-validate: validates, prints the report (JSON if `json`) to
// `out`, and returns the exit code (kExitOk when valid, kExitFindings
// otherwise) or Validate's error.
absl::StatusOr<int> RunValidate(const ValidateOptions& options, bool json,
                                std::ostream& out);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_VALIDATE_VALIDATE_H_

// What ckpt-inspect and ckpt-validate print for foreign inputs (foreign.h
// dispatches here). The formats of the text and JSON are in tools/README.md.
#ifndef CKPT_TOOLS_INTEROP_FOREIGN_REPORT_H_
#define CKPT_TOOLS_INTEROP_FOREIGN_REPORT_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "inspect/inspect.h"

namespace ckpt::tools {

absl::StatusOr<int> InspectDcp(const InspectOptions& options,
                               std::ostream& out);
absl::StatusOr<int> InspectSafetensors(const InspectOptions& options,
                                       std::ostream& out);

struct ForeignValidation {
  std::string path;
  std::string
      format;  // "PyTorch DCP (torch.distributed.checkpoint.metadata)", ...
  std::string checked;  // what was checked, one line
  std::vector<std::string> errors, warnings;
};

// Every check of the format; problems are collected, never returned.
ForeignValidation ValidateDcp(const std::string& path);
ForeignValidation ValidateSafetensors(const std::string& path);

void PrintForeignValidation(const ForeignValidation& v, bool json,
                            std::ostream& out);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_INTEROP_FOREIGN_REPORT_H_

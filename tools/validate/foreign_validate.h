// ckpt-validate of foreign inputs (ckpt/interop/io/foreign.h): the checks of
// interop::ValidateDcp and interop::ValidateSafetensors, reported as
// ckpt-validate reports its own (formats in tools/README.md).
#ifndef CKPT_TOOLS_VALIDATE_FOREIGN_VALIDATE_H_
#define CKPT_TOOLS_VALIDATE_FOREIGN_VALIDATE_H_

#include <ostream>

#include "absl/status/statusor.h"
#include "ckpt/interop/io/foreign.h"
#include "validate/validate.h"

namespace ckpt::tools {

// The report of a foreign validation, as text or (json) one JSON document.
void PrintForeignValidation(const interop::ForeignValidation& v, bool json,
                            std::ostream& out);

// ckpt-validate of any input: a ckpt checkpoint, or anything unrecognized,
// goes to RunValidate unchanged; for a foreign input every check of its
// format, problems as findings (exit 1).
absl::StatusOr<int> RunValidateAnyFormat(const ValidateOptions& options,
                                         bool json, std::ostream& out);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_VALIDATE_FOREIGN_VALIDATE_H_

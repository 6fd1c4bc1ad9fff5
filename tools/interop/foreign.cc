#include "interop/foreign.h"

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "common/tool_util.h"
#include "inspect/inspect.h"
#include "interop/dcp_reader.h"
#include "interop/foreign_report.h"
#include "interop/safetensors_import.h"
#include "validate/validate.h"

namespace ckpt::tools {
namespace fs = std::filesystem;
namespace {

const char* FormatWord(InputFormat f) {
  return f == InputFormat::kDcp           ? "dcp"
         : f == InputFormat::kSafetensors ? "safetensors"
                                          : "ckpt";
}

}  // namespace

InputFormat DetectFormat(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (LooksLikeDcp(path)) return InputFormat::kDcp;
    if (fs::exists(fs::path(path) / "MANIFEST", ec) ||
        fs::exists(fs::path(path) / "latest", ec)) {
      return InputFormat::kCkpt;
    }
    return LooksLikeSafetensors(path) ? InputFormat::kSafetensors
                                      : InputFormat::kCkpt;
  }
  if (fs::is_regular_file(path, ec) && LooksLikeSafetensors(path))
    return InputFormat::kSafetensors;
  return InputFormat::kCkpt;
}

absl::StatusOr<int> RunInspectAnyFormat(const InspectOptions& o,
                                        std::ostream& out) {
  const InputFormat f = DetectFormat(o.path);
  if (f == InputFormat::kCkpt) return RunInspect(o, out);
  if (o.stats) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stats reads ckpt checkpoints; ", o.path, " is ", FormatWord(f),
        " (convert it with ckpt-convert --from ", FormatWord(f), " first)"));
  }
  return f == InputFormat::kDcp ? InspectDcp(o, out)
                                : InspectSafetensors(o, out);
}

absl::StatusOr<int> RunValidateAnyFormat(const ValidateOptions& o, bool json,
                                         std::ostream& out) {
  const InputFormat f = DetectFormat(o.path);
  if (f == InputFormat::kCkpt) return RunValidate(o, json, out);
  ForeignValidation v = f == InputFormat::kDcp ? ValidateDcp(o.path)
                                               : ValidateSafetensors(o.path);
  PrintForeignValidation(v, json, out);
  return v.errors.empty() ? kExitOk : kExitFindings;
}

}  // namespace ckpt::tools

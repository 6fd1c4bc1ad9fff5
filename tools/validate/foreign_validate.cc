#include "validate/foreign_validate.h"

#include "absl/strings/str_cat.h"
#include "common/escaped_output.h"
#include "common/json_writer.h"
#include "common/tool_util.h"
#include "nlohmann/json.hpp"

namespace ckpt::tools {
namespace {

std::string Plural(size_t n, const char* one, const char* many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

}  // namespace

void PrintForeignValidation(const interop::ForeignValidation& v, bool json,
                            std::ostream& out) {
  if (json) {
    nlohmann::ordered_json j;
    j["path"] = v.path;
    j["format"] = v.format;
    j["valid"] = v.errors.empty();
    j["checked"] = v.checked;
    JsonWriter w(out);
    w.BeginObject();
    w.Members(j);
    w.BeginArray("errors");
    for (const std::string& e : v.errors) w.Element(e);
    w.End();
    w.BeginArray("warnings");
    for (const std::string& x : v.warnings) w.Element(x);
    w.End();
    w.End();
    out << "\n";
    return;
  }
  out << "Format      " << EscapeText(v.format) << "\n";
  out << "Checked     " << v.checked << "\n";
  for (const auto& e : v.errors) out << "error: " << EscapeText(e) << "\n";
  for (const auto& w : v.warnings) out << "warning: " << EscapeText(w) << "\n";
  const size_t n = v.errors.size() + v.warnings.size();
  if (v.errors.empty()) {
    out << (v.warnings.empty()
                ? "VALID: no problems found\n"
                : absl::StrCat("VALID: ",
                               Plural(v.warnings.size(), "warning", "warnings"),
                               "\n"));
  } else {
    out << "INVALID: " << Plural(n, "problem", "problems") << " ("
        << Plural(v.errors.size(), "error", "errors") << ", "
        << Plural(v.warnings.size(), "warning", "warnings") << ")\n";
  }
}

absl::StatusOr<int> RunValidateAnyFormat(const ValidateOptions& o, bool json,
                                         std::ostream& out) {
  const interop::InputFormat f = interop::DetectFormat(o.path);
  if (f == interop::InputFormat::kCkpt) return RunValidate(o, json, out);
  const interop::ForeignValidation v =
      f == interop::InputFormat::kDcp ? interop::ValidateDcp(o.path)
                                      : interop::ValidateSafetensors(o.path);
  PrintForeignValidation(v, json, out);
  return v.errors.empty() ? kExitOk : kExitFindings;
}

}  // namespace ckpt::tools

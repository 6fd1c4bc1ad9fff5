#include "validate/validate.h"

#include "absl/strings/str_cat.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/status_macros.h"
#include "common/escaped_output.h"
#include "common/json_writer.h"
#include "common/tool_util.h"
#include "nlohmann/json.hpp"

namespace ckpt::tools {

void PrintValidateText(const ValidateReport& r, std::ostream& out) {
  if (!r.root.empty()) out << "Root        " << r.root << "\n";
  out << "Checkpoint  "
      << (r.checkpoint_dir.empty() ? "(none)" : r.checkpoint_dir) << "\n";
  if (r.manifest_ok) {
    out << "Step        " << r.info.step << "\n";
    out << "World size  " << r.info.world_size << "\n";
    out << "Entries     " << r.entries << " (" << r.chunks << " chunks, "
        << HumanBytes(r.payload_bytes) << " stored)\n";
    std::string checked =
        absl::StrCat("manifest, coverage of ", r.entries, " entries, ",
                     r.shards_ok, " of ", r.shards, " shard files");
    if (r.quick) {
      absl::StrAppend(&checked, "; payload not read (--quick)");
    } else {
      absl::StrAppend(&checked, ", ", r.blocks_verified, " blocks (",
                      HumanBytes(r.bytes_verified), ") read and verified");
      if (r.check_finite)
        absl::StrAppend(&checked, ", values checked for NaN/Inf");
    }
    out << "Checked     " << checked << "\n";
  }
  for (const Finding& f : r.findings) {
    out << SeverityName(f.severity) << ": " << FindingText(f) << "\n";
  }
  if (r.findings_dropped > 0) {
    out << "... and " << r.findings_dropped << " more problems not listed\n";
  }
  if (r.valid() && r.findings.empty()) {
    out << "VALID: no problems found\n";
  } else if (r.valid()) {
    out << "VALID: no errors (" << r.warnings()
        << (r.warnings() == 1 ? " warning" : " warnings") << ")\n";
  } else {
    const uint64_t total = r.findings.size() + r.findings_dropped;
    out << "INVALID: " << total << (total == 1 ? " problem" : " problems")
        << " (" << r.errors() << (r.errors() == 1 ? " error, " : " errors, ")
        << r.warnings() << (r.warnings() == 1 ? " warning" : " warnings")
        << (r.findings_dropped > 0 ? " listed" : "") << ")\n";
  }
}

namespace {

// The members of the --json document before "findings".
nlohmann::ordered_json ReportHeadJson(const ValidateReport& r) {
  using json = nlohmann::ordered_json;
  json j;
  j["valid"] = r.valid();
  j["root"] = r.root.empty() ? json(nullptr) : json(r.root);
  j["checkpoint"] =
      r.checkpoint_dir.empty() ? json(nullptr) : json(r.checkpoint_dir);
  if (r.manifest_ok) {
    j["format_version"] =
        absl::StrCat(format::kFormatMajor, ".", r.format_minor);
    j["step"] = r.info.step;
    j["world_size"] = r.info.world_size;
    j["checkpoint_id"] = format::IdToHex(r.info.id);
  } else {
    j["format_version"] = j["step"] = j["world_size"] = j["checkpoint_id"] =
        nullptr;
  }
  j["quick"] = r.quick;
  j["check_finite"] = r.check_finite;
  j["shards"] = r.shards;
  j["shards_ok"] = r.shards_ok;
  j["entries"] = r.entries;
  j["chunks"] = r.chunks;
  j["payload_bytes"] = r.payload_bytes;
  j["blocks_verified"] = r.blocks_verified;
  j["bytes_verified"] = r.bytes_verified;
  j["seconds"] = r.seconds;
  j["errors"] = r.errors();
  j["warnings"] = r.warnings();
  j["findings_dropped"] = r.findings_dropped;
  return j;
}

nlohmann::ordered_json FindingJson(const Finding& f) {
  using json = nlohmann::ordered_json;
  json x;
  x["severity"] = std::string(SeverityName(f.severity));
  x["file"] = f.file.empty() ? json(nullptr) : json(f.file);
  x["entry"] = f.entry.empty() ? json(nullptr) : json(f.entry);
  x["chunk"] = f.chunk < 0 ? json(nullptr) : json(f.chunk);
  x["region"] = f.region.empty() ? json(nullptr) : json(f.region);
  x["block"] = f.block < 0 ? json(nullptr) : json(f.block);
  x["message"] = f.message;
  x["text"] = FindingText(f);
  return x;
}

}  // namespace

// One finding at a time: with a large max_findings, the findings held
// whole as JSON took many times their own memory.
void PrintValidateJson(const ValidateReport& r, std::ostream& out) {
  JsonWriter w(out);
  w.BeginObject();
  w.Members(ReportHeadJson(r));
  w.BeginArray("findings");
  for (const Finding& f : r.findings) w.Element(FindingJson(f));
  w.End();
  w.End();
  out << "\n";
}

absl::StatusOr<int> RunValidate(const ValidateOptions& options, bool json,
                                std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(ValidateReport report, Validate(options));
  if (json) {
    PrintValidateJson(report, out);
  } else {
    PrintValidateText(report, out);
  }
  return report.valid() ? kExitOk : kExitFindings;
}

}  // namespace ckpt::tools

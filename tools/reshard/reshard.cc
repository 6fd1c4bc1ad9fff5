#include "reshard/reshard.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/format/status_macros.h"
#include "common/diff_report.h"
#include "common/escaped_output.h"
#include "common/tool_util.h"
#include "reshard/overrides.h"

namespace ckpt::tools {
namespace {

// The override file `path`, read through `storage` and parsed: the read's
// error, or ParseOverrides' prefixed by the path.
absl::StatusOr<Overrides> ReadOverridesFile(Storage* storage,
                                            const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(std::string text, storage->ReadFile(path));
  auto parsed = ParseOverrides(text);
  if (!parsed.ok()) return Annotate(parsed.status(), path);
  return *std::move(parsed);
}

}  // namespace

absl::StatusOr<ReshardReport> Reshard(const ReshardOptions& options) {
  ops::ReshardOptions o = options;
  if (!options.layout_file.empty()) {
    const std::string path = options.layout_file;
    o.overrides_source = path;
    o.read_overrides = [path](Storage* storage) {
      return ReadOverridesFile(storage, path);
    };
  }
  ProgressBars bars([](absl::string_view phase) {
    return phase == ops::kPhaseComparing ? "ckpt-diff" : "ckpt-reshard";
  });
  if (options.progress) o.on_progress = bars.Callback();
  auto report = ops::Reshard(o);
  bars.Finish();
  return report;
}

void PrintReshardText(const ReshardReport& r, bool verbose, std::ostream& out) {
  out << "resharded " << r.src_dir << " (step " << r.src_step << ", " << r.from
      << (r.from == 1 ? " rank" : " ranks") << ") into " << r.dst_dir
      << " (step " << r.step << ", " << r.to << (r.to == 1 ? " rank" : " ranks")
      << ")\n";
  std::map<std::string, int> counts;
  for (const ReshardedEntry& e : r.entries) {
    const std::string& l = e.layout;
    counts[l.rfind("dim", 0) == 0 ? "split along a dim" : l]++;
  }
  std::vector<std::string> parts;
  for (const char* k :
       {"split along a dim", "flat", "replicated", "partial", "object"}) {
    auto it = counts.find(k);
    if (it == counts.end()) continue;
    std::string label = it->first;
    if (label == "object" && it->second != 1) label = "objects";
    parts.push_back(absl::StrCat(it->second, " ", label));
  }
  out << "entries: " << r.entries.size() << " (" << absl::StrJoin(parts, ", ")
      << ")\n";
  if (verbose) {
    for (const ReshardedEntry& e : r.entries) {
      out << "  " << EscapeText(e.name) << ": ";
      if (e.object) {
        out << "object -> rank 0\n";
        continue;
      }
      out << DTypeName(e.dtype) << " " << ShapeText(e.shape) << ", " << e.source
          << " -> " << e.layout << (e.from_override ? " (override)" : "")
          << "\n";
    }
  }
  out << "wrote " << HumanBytes(r.tensor_bytes) << " of tensors and "
      << HumanBytes(r.object_bytes) << " of objects (codec " << r.codec
      << ")\n";
  if (r.verify) {
    if (r.verify->equal()) {
      out << "verify: equal to the source (" << r.verify->entries_compared
          << " entries, " << HumanBytes(r.verify->bytes_compared)
          << " compared)\n";
    } else {
      out << "verify: the output differs from the source:\n";
      PrintDiffText(*r.verify, out);
    }
  }
}

nlohmann::ordered_json ReshardToJson(const ReshardReport& r) {
  using J = nlohmann::ordered_json;
  J j;
  j["src"] = {
      {"path", r.src_dir}, {"step", r.src_step}, {"world_size", r.from}};
  j["dst"] = {{"path", r.dst_dir}, {"step", r.step}, {"world_size", r.to}};
  j["step"] = r.step;
  j["codec"] = r.codec;
  j["entries"] = J::array();
  for (const ReshardedEntry& e : r.entries) {
    J x{{"name", e.name}, {"kind", e.object ? "object" : "tensor"}};
    if (!e.object) {
      x["dtype"] = std::string(DTypeName(e.dtype));
      x["shape"] = J::array();
      for (uint64_t d : e.shape) x["shape"].push_back(d);
    }
    x["source"] = e.source;
    x["layout"] = e.layout;
    x["override"] = e.from_override;
    j["entries"].push_back(std::move(x));
  }
  j["tensor_bytes"] = r.tensor_bytes;
  j["object_bytes"] = r.object_bytes;
  j["stored_bytes"] = r.stored_bytes;
  j["largest_read"] = r.largest_read;
  j["seconds"] = r.seconds;
  j["verify"] = r.verify ? J(DiffToJson(*r.verify)) : J(nullptr);
  return j;
}

absl::StatusOr<int> RunReshard(const ReshardOptions& options, bool json,
                               bool verbose, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(ReshardReport report, Reshard(options));
  if (json) {
    out << JsonText(ReshardToJson(report)) << "\n";
  } else {
    PrintReshardText(report, verbose, out);
  }
  return report.verify && !report.verify->equal() ? kExitFindings : kExitOk;
}

}  // namespace ckpt::tools

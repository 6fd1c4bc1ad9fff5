#include "convert/convert.h"

#include <algorithm>
#include <memory>
#include <type_traits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/interop/hdf5/hdf5_export.h"
#include "ckpt/interop/hdf5/hdf5_import.h"
#include "common/escaped_output.h"
#include "common/tool_util.h"
#include "convert/convert_interop.h"
#include "nlohmann/json.hpp"

namespace ckpt::tools {
namespace {

using interop::ExportHdf5;
using interop::Hdf5Compression;
using interop::Hdf5ExportedEntry;
using interop::Hdf5ExportOptions;
using interop::Hdf5ExportResult;
using interop::Hdf5ImportOptions;
using interop::Hdf5ImportResult;
using interop::ImportHdf5;
using interop::ImportPlanEntry;
using interop::ImportSkipped;

constexpr char kHdf5[] = "hdf5";
constexpr char kSafetensors[] = "safetensors";
constexpr char kDcp[] = "dcp";
constexpr int kDefaultLevel = 4;

absl::Status CheckFormat(const std::string& format, const char* flag) {
  const bool to = flag == std::string("--to");
  if (format == kHdf5 || format == kSafetensors || (!to && format == kDcp)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown format '", format, "' for ", flag,
                   "; supported: hdf5, safetensors", to ? "" : ", dcp"));
}

absl::Status CheckOptions(const ConvertOptions& o, bool to) {
  if (to) {
    if (o.step.has_value()) return OnlyFor("--step", "--from hdf5");
    if (o.skip_unsupported) return OnlyFor("--skip-unsupported", "--from hdf5");
    if (!o.codec.empty()) return OnlyFor("--codec", "--from hdf5");
    if (!o.compression.empty() && o.compression != "none" &&
        o.compression != "deflate") {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown compression '", o.compression,
                       "' for --compression; supported: none, deflate"));
    }
    if (o.compression == "none" && o.level >= 0) {
      return absl::InvalidArgumentError("--level needs --compression deflate");
    }
    if (o.level > 9) {
      return absl::InvalidArgumentError(
          absl::StrCat("--level ", o.level, " is outside 0..9"));
    }
  } else {
    if (!o.compression.empty()) return OnlyFor("--compression", "--to hdf5");
    if (o.level >= 0) return OnlyFor("--level", "--to hdf5");
    CKPT_RETURN_IF_ERROR(CheckCodec(o));
  }
  return CheckThreads(o);
}

const char* KindName(format::EntryKind k) {
  return k == format::EntryKind::kObject ? "object" : "tensor";
}

std::string EntriesText(size_t tensors, size_t objects) {
  return absl::StrCat(tensors + objects,
                      tensors + objects == 1 ? " entry" : " entries", " (",
                      tensors, tensors == 1 ? " tensor, " : " tensors, ",
                      objects, objects == 1 ? " object)" : " objects)");
}

std::string KeysText(size_t n) {
  return absl::StrCat(n, n == 1 ? " metadata key" : " metadata keys");
}

// One verbose line: "  PATH  DTYPE  SHAPE" (objects: "object  N B").
void PrintEntryLine(std::ostream& out, size_t width, const std::string& path,
                    const std::string& name, format::EntryKind kind,
                    DType dtype, const Shape& shape, uint64_t bytes,
                    bool show_name) {
  std::string what =
      kind == format::EntryKind::kObject
          ? absl::StrFormat("%-13s  %s", "object", HumanBytes(bytes))
          : absl::StrFormat("%-13s  %s", DTypeName(dtype), ShapeText(shape));
  if (show_name) {
    out << absl::StrFormat("  %-*s  %-*s  %s\n", static_cast<int>(width),
                           EscapeText(path), static_cast<int>(width),
                           EscapeText(name), what);
  } else {
    out << absl::StrFormat("  %-*s  %s\n", static_cast<int>(width),
                           EscapeText(path), what);
  }
}

// The JSON of one converted entry; `chunk` only for exports.
template <typename Entry>
nlohmann::json EntryJson(const Entry& e) {
  nlohmann::json x;
  x["name"] = e.name;
  x["path"] = e.path;
  x["kind"] = KindName(e.kind);
  x["dtype"] = DTypeName(e.dtype);
  x["shape"] = std::vector<uint64_t>(e.shape.begin(), e.shape.end());
  if constexpr (std::is_same_v<Entry, Hdf5ExportedEntry>) {
    x["chunk"] = std::vector<uint64_t>(e.chunk.begin(), e.chunk.end());
  }
  x["bytes"] = e.bytes;
  return x;
}

// The --verbose lines of the converted entries.
template <typename Entry>
void PrintEntryLines(std::ostream& out, const std::vector<Entry>& entries,
                     bool imported) {
  size_t width = 0;
  for (const auto& e : entries) width = std::max(width, e.path.size());
  width = std::min<size_t>(width, 60);
  for (const auto& e : entries) {
    PrintEntryLine(out, width, e.path, e.name, e.kind, e.dtype, e.shape,
                   e.bytes, imported);
  }
}

template <typename Entry>
std::pair<size_t, size_t> CountKinds(const std::vector<Entry>& entries) {
  size_t tensors = 0, objects = 0;
  for (const Entry& e : entries) {
    (e.kind == format::EntryKind::kObject ? objects : tensors)++;
  }
  return {tensors, objects};
}

void PrintExportJson(const ConvertOptions& o, const Hdf5ExportOptions& eo,
                     const Hdf5ExportResult& r, std::ostream& out) {
  const auto [tensors, objects] = CountKinds(r.entries);
  const bool deflate = eo.compression == Hdf5Compression::kDeflate;
  nlohmann::json j;
  j["direction"] = "export";
  j["format"] = kHdf5;
  j["source"] = o.source;
  j["checkpoint"] = r.checkpoint_dir;
  j["output"] = r.output;
  j["step"] = r.info.step;
  j["world_size"] = r.info.world_size;
  j["checkpoint_id"] = format::IdToHex(r.info.id);
  j["compression"] = deflate ? "deflate" : "none";
  if (deflate) j["level"] = eo.level;
  j["tensors"] = tensors;
  j["objects"] = objects;
  j["metadata_keys"] = r.metadata_count;
  j["logical_bytes"] = r.logical_bytes;
  j["file_bytes"] = r.file_bytes;
  nlohmann::json entries = nlohmann::json::array();
  for (const Hdf5ExportedEntry& e : r.entries) entries.push_back(EntryJson(e));
  j["entries"] = std::move(entries);
  out << JsonText(j) << "\n";
}

void PrintExportText(const ConvertOptions& o, const Hdf5ExportOptions& eo,
                     const Hdf5ExportResult& r, std::ostream& out) {
  const auto [tensors, objects] = CountKinds(r.entries);
  const bool deflate = eo.compression == Hdf5Compression::kDeflate;
  out << "exported " << r.checkpoint_dir << " to " << r.output << "\n";
  if (o.verbose) PrintEntryLines(out, r.entries, false);
  out << "  step " << r.info.step << ", world size " << r.info.world_size
      << ", " << EntriesText(tensors, objects) << ", "
      << HumanBytes(r.logical_bytes) << ", " << KeysText(r.metadata_count)
      << "\n";
  out << "  hdf5: "
      << (deflate ? absl::StrCat("deflate level ", eo.level, " with shuffle")
                  : std::string("no compression"))
      << ", file " << HumanBytes(r.file_bytes) << "\n";
}

absl::StatusOr<int> RunExport(const ConvertOptions& o, std::ostream& out) {
  Hdf5ExportOptions eo;
  eo.compression = o.compression == "none" ? Hdf5Compression::kNone
                                           : Hdf5Compression::kDeflate;
  eo.level = o.level >= 0 ? o.level : kDefaultLevel;
  eo.overwrite = o.force;
  eo.storage = o.storage;
  if (o.threads > 0) {
    eo.io_threads = o.threads;
    eo.compress_threads = o.threads;
  }
  LazyProgress progress("export");
  eo.progress = progress.Callback();
  CKPT_ASSIGN_OR_RETURN(Hdf5ExportResult r,
                        ExportHdf5(o.source, o.destination, eo));
  progress.Finish();
  if (o.json) {
    PrintExportJson(o, eo, r, out);
  } else {
    PrintExportText(o, eo, r, out);
  }
  return kExitOk;
}

void PrintImportJson(const ConvertOptions& o, const Hdf5ImportResult& r,
                     std::ostream& out) {
  const auto [tensors, objects] = CountKinds(r.plan.entries);
  nlohmann::json j;
  j["direction"] = "import";
  j["format"] = kHdf5;
  j["input"] = r.input;
  j["root"] = o.destination;
  j["checkpoint"] = r.saved.path;
  j["step"] = r.step;
  j["tensors"] = tensors;
  j["objects"] = objects;
  j["metadata_keys"] = r.plan.metadata.size();
  j["logical_bytes"] = r.plan.logical_bytes;
  j["stored_bytes"] = r.saved.stored_bytes;
  nlohmann::json entries = nlohmann::json::array();
  for (const ImportPlanEntry& e : r.plan.entries)
    entries.push_back(EntryJson(e));
  j["entries"] = std::move(entries);
  nlohmann::json skipped = nlohmann::json::array();
  for (const ImportSkipped& s : r.plan.skipped) {
    skipped.push_back({{"what", s.what}, {"reason", s.reason}});
  }
  j["skipped"] = std::move(skipped);
  out << JsonText(j) << "\n";
}

void PrintImportText(const ConvertOptions& o, const Hdf5ImportResult& r,
                     std::ostream& out) {
  const auto [tensors, objects] = CountKinds(r.plan.entries);
  out << "imported " << r.input << " into " << r.saved.path << "\n";
  if (o.verbose) PrintEntryLines(out, r.plan.entries, true);
  out << "  step " << r.step << ", " << EntriesText(tensors, objects) << ", "
      << HumanBytes(r.plan.logical_bytes) << ", "
      << KeysText(r.plan.metadata.size()) << "\n";
  if (!r.plan.skipped.empty()) {
    out << "  skipped " << r.plan.skipped.size() << " (--skip-unsupported):\n";
    for (const ImportSkipped& s : r.plan.skipped)
      out << "    " << EscapeText(s.reason) << "\n";
  }
}

absl::StatusOr<int> RunImport(const ConvertOptions& o, std::ostream& out) {
  Hdf5ImportOptions io;
  io.plan.skip_unsupported = o.skip_unsupported;
  SetCommonImportOptions(o, &io);
  LazyProgress progress("import");
  io.progress = progress.Callback();
  CKPT_ASSIGN_OR_RETURN(Hdf5ImportResult r,
                        ImportHdf5(o.source, o.destination, io));
  progress.Finish();
  if (o.json) {
    PrintImportJson(o, r, out);
  } else {
    PrintImportText(o, r, out);
  }
  return kExitOk;
}

}  // namespace

absl::StatusOr<int> RunConvert(const ConvertOptions& o, std::ostream& out) {
  if (o.to.empty() == o.from.empty()) {
    return absl::InvalidArgumentError(
        o.to.empty() ? "give --to FORMAT (export a checkpoint) or --from "
                       "FORMAT (import a file)"
                     : "--to and --from exclude each other");
  }
  const bool to = !o.to.empty();
  CKPT_RETURN_IF_ERROR(to ? CheckFormat(o.to, "--to")
                          : CheckFormat(o.from, "--from"));
  const std::string& format = to ? o.to : o.from;
  // Only the checkpoint side goes through the storage; HDF5, safetensors
  // and DCP files are read and written on the local file system.
  const std::string& file = to ? o.destination : o.source;
  if (absl::StartsWith(file, "s3://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": the ", format,
        " side of a conversion must be a local path; s3:// is for the "
        "checkpoint (",
        to ? "SRC" : "DST", ")"));
  }
  if (format != kHdf5) {
    CKPT_RETURN_IF_ERROR(CheckInteropOptions(o));
    if (format == kDcp) return RunDcpImport(o, out);
    return to ? RunSafetensorsExport(o, out) : RunSafetensorsImport(o, out);
  }
  if (!o.max_shard_size.empty() || !o.include.empty() || !o.exclude.empty() ||
      o.ranks > 0) {
    return absl::InvalidArgumentError(
        "--max-shard-size, --include, --exclude and --ranks apply to "
        "safetensors and dcp only");
  }
  CKPT_RETURN_IF_ERROR(CheckOptions(o, to));
  return to ? RunExport(o, out) : RunImport(o, out);
}

}  // namespace ckpt::tools

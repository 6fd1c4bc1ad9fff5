#include "convert/convert_interop.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/interop/io/dcp_import.h"
#include "ckpt/interop/io/safetensors_export.h"
#include "ckpt/interop/io/safetensors_import.h"
#include "ckpt/interop/safetensors.h"
#include "common/escaped_output.h"
#include "common/tool_util.h"
#include "nlohmann/json.hpp"

namespace ckpt::tools {
namespace {

using interop::DcpImportOptions;
using interop::DcpImportResult;
using interop::ExportSafetensors;
using interop::ImportDcp;
using interop::ImportSafetensors;
using interop::SafetensorsExportOptions;
using interop::SafetensorsExportResult;
using interop::SafetensorsImportOptions;
using interop::SafetensorsImportResult;

std::string Plural(size_t n, const char* one, const char* many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

// The fields every entry of a --json report has, whichever the direction.
nlohmann::ordered_json EntryJson(const std::string& name, bool object,
                                 absl::string_view dtype, const Shape& shape) {
  return {{"name", name},
          {"kind", object ? "object" : "tensor"},
          {"dtype", std::string(dtype)},
          {"shape", std::vector<uint64_t>(shape.begin(), shape.end())}};
}

// Prints a --json report (ASCII; invalid UTF-8 in names replaced, never
// thrown).
void PrintJson(std::ostream& out, const nlohmann::ordered_json& j) {
  out << JsonText(j) << "\n";
}

}  // namespace

absl::Status CheckInteropOptions(const ConvertOptions& o) {
  const bool to = !o.to.empty();
  if (o.skip_unsupported) return OnlyFor("--skip-unsupported", "--from hdf5");
  if (!o.compression.empty()) return OnlyFor("--compression", "--to hdf5");
  if (o.level >= 0) return OnlyFor("--level", "--to hdf5");
  if (to) {
    if (o.step.has_value()) return OnlyFor("--step", "--from");
    if (!o.codec.empty()) return OnlyFor("--codec", "--from");
    if (o.ranks > 0) return OnlyFor("--ranks", "--from safetensors");
  } else {
    if (!o.max_shard_size.empty())
      return OnlyFor("--max-shard-size", "--to safetensors");
    if (!o.include.empty() || !o.exclude.empty()) {
      return OnlyFor("--include/--exclude", "--to safetensors");
    }
    if (o.from == "dcp" && o.ranks > 0)
      return OnlyFor("--ranks", "--from safetensors");
    CKPT_RETURN_IF_ERROR(CheckCodec(o));
  }
  return CheckThreads(o);
}

absl::Status OnlyFor(const char* flag, const char* mode) {
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " applies to ", mode, " only"));
}

absl::Status CheckCodec(const ConvertOptions& o) {
  if (!o.codec.empty() && o.codec != "none" && o.codec != "zstd") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown codec '", o.codec, "' for --codec; supported: none, zstd"));
  }
  return absl::OkStatus();
}

absl::Status CheckThreads(const ConvertOptions& o) {
  if (o.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads ", o.threads, " must be >= 1"));
  }
  return absl::OkStatus();
}

namespace {

// The --verbose lines: "  NAME  DTYPE  SHAPE  WHERE", names padded to the
// longest (at most 60 columns), the dtype column to `dtype_width`;
// cells(e) gives an entry's dtype and where-column.
template <typename Entry, typename Cells>
void PrintEntryLines(std::ostream& out, const std::vector<Entry>& entries,
                     int dtype_width, Cells cells) {
  size_t width = 0;
  for (const auto& e : entries)
    width = std::max(width, EscapeText(e.name).size());
  width = std::min<size_t>(width, 60);
  for (const auto& e : entries) {
    const auto [dtype, where] = cells(e);
    out << absl::StrFormat("  %-*s  %-*s  %-14s  %s\n", static_cast<int>(width),
                           EscapeText(e.name), dtype_width, dtype,
                           ShapeText(e.shape), where);
  }
}

// The dtype column of an imported entry.
template <typename Entry>
std::string ImportedDType(const Entry& e) {
  return e.object ? "object" : std::string(DTypeName(e.dtype));
}

// Objects among imported entries.
template <typename Entry>
size_t CountObjects(const std::vector<Entry>& entries) {
  size_t objects = 0;
  for (const auto& e : entries) objects += e.object;
  return objects;
}

// --to safetensors: the options of the flags.
absl::StatusOr<SafetensorsExportOptions> SafetensorsExportOptionsFor(
    const ConvertOptions& o) {
  SafetensorsExportOptions eo;
  if (!o.max_shard_size.empty()) {
    CKPT_ASSIGN_OR_RETURN(eo.max_shard_bytes,
                          interop::ParseByteSize(o.max_shard_size));
  }
  eo.include = o.include;
  eo.exclude = o.exclude;
  eo.overwrite = o.force;
  if (o.threads > 0) eo.io_threads = o.threads;
  eo.storage = o.storage;
  return eo;
}

size_t CountExportedObjects(const SafetensorsExportResult& r) {
  size_t objects = 0;
  for (const auto& e : r.entries)
    objects += e.kind == format::EntryKind::kObject;
  return objects;
}

void PrintSafetensorsExportJson(const ConvertOptions& o,
                                const SafetensorsExportOptions& eo,
                                const SafetensorsExportResult& r,
                                std::ostream& out) {
  const size_t objects = CountExportedObjects(r);
  nlohmann::ordered_json j;
  j["direction"] = "export";
  j["format"] = "safetensors";
  j["source"] = o.source;
  j["checkpoint"] = r.checkpoint_dir;
  j["output"] = r.output;
  j["sharded"] = eo.max_shard_bytes > 0;
  j["max_shard_bytes"] = eo.max_shard_bytes;
  j["step"] = r.info.step;
  j["world_size"] = r.info.world_size;
  j["tensors"] = r.entries.size() - objects;
  j["objects"] = objects;
  j["excluded"] = r.excluded;
  j["metadata_keys"] = r.metadata_count;
  j["total_size"] = r.total_size;
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const auto& [name, size] : r.files)
    files.push_back({{"name", name}, {"bytes", size}});
  j["files"] = std::move(files);
  nlohmann::ordered_json entries = nlohmann::ordered_json::array();
  for (const auto& e : r.entries) {
    nlohmann::ordered_json x =
        EntryJson(e.name, e.kind == format::EntryKind::kObject,
                  interop::SafetensorsDTypeName(e.dtype), e.shape);
    x["file"] = e.file;
    x["bytes"] = e.bytes;
    entries.push_back(std::move(x));
  }
  j["entries"] = std::move(entries);
  PrintJson(out, j);
}

void PrintSafetensorsExportText(const ConvertOptions& o,
                                const SafetensorsExportOptions& eo,
                                const SafetensorsExportResult& r,
                                std::ostream& out) {
  const size_t objects = CountExportedObjects(r);
  const size_t tensors = r.entries.size() - objects;
  out << "exported " << r.checkpoint_dir << " to " << r.output << "\n";
  if (o.verbose) {
    PrintEntryLines(out, r.entries, 7, [](const auto& e) {
      return std::make_pair(std::string(interop::SafetensorsDTypeName(e.dtype)),
                            e.file);
    });
  }
  out << "  step " << r.info.step << ", world size " << r.info.world_size
      << ", " << Plural(tensors + objects, "entry", "entries") << " ("
      << Plural(tensors, "tensor", "tensors") << ", "
      << Plural(objects, "object", "objects") << " as U8), "
      << HumanBytes(r.total_size) << ", "
      << Plural(r.metadata_count, "metadata key", "metadata keys");
  if (r.excluded > 0) out << ", " << r.excluded << " excluded";
  out << "\n";
  if (eo.max_shard_bytes > 0) {
    out << "  safetensors: " << Plural(r.files.size(), "shard", "shards")
        << " of at most " << HumanBytes(eo.max_shard_bytes) << " and "
        << interop::kHfIndexName << "\n";
  } else {
    out << "  safetensors: one file\n";
  }
}

void PrintSafetensorsImportJson(const ConvertOptions& o,
                                const SafetensorsImportResult& r,
                                std::ostream& out) {
  const size_t objects = CountObjects(r.entries);
  nlohmann::ordered_json j;
  j["direction"] = "import";
  j["format"] = "safetensors";
  j["input"] = r.input;
  j["root"] = o.destination;
  j["checkpoint"] = r.checkpoint;
  j["step"] = r.step;
  j["ranks"] = r.ranks;
  j["files"] = r.files;
  j["tensors"] = r.entries.size() - objects;
  j["objects"] = objects;
  j["metadata_keys"] = r.metadata_keys;
  j["logical_bytes"] = r.logical_bytes;
  nlohmann::ordered_json entries = nlohmann::ordered_json::array();
  for (const auto& e : r.entries) {
    nlohmann::ordered_json x =
        EntryJson(e.name, e.object, DTypeName(e.dtype), e.shape);
    x["file"] = e.file;
    x["bytes"] = e.bytes;
    entries.push_back(std::move(x));
  }
  j["entries"] = std::move(entries);
  PrintJson(out, j);
}

void PrintSafetensorsImportText(const ConvertOptions& o,
                                const SafetensorsImportResult& r,
                                std::ostream& out) {
  const size_t objects = CountObjects(r.entries);
  const size_t tensors = r.entries.size() - objects;
  out << "imported " << r.input << " into " << r.checkpoint << "\n";
  if (o.verbose) {
    PrintEntryLines(out, r.entries, 13, [](const auto& e) {
      return std::make_pair(ImportedDType(e), e.file);
    });
  }
  out << "  step " << r.step << ", " << Plural(r.ranks, "rank", "ranks") << ", "
      << Plural(tensors + objects, "entry", "entries") << " ("
      << Plural(tensors, "tensor", "tensors") << ", "
      << Plural(objects, "object", "objects") << ") from "
      << Plural(r.files, "file", "files") << ", " << HumanBytes(r.logical_bytes)
      << ", " << Plural(r.metadata_keys, "metadata key", "metadata keys")
      << "\n";
}

// Chunks of the imported tensors.
size_t CountChunks(const DcpImportResult& r) {
  size_t chunks = 0;
  for (const auto& e : r.entries) {
    if (!e.object) chunks += e.chunks;
  }
  return chunks;
}

void PrintDcpImportJson(const ConvertOptions& o, const DcpImportResult& r,
                        std::ostream& out) {
  const size_t objects = CountObjects(r.entries);
  nlohmann::ordered_json j;
  j["direction"] = "import";
  j["format"] = "dcp";
  j["detected"] = r.format;
  j["module"] = r.module;
  j["input"] = r.input;
  j["root"] = o.destination;
  j["checkpoint"] = r.checkpoint;
  j["step"] = r.step;
  j["world_size"] = r.world_size;
  j["tensors"] = r.entries.size() - objects;
  j["objects"] = objects;
  j["chunks"] = CountChunks(r);
  j["metadata_keys"] = r.metadata_keys;
  j["logical_bytes"] = r.logical_bytes;
  nlohmann::ordered_json entries = nlohmann::ordered_json::array();
  for (const auto& e : r.entries) {
    nlohmann::ordered_json x =
        EntryJson(e.name, e.object, DTypeName(e.dtype), e.shape);
    x["chunks"] = e.chunks;
    x["bytes"] = e.bytes;
    entries.push_back(std::move(x));
  }
  j["entries"] = std::move(entries);
  PrintJson(out, j);
}

void PrintDcpImportText(const ConvertOptions& o, const DcpImportResult& r,
                        std::ostream& out) {
  const size_t objects = CountObjects(r.entries);
  const size_t tensors = r.entries.size() - objects;
  out << "imported " << r.input << " (" << r.format << ", "
      << EscapeText(r.module) << ") into " << r.checkpoint << "\n";
  if (o.verbose) {
    PrintEntryLines(out, r.entries, 13, [](const auto& e) {
      return std::make_pair(ImportedDType(e),
                            Plural(e.chunks, "chunk", "chunks"));
    });
  }
  out << "  step " << r.step << ", " << Plural(r.world_size, "rank", "ranks")
      << " (as saved), " << Plural(tensors + objects, "entry", "entries")
      << " (" << Plural(tensors, "tensor", "tensors") << " in "
      << Plural(CountChunks(r), "chunk", "chunks") << ", "
      << Plural(objects, "object", "objects") << "), "
      << HumanBytes(r.logical_bytes) << ", "
      << Plural(r.metadata_keys, "metadata key", "metadata keys") << "\n";
}

}  // namespace

absl::StatusOr<int> RunSafetensorsExport(const ConvertOptions& o,
                                         std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(SafetensorsExportOptions eo,
                        SafetensorsExportOptionsFor(o));
  LazyProgress progress("export");
  eo.progress = progress.Callback();
  CKPT_ASSIGN_OR_RETURN(SafetensorsExportResult r,
                        ExportSafetensors(o.source, o.destination, eo));
  progress.Finish();
  if (o.json) {
    PrintSafetensorsExportJson(o, eo, r, out);
  } else {
    PrintSafetensorsExportText(o, eo, r, out);
  }
  return kExitOk;
}

absl::StatusOr<int> RunSafetensorsImport(const ConvertOptions& o,
                                         std::ostream& out) {
  SafetensorsImportOptions io;
  SetCommonImportOptions(o, &io);
  io.ranks = o.ranks > 0 ? o.ranks : 1;
  LazyProgress progress("import");
  io.progress = progress.Callback();
  CKPT_ASSIGN_OR_RETURN(SafetensorsImportResult r,
                        ImportSafetensors(o.source, o.destination, io));
  progress.Finish();
  if (o.json) {
    PrintSafetensorsImportJson(o, r, out);
  } else {
    PrintSafetensorsImportText(o, r, out);
  }
  return kExitOk;
}

absl::StatusOr<int> RunDcpImport(const ConvertOptions& o, std::ostream& out) {
  DcpImportOptions io;
  SetCommonImportOptions(o, &io);
  LazyProgress progress("import");
  io.progress = progress.Callback();
  CKPT_ASSIGN_OR_RETURN(DcpImportResult r,
                        ImportDcp(o.source, o.destination, io));
  progress.Finish();
  if (o.json) {
    PrintDcpImportJson(o, r, out);
  } else {
    PrintDcpImportText(o, r, out);
  }
  return kExitOk;
}

}  // namespace ckpt::tools

#include "inspect/foreign_inspect.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/format/geometry.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/interop/io/dcp_reader.h"
#include "ckpt/interop/io/foreign.h"
#include "ckpt/interop/io/safetensors_import.h"
#include "ckpt/interop/safetensors.h"
#include "common/escaped_output.h"
#include "common/json_writer.h"
#include "common/tool_util.h"
#include "nlohmann/json.hpp"

namespace ckpt::tools {
namespace fs = std::filesystem;
namespace {

using interop::DcpFormatName;
using interop::DcpInput;
using interop::DescribeTorchRecord;
using interop::InputFormat;
using interop::OpenDcp;
using interop::OpenSafetensors;
using interop::ReadDcpBytes;
using interop::SafetensorsFormatName;
using interop::SafetensorsInput;

std::string Plural(size_t n, const char* one, const char* many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

// One row of the entry table; `name`, `dtype` and `where` come from the
// file and are shown through EscapeText.
void PrintRow(std::ostream& out, size_t w, const std::string& name,
              const std::string& dtype, const std::string& shape,
              const std::string& chunks, const std::string& size,
              const std::string& where) {
  std::string line =
      absl::StrFormat("%-*s  %-13s  %-12s  %-6s  %-9s  %s", static_cast<int>(w),
                      EscapeText(name), EscapeText(dtype), shape, chunks, size,
                      EscapeText(where));
  line.erase(line.find_last_not_of(' ') + 1);
  out << line << "\n";
}

absl::StatusOr<int> InspectDcpEntry(const DcpInput& in,
                                    const std::string& entry,
                                    std::ostream& out) {
  for (const interop::DcpTensor& t : in.meta.tensors) {
    if (t.fqn != entry) continue;
    out << "Entry   " << EscapeText(t.fqn) << "\nDType   " << DTypeName(t.dtype)
        << " (" << EscapeText(t.dtype_name) << ")\nShape   "
        << ShapeText(t.size) << "\nChunks  " << t.chunks.size() << "\n\n";
    out << absl::StrFormat("%-5s  %-20s  %-20s  %s\n", "CHUNK", "OFFSETS",
                           "SIZES", "STORED AT");
    for (size_t i = 0; i < t.chunks.size(); ++i) {
      const interop::DcpStorage* s = in.chunk_storage.at(t.fqn)[i];
      out << absl::StrFormat(
          "%-5d  %-20s  %-20s  %s [%d, %d)\n", i,
          ShapeText(t.chunks[i].offsets), ShapeText(t.chunks[i].sizes),
          EscapeText(s->relative_path), s->offset, s->offset + s->length);
    }
    return kExitOk;
  }
  return absl::NotFoundError(absl::StrCat(in.dir, ": no tensor '", entry, "'"));
}

// What the DCP input holds, as both the text and the JSON report say it.
struct DcpSummary {
  size_t chunks = 0;
  uint64_t file_bytes = 0;
  std::string common;  // common.pt described; empty without one
};

absl::StatusOr<DcpSummary> SummarizeDcp(const DcpInput& in) {
  DcpSummary s;
  for (const auto& t : in.meta.tensors) s.chunks += t.chunks.size();
  for (const auto& [_, f] : in.files) s.file_bytes += f->size();
  if (in.common != nullptr) {
    CKPT_ASSIGN_OR_RETURN(std::string bytes,
                          in.common->Read(0, in.common->size()));
    s.common = DescribeTorchRecord(bytes);
  }
  return s;
}

// A bytes item's value described, or why it cannot be read.
std::string DescribeBytesItem(const DcpInput& in, const std::string& fqn) {
  absl::StatusOr<std::string> bytes = ReadDcpBytes(in, fqn);
  return bytes.ok() ? DescribeTorchRecord(*bytes)
                    : std::string(bytes.status().message());
}

void InspectDcpJson(const InspectOptions& o, const DcpInput& in,
                    const DcpSummary& s, std::ostream& out) {
  nlohmann::ordered_json j;
  j["path"] = o.path;
  j["format"] = "dcp";
  j["detected"] = DcpFormatName(in);
  j["module"] = in.meta.module;
  j["version"] = in.meta.version;
  j["storage_meta"] = in.meta.has_storage_meta;
  j["world_size"] = in.world_size;
  j["data_files"] = in.files.size();
  j["data_bytes"] = s.file_bytes;
  j["tensor_bytes"] = in.tensor_bytes;
  if (in.meta.all_local_plans) j["all_local_plans"] = *in.meta.all_local_plans;
  if (in.megatron) {
    j["megatron_metadata"] =
        nlohmann::json::parse(in.megatron_json, nullptr, false);
    j["common_state"] = s.common;
  }
  JsonWriter w(out);
  w.BeginObject();
  w.Members(j);
  w.BeginArray("entries");
  for (const auto& t : in.meta.tensors) {
    w.Element({{"name", t.fqn},
               {"kind", "tensor"},
               {"dtype", std::string(DTypeName(t.dtype))},
               {"shape", std::vector<uint64_t>(t.size.begin(), t.size.end())},
               {"chunks", t.chunks.size()}});
  }
  for (const auto& b : in.meta.bytes_items) {
    nlohmann::ordered_json e = {{"name", b}, {"kind", "bytes"}};
    if (const std::string& name = in.object_names.at(b); name != b)
      e["converted_name"] = name;
    e["bytes"] = in.bytes_storage.at(b)->length;
    e["value"] = DescribeBytesItem(in, b);
    w.Element(e);
  }
  w.End();
  w.End();
  out << "\n";
}

// The bytes items whose ckpt object name differs (Megatron ShardedObjects).
void PrintConvertedNames(const DcpInput& in, std::ostream& out) {
  bool first = true;
  for (const auto& [fqn, name] : in.object_names) {
    if (fqn == name) continue;
    if (first) {
      out << "\nRenamed by ckpt-convert --from dcp (a ckpt entry name holds "
             "no '/')\n";
    }
    first = false;
    out << "  " << EscapeText(fqn) << " -> " << EscapeText(name) << "\n";
  }
}

void InspectDcpText(const InspectOptions& o, const DcpInput& in,
                    const DcpSummary& s, std::ostream& out) {
  out << "Path          " << o.path << "\n";
  out << "Format        " << DcpFormatName(in) << "\n";
  out << "DCP version   "
      << (in.meta.version.empty() ? "(none: written before PyTorch 2.4)"
                                  : EscapeText(in.meta.version))
      << "\n";
  out << "World size    " << in.world_size
      << (in.meta.rank_local_files > 0
              ? " (from the data and metadata file names)\n"
              : " (from the data file names)\n");
  out << "Data files    " << in.files.size() << " (" << HumanBytes(s.file_bytes)
      << ")\n";
  out << "Entries       " << in.meta.tensors.size() + in.meta.bytes_items.size()
      << " (" << Plural(in.meta.tensors.size(), "tensor", "tensors") << " in "
      << Plural(s.chunks, "chunk", "chunks") << ", "
      << Plural(in.meta.bytes_items.size(), "bytes item", "bytes items")
      << ")\n";
  out << "Tensor size   " << HumanBytes(in.tensor_bytes) << " ("
      << in.tensor_bytes << " bytes)\n";
  if (in.meta.all_local_plans) {
    out << "Local plans   " << *in.meta.all_local_plans
        << " (all_local_plans: each rank's SavePlan; not needed to read the "
           "checkpoint)\n";
  }
  if (in.megatron) {
    out << "Megatron      metadata.json "
        << JsonText(nlohmann::json::parse(in.megatron_json, nullptr, false), -1)
        << "\n";
    out << "Common state  "
        << (in.common == nullptr ? "(no common.pt)"
                                 : "common.pt: " + EscapeText(s.common))
        << "\n";
  }
  size_t w = 4;
  for (const auto& t : in.meta.tensors)
    w = std::max(w, EscapeText(t.fqn).size());
  for (const auto& b : in.meta.bytes_items)
    w = std::max(w, EscapeText(b).size());
  w = std::min<size_t>(w, 48);
  out << "\n";
  PrintRow(out, w, "NAME", "DTYPE", "SHAPE", "CHUNKS", "SIZE", "VALUE");
  for (const auto& t : in.meta.tensors) {
    uint64_t n = DTypeSize(t.dtype);
    for (uint64_t d : t.size) n *= d;
    PrintRow(out, w, t.fqn, std::string(DTypeName(t.dtype)), ShapeText(t.size),
             std::to_string(t.chunks.size()), HumanBytes(n), "");
  }
  for (const auto& b : in.meta.bytes_items) {
    PrintRow(out, w, b, "bytes", "", "1",
             HumanBytes(in.bytes_storage.at(b)->length),
             DescribeBytesItem(in, b));
  }
  PrintConvertedNames(in, out);
}

}  // namespace

absl::StatusOr<int> InspectDcp(const InspectOptions& o, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<DcpInput> in, OpenDcp(o.path));
  if (!o.entry.empty()) return InspectDcpEntry(*in, o.entry, out);
  CKPT_ASSIGN_OR_RETURN(DcpSummary summary, SummarizeDcp(*in));
  if (o.json) {
    InspectDcpJson(o, *in, summary, out);
  } else {
    InspectDcpText(o, *in, summary, out);
  }
  return kExitOk;
}

namespace {

// The facts of a safetensors input both reports print.
struct SafetensorsSummary {
  uint64_t tensor_bytes = 0, file_bytes = 0;
  std::string format;  // as detected
};

SafetensorsSummary SummarizeSafetensors(const SafetensorsInput& in) {
  SafetensorsSummary s;
  for (const auto& r : in.tensors)
    s.tensor_bytes += r.tensor->end - r.tensor->begin;
  for (const auto& f : in.files) s.file_bytes += f.size();
  s.format = SafetensorsFormatName(in);
  return s;
}

std::string FileName(const SafetensorsInput& in, size_t file) {
  return fs::path(in.files[file].path()).filename().string();
}

absl::StatusOr<int> InspectSafetensorsEntry(const SafetensorsInput& in,
                                            const InspectOptions& o,
                                            std::ostream& out) {
  for (const auto& r : in.tensors) {
    if (r.name != o.entry) continue;
    out << "Entry   " << EscapeText(r.name) << "\nDType   "
        << DTypeName(r.tensor->dtype) << " ("
        << interop::SafetensorsDTypeName(r.tensor->dtype) << ")\nShape   "
        << ShapeText(r.tensor->shape) << "\nFile    " << in.files[r.file].path()
        << "\nBytes   [" << in.headers[r.file].data_offset + r.tensor->begin
        << ", " << in.headers[r.file].data_offset + r.tensor->end << ")\n";
    return kExitOk;
  }
  return absl::NotFoundError(
      absl::StrCat(o.path, ": no tensor '", o.entry, "'"));
}

void InspectSafetensorsJson(const InspectOptions& o, const SafetensorsInput& in,
                            const SafetensorsSummary& s, std::ostream& out) {
  nlohmann::ordered_json j;
  j["path"] = o.path;
  j["format"] = "safetensors";
  j["detected"] = s.format;
  j["files"] = in.files.size();
  j["file_bytes"] = s.file_bytes;
  j["tensor_bytes"] = s.tensor_bytes;
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto& [k, v] : in.metadata) meta[k] = v;
  j["metadata"] = std::move(meta);
  JsonWriter w(out);
  w.BeginObject();
  w.Members(j);
  w.BeginArray("entries");
  for (const auto& r : in.tensors) {
    w.Element(
        {{"name", r.name},
         {"dtype", std::string(interop::SafetensorsDTypeName(r.tensor->dtype))},
         {"shape", std::vector<uint64_t>(r.tensor->shape.begin(),
                                         r.tensor->shape.end())},
         {"file", FileName(in, r.file)},
         {"bytes", r.tensor->end - r.tensor->begin}});
  }
  w.End();
  w.End();
  out << "\n";
}

void InspectSafetensorsText(const InspectOptions& o, const SafetensorsInput& in,
                            const SafetensorsSummary& s, std::ostream& out) {
  out << "Path          " << o.path << "\n";
  out << "Format        " << s.format << "\n";
  out << "Files         " << in.files.size() << " (" << HumanBytes(s.file_bytes)
      << ")\n";
  out << "Entries       " << Plural(in.tensors.size(), "tensor", "tensors")
      << "\n";
  out << "Tensor size   " << HumanBytes(s.tensor_bytes) << " ("
      << s.tensor_bytes << " bytes)\n";
  for (size_t i = 0; i < in.metadata.size(); ++i) {
    std::string v = in.metadata[i].second;
    if (v.size() > 60) v = v.substr(0, 57) + "...";
    out << (i == 0 ? "Metadata      " : "              ")
        << EscapeText(in.metadata[i].first) << " = " << EscapeText(v) << "\n";
  }
  size_t w = 4;
  for (const auto& r : in.tensors) w = std::max(w, EscapeText(r.name).size());
  w = std::min<size_t>(w, 48);
  out << "\n";
  PrintRow(out, w, "NAME", "DTYPE", "SHAPE", "", "SIZE", "FILE");
  for (const auto& r : in.tensors) {
    PrintRow(out, w, r.name,
             std::string(interop::SafetensorsDTypeName(r.tensor->dtype)),
             ShapeText(r.tensor->shape), "",
             HumanBytes(r.tensor->end - r.tensor->begin), FileName(in, r.file));
  }
}

}  // namespace

absl::StatusOr<int> InspectSafetensors(const InspectOptions& o,
                                       std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(SafetensorsInput in, OpenSafetensors(o.path));
  if (!o.entry.empty()) return InspectSafetensorsEntry(in, o, out);
  const SafetensorsSummary summary = SummarizeSafetensors(in);
  if (o.json) {
    InspectSafetensorsJson(o, in, summary, out);
  } else {
    InspectSafetensorsText(o, in, summary, out);
  }
  return kExitOk;
}

absl::StatusOr<int> RunInspectAnyFormat(const InspectOptions& o,
                                        std::ostream& out) {
  const InputFormat f = interop::DetectFormat(o.path);
  if (f == InputFormat::kCkpt) return RunInspect(o, out);
  if (o.stats) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stats reads ckpt checkpoints; ", o.path, " is ",
                     interop::FormatWord(f),
                     " (convert it with ckpt-convert "
                     "--from ",
                     interop::FormatWord(f), " first)"));
  }
  return f == InputFormat::kDcp ? InspectDcp(o, out)
                                : InspectSafetensors(o, out);
}

}  // namespace ckpt::tools

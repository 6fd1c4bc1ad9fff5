#include "ckpt/interop/safetensors.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <set>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/geometry.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/interop/strict_json.h"

namespace ckpt::interop {
namespace {

struct DTypeNamePair {
  DType dtype;
  const char* name;
};
constexpr DTypeNamePair kNames[] = {
    {DType::kBool, "BOOL"},         {DType::kUInt8, "U8"},
    {DType::kInt8, "I8"},           {DType::kUInt16, "U16"},
    {DType::kInt16, "I16"},         {DType::kUInt32, "U32"},
    {DType::kInt32, "I32"},         {DType::kUInt64, "U64"},
    {DType::kInt64, "I64"},         {DType::kFloat16, "F16"},
    {DType::kBFloat16, "BF16"},     {DType::kFloat32, "F32"},
    {DType::kFloat64, "F64"},       {DType::kFloat8E4M3FN, "F8_E4M3"},
    {DType::kFloat8E5M2, "F8_E5M2"}};
// Valid in the reference implementation, without a ckpt dtype.
// safetensors 0.8.0's Dtype enum less the above.
constexpr const char* kForeignOnly[] = {
    "F4", "F6_E2M3", "F6_E3M2", "F8_E8M0", "C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ"};

absl::Status Bad(absl::string_view what) { return absl::DataLossError(what); }

absl::StatusOr<uint64_t> Unsigned(const nlohmann::json& v,
                                  absl::string_view what) {
  if (!v.is_number_unsigned()) {
    return Bad(absl::StrCat(
        what, " is not a non-negative integer: ",
        v.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace)));
  }
  return v.get<uint64_t>();
}

absl::StatusOr<SafetensorsTensor> DecodeTensor(const std::string& name,
                                               const nlohmann::json& v) {
  const std::string where =
      absl::StrCat("tensor '", format::EscapeText(name), "'");
  if (!v.is_object()) return Bad(absl::StrCat(where, ": not a JSON object"));
  // Other fields are ignored, as the reference implementation does.
  if (!v.contains("dtype") || !v["dtype"].is_string()) {
    return Bad(absl::StrCat(where, ": dtype missing or not a string"));
  }
  SafetensorsTensor t;
  t.name = name;
  auto dtype = DTypeFromSafetensors(v["dtype"].get<std::string>());
  if (!dtype.ok()) {
    return absl::Status(dtype.status().code(),
                        absl::StrCat(where, ": ", dtype.status().message()));
  }
  t.dtype = *dtype;
  if (!v.contains("shape") || !v["shape"].is_array()) {
    return Bad(absl::StrCat(where, ": shape missing or not an array"));
  }
  if (v["shape"].size() > format::kMaxDims) {
    return Bad(absl::StrCat(where, ": shape has ", v["shape"].size(),
                            " dims; the limit is ", format::kMaxDims));
  }
  for (const auto& d : v["shape"]) {
    CKPT_ASSIGN_OR_RETURN(uint64_t n,
                          Unsigned(d, absl::StrCat(where, ": a dim")));
    t.shape.push_back(n);
  }
  // As ckpt's own shapes: every dim, the element and the byte count in
  // int64 (a zero dim beside a dim of 2^64 - 1 passes the byte count).
  if (absl::Status s = ValidateShape(t.shape, DTypeSize(t.dtype)); !s.ok()) {
    return Bad(absl::StrCat(where, ": ", s.message()));
  }
  const auto& off =
      v.contains("data_offsets") ? v["data_offsets"] : nlohmann::json();
  if (!off.is_array() || off.size() != 2) {
    return Bad(
        absl::StrCat(where, ": data_offsets missing or not [begin, end]"));
  }
  CKPT_ASSIGN_OR_RETURN(t.begin,
                        Unsigned(off[0], absl::StrCat(where, ": begin")));
  CKPT_ASSIGN_OR_RETURN(t.end, Unsigned(off[1], absl::StrCat(where, ": end")));
  return t;
}

// The reference's checks on the offsets (contiguous from 0, covering
// `data_size`) and on each tensor's byte count.
absl::Status ValidateOffsets(const std::vector<SafetensorsTensor>& tensors,
                             uint64_t data_size) {
  uint64_t expected_begin = 0;
  for (const SafetensorsTensor& t : tensors) {
    if (t.begin != expected_begin || t.end < t.begin) {
      return Bad(absl::StrFormat(
          "tensor '%s': data_offsets [%d, %d] are not "
          "contiguous (expected begin %d)",
          format::EscapeText(t.name), t.begin, t.end, expected_begin));
    }
    uint64_t bytes = DTypeSize(t.dtype);
    for (uint64_t d : t.shape) {
      if (d != 0 && bytes > UINT64_MAX / d) {
        return Bad(absl::StrCat("tensor '", format::EscapeText(t.name),
                                "': byte count of shape overflows"));
      }
      bytes *= d;
    }
    if (bytes != t.end - t.begin) {
      return Bad(absl::StrFormat(
          "tensor '%s': %d bytes in data_offsets [%d, %d] != %d bytes "
          "of its shape and dtype",
          format::EscapeText(t.name), t.end - t.begin, t.begin, t.end, bytes));
    }
    expected_begin = t.end;
  }
  if (expected_begin != data_size) {
    return Bad(absl::StrFormat(
        "tensors cover %d bytes of the data, which holds %d bytes",
        expected_begin, data_size));
  }
  return absl::OkStatus();
}

absl::Status DecodeMetadata(const nlohmann::json& v, SafetensorsHeader& h) {
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_object()) return Bad("__metadata__ is not a JSON object");
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string()) {
      return Bad(absl::StrCat("__metadata__ value of '",
                              format::EscapeText(key), "' is not a string"));
    }
    h.metadata.emplace_back(key, value.get<std::string>());
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view SafetensorsDTypeName(DType dtype) {
  for (const auto& p : kNames) {
    if (p.dtype == dtype) return p.name;
  }
  return "?";
}

absl::StatusOr<DType> DTypeFromSafetensors(absl::string_view name) {
  for (const auto& p : kNames) {
    if (name == p.name) return p.dtype;
  }
  for (const char* f : kForeignOnly) {
    if (name == f) {
      return absl::FailedPreconditionError(
          absl::StrCat("dtype ", name, " has no ckpt equivalent"));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", format::EscapeText(name), "'"));
}

absl::StatusOr<uint64_t> DecodeSafetensorsHeaderLength(absl::string_view first8,
                                                       uint64_t file_size) {
  if (first8.size() < 8 || file_size < 8) {
    return Bad(absl::StrCat("file of ", file_size,
                            " bytes is too short for a header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(first8[i]);
  if (n > kSafetensorsMaxHeader) {
    return Bad(absl::StrCat("header length ", n, " exceeds the limit of ",
                            kSafetensorsMaxHeader, " bytes"));
  }
  if (n > file_size - 8) {
    return Bad(absl::StrCat("header length ", n,
                            " runs past the end of the file (", file_size,
                            " bytes)"));
  }
  return n;
}

absl::StatusOr<SafetensorsHeader> DecodeSafetensorsHeader(
    absl::string_view json, uint64_t data_size) {
  if (json.empty() || json[0] != '{')
    return Bad("header does not start with '{'");
  CKPT_ASSIGN_OR_RETURN(nlohmann::json doc, ParseStrictJson(json, "header"));
  if (!doc.is_object()) return Bad("header is not a JSON object");
  SafetensorsHeader h;
  for (const auto& [key, value] : doc.items()) {
    if (key == kSafetensorsMetadataKey) {
      CKPT_RETURN_IF_ERROR(DecodeMetadata(value, h));
      continue;
    }
    CKPT_ASSIGN_OR_RETURN(SafetensorsTensor t, DecodeTensor(key, value));
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return std::tie(a.begin, a.end, a.name) <
                     std::tie(b.begin, b.end, b.name);
            });
  CKPT_RETURN_IF_ERROR(ValidateOffsets(h.tensors, data_size));
  return h;
}

absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<SafetensorsTensor>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    doc[kSafetensorsMetadataKey] = std::move(m);
  }
  for (const SafetensorsTensor& t : tensors) {
    nlohmann::ordered_json x;
    x["dtype"] = std::string(SafetensorsDTypeName(t.dtype));
    x["shape"] = std::vector<uint64_t>(t.shape.begin(), t.shape.end());
    x["data_offsets"] = {t.begin, t.end};
    doc[t.name] = std::move(x);
  }
  CKPT_ASSIGN_OR_RETURN(std::string text, DumpStrictJson(doc, -1));
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  return out + text;
}

absl::StatusOr<HfIndex> DecodeHfIndex(absl::string_view json) {
  CKPT_ASSIGN_OR_RETURN(nlohmann::json doc, ParseStrictJson(json, "index"));
  if (!doc.is_object() || !doc.contains("weight_map") ||
      !doc["weight_map"].is_object()) {
    return Bad("index has no weight_map object");
  }
  HfIndex index;
  if (doc.contains("metadata") && doc["metadata"].is_object() &&
      doc["metadata"].contains("total_size")) {
    const auto& ts = doc["metadata"]["total_size"];
    // transformers has written it as an integer and, in some versions, a float.
    if (ts.is_number_unsigned()) {
      index.total_size = ts.get<uint64_t>();
      index.has_total_size = true;
    } else if (ts.is_number_float() && ts.get<double>() >= 0) {
      index.total_size = static_cast<uint64_t>(ts.get<double>());
      index.has_total_size = true;
    }
  }
  std::set<std::string> files;
  for (const auto& [tensor, file] : doc["weight_map"].items()) {
    if (!file.is_string()) {
      return Bad(absl::StrCat("weight_map entry of '",
                              format::EscapeText(tensor), "' is not a string"));
    }
    const std::string f = file.get<std::string>();
    if (f.empty() || f == "." || f == ".." ||
        f.find('/') != std::string::npos || f.find('\\') != std::string::npos ||
        f.find('\0') != std::string::npos) {
      return Bad(
          absl::StrCat("weight_map entry of '", format::EscapeText(tensor),
                       "' names '", format::EscapeText(f),
                       "', which is not a file inside the index's directory"));
    }
    index.weight_map.emplace_back(tensor, f);
    files.insert(f);
  }
  std::sort(index.weight_map.begin(), index.weight_map.end());
  index.files.assign(files.begin(), files.end());
  return index;
}

std::string EncodeHfIndex(const HfIndex& index) {
  nlohmann::ordered_json doc;
  doc["metadata"]["total_size"] = index.total_size;
  auto map = index.weight_map;
  std::sort(map.begin(), map.end());
  nlohmann::ordered_json wm = nlohmann::ordered_json::object();
  for (const auto& [tensor, file] : map) wm[tensor] = file;
  doc["weight_map"] = std::move(wm);
  return doc.dump(2, ' ', false,
                  nlohmann::ordered_json::error_handler_t::replace) +
         "\n";
}

std::string HfShardName(size_t index, size_t count) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1, count);
}

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  struct Unit {
    const char* suffix;
    uint64_t factor;
  };
  constexpr Unit kUnits[] = {
      {"TiB", 1ull << 40}, {"GiB", 1ull << 30},      {"MiB", 1ull << 20},
      {"KiB", 1ull << 10}, {"TB", 1000000000000ull}, {"GB", 1000000000ull},
      {"MB", 1000000ull},  {"KB", 1000ull},          {"B", 1ull}};
  absl::string_view digits = absl::StripAsciiWhitespace(text);
  uint64_t factor = 1;
  for (const Unit& u : kUnits) {
    if (absl::EndsWithIgnoreCase(digits, u.suffix)) {
      digits.remove_suffix(strlen(u.suffix));
      factor = u.factor;
      break;
    }
  }
  uint64_t n = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(digits), &n) || n == 0 ||
      n > UINT64_MAX / factor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "size '", format::EscapeText(text),
        "' is not a positive number of bytes (e.g. 5GB, 500MiB, 1000000)"));
  }
  return n * factor;
}

}  // namespace ckpt::interop

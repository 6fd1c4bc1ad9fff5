#include "ckpt/format/dtype.h"

#include "absl/strings/str_cat.h"
#include "ckpt/format/names.h"

namespace ckpt {

int DTypeSize(DType d) {
  switch (d) {
    case DType::kBool:
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
      return 1;
    case DType::kUInt16:
    case DType::kInt16:
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kUInt32:
    case DType::kInt32:
    case DType::kFloat32:
      return 4;
    case DType::kUInt64:
    case DType::kInt64:
    case DType::kFloat64:
      return 8;
  }
  return 0;
}

absl::string_view DTypeName(DType d) {
  switch (d) {
    case DType::kBool:
      return "bool";
    case DType::kUInt8:
      return "uint8";
    case DType::kUInt16:
      return "uint16";
    case DType::kUInt32:
      return "uint32";
    case DType::kUInt64:
      return "uint64";
    case DType::kInt8:
      return "int8";
    case DType::kInt16:
      return "int16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat8E4M3FN:
      return "float8_e4m3fn";
    case DType::kFloat8E5M2:
      return "float8_e5m2";
  }
  return "invalid";
}

absl::StatusOr<DType> DTypeFromName(absl::string_view name) {
  for (DType d : kAllDTypes) {
    if (DTypeName(d) == name) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", format::EscapeText(name), "'"));
}

absl::StatusOr<DType> DTypeFromCode(uint8_t code) {
  if (code >= 1 && code <= 15) return static_cast<DType>(code);
  return absl::DataLossError(absl::StrCat("unknown dtype code ", code));
}

bool IsFloatingPoint(DType d) {
  switch (d) {
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
      return true;
    default:
      return false;
  }
}

}  // namespace ckpt

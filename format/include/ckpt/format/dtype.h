// Element types of format v1 (spec/FORMAT.md §9). Values are on-disk codes.
#ifndef CKPT_FORMAT_DTYPE_H_
#define CKPT_FORMAT_DTYPE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

enum class DType : uint8_t {
  kBool = 1,
  kUInt8 = 2,
  kUInt16 = 3,
  kUInt32 = 4,
  kUInt64 = 5,
  kInt8 = 6,
  kInt16 = 7,
  kInt32 = 8,
  kInt64 = 9,
  kFloat16 = 10,
  kBFloat16 = 11,
  kFloat32 = 12,
  kFloat64 = 13,
  kFloat8E4M3FN = 14,
  kFloat8E5M2 = 15,
};

inline constexpr DType kAllDTypes[] = {
    DType::kBool,    DType::kUInt8,        DType::kUInt16,    DType::kUInt32,
    DType::kUInt64,  DType::kInt8,         DType::kInt16,     DType::kInt32,
    DType::kInt64,   DType::kFloat16,      DType::kBFloat16,  DType::kFloat32,
    DType::kFloat64, DType::kFloat8E4M3FN, DType::kFloat8E5M2};

// Size of one element in bytes (1, 2, 4 or 8).
int DTypeSize(DType d);
// Canonical lower-case name: "bool", "uint8", ..., "bfloat16",
// "float8_e4m3fn", "float8_e5m2".
absl::string_view DTypeName(DType d);
// Parses a canonical name. InvalidArgument naming the input otherwise.
absl::StatusOr<DType> DTypeFromName(absl::string_view name);
// Decodes an on-disk code. DataLoss for an unknown code.
absl::StatusOr<DType> DTypeFromCode(uint8_t code);
bool IsFloatingPoint(DType d);

}  // namespace ckpt

#endif  // CKPT_FORMAT_DTYPE_H_

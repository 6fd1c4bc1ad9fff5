// ckpt element types <-> HDF5 datatypes (tools/README.md (ckpt-convert),
// "Types").
//
// Export: integers and float32/float64 as the standard little-endian HDF5
// types; float16 as the IEEE half type h5py defines (numpy.float16); bool as
// h5py's enum (int8: FALSE = 0, TRUE = 1; numpy.bool_); bfloat16 and the two
// float8 types, which HDF5 lacks, as raw uint16 / uint8 bit patterns with
// the dataset attribute `ckpt_dtype` naming the type.
//
// Import: the same types in either byte order, any IEEE binary16/32/64
// float, any bool-like enum (1-byte base, exactly FALSE = 0 and TRUE = 1)
// and opaque types (objects). An integer dataset whose `ckpt_dtype` names a
// type of its size is read as those bit patterns. Everything else
// (compound, strings, variable-length, references, arrays, bitfields, other
// enums and floats) is unsupported.
#ifndef CKPT_INTEROP_HDF5_HDF5_TYPES_H_
#define CKPT_INTEROP_HDF5_HDF5_TYPES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/interop/hdf5/hdf5_util.h"
#include "ckpt/types.h"

namespace ckpt::interop::hdf5 {

// Dataset attributes of the adapter.
inline constexpr char kDTypeAttr[] =
    "ckpt_dtype";  // bfloat16, float8_e4m3fn, float8_e5m2
inline constexpr char kKindAttr[] =
    "ckpt_kind";  // "object" (absent for tensors)
inline constexpr char kKindObject[] = "object";
inline constexpr char kKindTensor[] = "tensor";

// True for the dtypes HDF5 has no type for (stored raw with `ckpt_dtype`).
bool StoredRaw(DType d);

// The file datatype of `d` (for H5Dcreate). Its in-memory layout is the
// ckpt layout (little-endian), so it is also the memory type of the
// export's writes. REQUIRES: lock held.
absl::StatusOr<Handle> FileTypeFor(DType d);

// How the elements of an imported dataset are read.
enum class MemKind : uint8_t {
  kU8,
  kU16,
  kU32,
  kU64,
  kI8,
  kI16,
  kI32,
  kI64,
  kF16,
  kF32,
  kF64,
  kBool,
  kOpaque,  // the dataset's own opaque type: raw bytes
};

struct ImportType {
  DType dtype = DType::kUInt8;  // the entry's dtype (objects: uint8)
  MemKind mem = MemKind::kU8;
  uint64_t element_size = 1;  // bytes per HDF5 element in memory
  bool opaque = false;        // an opaque type: imported as an object
};

// Maps the datatype of dataset `where` and its `ckpt_dtype` attribute (if
// any) to an ImportType. InvalidArgument naming `where` and the type for an
// unsupported type, an unknown `ckpt_dtype`, or one that does not fit the
// HDF5 type. REQUIRES: lock held.
absl::StatusOr<ImportType> ClassifyType(
    hid_t type, const std::optional<std::string>& ckpt_dtype,
    absl::string_view where);

// The memory datatype for reading with `mem`; `file_type` is the dataset's
// type (used for kOpaque). REQUIRES: lock held.
absl::StatusOr<Handle> MemTypeFor(MemKind mem, hid_t file_type);

}  // namespace ckpt::interop::hdf5

#endif  // CKPT_INTEROP_HDF5_HDF5_TYPES_H_

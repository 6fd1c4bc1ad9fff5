#include "ckpt/interop/hdf5/hdf5_types.h"

#include "absl/strings/str_cat.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::interop::hdf5 {
namespace {

struct IeeeLayout {
  size_t size, spos, epos, esize, mpos, msize, ebias;
};
constexpr IeeeLayout kIeee[] = {
    {2, 15, 10, 5, 0, 10, 15},
    {4, 31, 23, 8, 0, 23, 127},
    {8, 63, 52, 11, 0, 52, 1023},
};

bool IsIeeeFloat(hid_t type, size_t size) {
  for (const IeeeLayout& l : kIeee) {
    if (l.size != size) continue;
    size_t spos, epos, esize, mpos, msize;
    if (H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) < 0)
      return false;
    H5T_order_t order = H5Tget_order(type);
    return spos == l.spos && epos == l.epos && esize == l.esize &&
           mpos == l.mpos && msize == l.msize &&
           H5Tget_ebias(type) == l.ebias &&
           H5Tget_precision(type) == size * 8 && H5Tget_offset(type) == 0 &&
           H5Tget_norm(type) == H5T_NORM_IMPLIED &&
           (order == H5T_ORDER_LE || order == H5T_ORDER_BE);
  }
  return false;
}

bool IsPlainInteger(hid_t type, size_t size) {
  H5T_order_t order = H5Tget_order(type);
  return (size == 1 || size == 2 || size == 4 || size == 8) &&
         H5Tget_precision(type) == size * 8 && H5Tget_offset(type) == 0 &&
         (order == H5T_ORDER_LE || order == H5T_ORDER_BE || size == 1) &&
         H5Tget_sign(type) != H5T_SGN_ERROR;
}

ImportType IntegerType(size_t size, bool is_signed) {
  ImportType t;
  t.element_size = size;
  switch (size) {
    case 1:
      t.dtype = is_signed ? DType::kInt8 : DType::kUInt8;
      break;
    case 2:
      t.dtype = is_signed ? DType::kInt16 : DType::kUInt16;
      break;
    case 4:
      t.dtype = is_signed ? DType::kInt32 : DType::kUInt32;
      break;
    default:
      t.dtype = is_signed ? DType::kInt64 : DType::kUInt64;
      break;
  }
  switch (size) {
    case 1:
      t.mem = is_signed ? MemKind::kI8 : MemKind::kU8;
      break;
    case 2:
      t.mem = is_signed ? MemKind::kI16 : MemKind::kU16;
      break;
    case 4:
      t.mem = is_signed ? MemKind::kI32 : MemKind::kU32;
      break;
    default:
      t.mem = is_signed ? MemKind::kI64 : MemKind::kU64;
      break;
  }
  return t;
}

// An enum is h5py's bool when its base is one byte and its members are
// exactly FALSE = 0 and TRUE = 1.
bool IsBoolEnum(hid_t type) {
  if (H5Tget_size(type) != 1 || H5Tget_nmembers(type) != 2) return false;
  Handle super(H5Tget_super(type));
  if (!super.valid() || H5Tget_class(super.get()) != H5T_INTEGER ||
      H5Tget_precision(super.get()) != 8) {
    return false;
  }
  unsigned char f = 0xFF, t = 0xFF;
  if (H5Tenum_valueof(type, "FALSE", &f) < 0 ||
      H5Tenum_valueof(type, "TRUE", &t) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return false;
  }
  return f == 0 && t == 1;
}

absl::Status Unsupported(absl::string_view where, hid_t type) {
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": unsupported HDF5 type ", TypeDescription(type)));
}

}  // namespace

bool StoredRaw(DType d) {
  return d == DType::kBFloat16 || d == DType::kFloat8E4M3FN ||
         d == DType::kFloat8E5M2;
}

absl::StatusOr<Handle> FileTypeFor(DType d) {
  hid_t base;
  switch (d) {
    case DType::kBool:
      return MakeBoolType();
    case DType::kFloat16:
      return MakeFloat16Type();
    case DType::kUInt8:
      base = H5T_STD_U8LE;
      break;
    case DType::kUInt16:
      base = H5T_STD_U16LE;
      break;
    case DType::kUInt32:
      base = H5T_STD_U32LE;
      break;
    case DType::kUInt64:
      base = H5T_STD_U64LE;
      break;
    case DType::kInt8:
      base = H5T_STD_I8LE;
      break;
    case DType::kInt16:
      base = H5T_STD_I16LE;
      break;
    case DType::kInt32:
      base = H5T_STD_I32LE;
      break;
    case DType::kInt64:
      base = H5T_STD_I64LE;
      break;
    case DType::kBFloat16:
      base = H5T_STD_U16LE;
      break;
    case DType::kFloat32:
      base = H5T_IEEE_F32LE;
      break;
    case DType::kFloat64:
      base = H5T_IEEE_F64LE;
      break;
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
      base = H5T_STD_U8LE;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("no HDF5 type for dtype code ", static_cast<int>(d)));
  }
  Handle t(H5Tcopy(base));
  if (!t.valid())
    return Hdf5Error(absl::StatusCode::kInternal, "copying a datatype");
  return t;
}

namespace {

// The element type of HDF5 type `type` by its class: integers, IEEE
// floats, the bool enum, opaque bytes; Unsupported otherwise.
absl::StatusOr<ImportType> TypeOfClass(hid_t type, absl::string_view where) {
  const size_t size = H5Tget_size(type);
  ImportType t;
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      if (!IsPlainInteger(type, size)) return Unsupported(where, type);
      return IntegerType(size, H5Tget_sign(type) == H5T_SGN_2);
    case H5T_FLOAT:
      if (!IsIeeeFloat(type, size)) return Unsupported(where, type);
      t.element_size = size;
      t.dtype = size == 2 ? DType::kFloat16
                          : (size == 4 ? DType::kFloat32 : DType::kFloat64);
      t.mem = size == 2 ? MemKind::kF16
                        : (size == 4 ? MemKind::kF32 : MemKind::kF64);
      return t;
    case H5T_ENUM:
      if (!IsBoolEnum(type)) return Unsupported(where, type);
      t.dtype = DType::kBool;
      t.mem = MemKind::kBool;
      t.element_size = 1;
      return t;
    case H5T_OPAQUE:
      if (size == 0 || size > (1u << 30)) return Unsupported(where, type);
      t.dtype = DType::kUInt8;
      t.mem = MemKind::kOpaque;
      t.element_size = size;
      t.opaque = true;
      return t;
    default:
      return Unsupported(where, type);
  }
}

// `t`, the type of HDF5 type `type`, as the ckpt_dtype attribute
// `ckpt_dtype` names it: a dtype stored as raw integers of its size, or the
// same dtype; InvalidArgument when the two disagree.
absl::StatusOr<ImportType> WithDTypeAttr(ImportType t, hid_t type,
                                         const std::string& ckpt_dtype,
                                         absl::string_view where) {
  auto named = DTypeFromName(ckpt_dtype);
  if (!named.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": attribute ", kDTypeAttr, ": ", named.status().message()));
  }
  if (StoredRaw(*named)) {
    if (H5Tget_class(type) != H5T_INTEGER ||
        H5Tget_size(type) != static_cast<size_t>(DTypeSize(*named))) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": attribute ", kDTypeAttr, " is '",
          format::EscapeText(ckpt_dtype), "', which is stored as ",
          DTypeSize(*named) * 8, "-bit integers, but the HDF5 type is ",
          TypeDescription(type)));
    }
    t.dtype = *named;  // the bit patterns, read without conversion
    return t;
  }
  if (t.opaque || *named != t.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": attribute ", kDTypeAttr, " is '",
                     format::EscapeText(ckpt_dtype), "' but the HDF5 type is ",
                     TypeDescription(type)));
  }
  return t;
}

}  // namespace

absl::StatusOr<ImportType> ClassifyType(
    hid_t type, const std::optional<std::string>& ckpt_dtype,
    absl::string_view where) {
  CKPT_ASSIGN_OR_RETURN(ImportType t, TypeOfClass(type, where));
  if (!ckpt_dtype.has_value()) return t;
  return WithDTypeAttr(std::move(t), type, *ckpt_dtype, where);
}

absl::StatusOr<Handle> MemTypeFor(MemKind mem, hid_t file_type) {
  hid_t base;
  switch (mem) {
    case MemKind::kBool:
      return MakeBoolType();
    case MemKind::kF16:
      return MakeFloat16Type();
    case MemKind::kOpaque:
      base = file_type;
      break;
    case MemKind::kU8:
      base = H5T_STD_U8LE;
      break;
    case MemKind::kU16:
      base = H5T_STD_U16LE;
      break;
    case MemKind::kU32:
      base = H5T_STD_U32LE;
      break;
    case MemKind::kU64:
      base = H5T_STD_U64LE;
      break;
    case MemKind::kI8:
      base = H5T_STD_I8LE;
      break;
    case MemKind::kI16:
      base = H5T_STD_I16LE;
      break;
    case MemKind::kI32:
      base = H5T_STD_I32LE;
      break;
    case MemKind::kI64:
      base = H5T_STD_I64LE;
      break;
    case MemKind::kF32:
      base = H5T_IEEE_F32LE;
      break;
    case MemKind::kF64:
      base = H5T_IEEE_F64LE;
      break;
    default:
      return absl::InternalError("unknown memory type");
  }
  Handle t(H5Tcopy(base));
  if (!t.valid())
    return Hdf5Error(absl::StatusCode::kInternal, "copying a datatype");
  return t;
}

}  // namespace ckpt::interop::hdf5

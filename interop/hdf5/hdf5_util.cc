#include "ckpt/interop/hdf5/hdf5_util.h"

#include <H5PLpublic.h>

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::interop::hdf5 {
namespace {

herr_t KeepInnermost(unsigned /*n*/, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (err->desc != nullptr && err->desc[0] != '\0') {
    *out = err->desc;
    char minor[128] = {0};
    if (H5Eget_msg(err->min_num, nullptr, minor, sizeof(minor)) > 0 &&
        *out != minor) {
      absl::StrAppend(out, " (", minor, ")");
    }
  }
  return 0;
}

// HDF5's message as one line. A failed system call of its file driver
// ("file write failed: time = ..., errno = 28, error message = '...', buf =
// ...", over two lines) becomes the system's error text alone; any other
// message keeps its first line, after "HDF5: ".
std::string OneLine(absl::string_view message) {
  constexpr absl::string_view kErrno = "errno = ";
  const size_t at = message.find(kErrno);
  int err = 0;
  if (at != absl::string_view::npos) {
    absl::string_view digits = message.substr(at + kErrno.size());
    digits = digits.substr(0, digits.find_first_not_of("0123456789"));
    if (absl::SimpleAtoi(digits, &err) && err > 0) return std::strerror(err);
  }
  return absl::StrCat(
      "HDF5: ", format::EscapeText(message.substr(0, message.find('\n'))));
}

bool IsUtf8WithoutNul(absl::string_view s) {
  return s.find('\0') == absl::string_view::npos && format::IsValidUtf8(s);
}

std::string AttrWhere(absl::string_view where, absl::string_view name) {
  return absl::StrCat(where, ": attribute '", format::EscapeText(name), "'");
}

// Number of elements of an attribute's dataspace; -1 for a null dataspace.
absl::StatusOr<int64_t> AttributePoints(hid_t attr, absl::string_view what) {
  Handle space(H5Aget_space(attr));
  if (!space.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, what);
  H5S_class_t cls = H5Sget_simple_extent_type(space.get());
  if (cls == H5S_NULL) return -1;
  if (cls == H5S_SCALAR) return 1;
  if (cls != H5S_SIMPLE) return Hdf5Error(absl::StatusCode::kDataLoss, what);
  int nd = H5Sget_simple_extent_ndims(space.get());
  if (nd < 0) return Hdf5Error(absl::StatusCode::kDataLoss, what);
  if (nd != 1)
    return static_cast<int64_t>(-2);  // not 1-d: the caller rejects it
  hsize_t dim = 0;
  if (H5Sget_simple_extent_dims(space.get(), &dim, nullptr) < 0) {
    return Hdf5Error(absl::StatusCode::kDataLoss, what);
  }
  if (dim > static_cast<hsize_t>(INT64_MAX)) return static_cast<int64_t>(-2);
  return static_cast<int64_t>(dim);
}

absl::Status WriteScalar(hid_t obj, absl::string_view name, hid_t type,
                         hid_t mem_type, const void* value) {
  std::string n(name);
  Handle space(H5Screate(H5S_SCALAR));
  Handle acpl(H5Pcreate(H5P_ATTRIBUTE_CREATE));
  if (!space.valid() || !acpl.valid() ||
      H5Pset_char_encoding(acpl.get(), H5T_CSET_UTF8) < 0) {
    return Hdf5Error(
        absl::StatusCode::kInternal,
        absl::StrCat("attribute '", format::EscapeText(name), "'"));
  }
  Handle attr(
      H5Acreate2(obj, n.c_str(), type, space.get(), acpl.get(), H5P_DEFAULT));
  if (!attr.valid() || H5Awrite(attr.get(), mem_type, value) < 0) {
    return Hdf5Error(
        absl::StatusCode::kInternal,
        absl::StrCat("writing attribute '", format::EscapeText(name), "'"));
  }
  return absl::OkStatus();
}

}  // namespace

Mutex& Hdf5Mutex() {
  static Mutex* mu = new Mutex;
  return *mu;
}

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    Reset(o.id_);
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Handle::Reset(hid_t id) {
  if (id_ >= 0) {
    switch (H5Iget_type(id_)) {
      case H5I_FILE:
        H5Fclose(id_);
        break;
      case H5I_GROUP:
        H5Gclose(id_);
        break;
      case H5I_DATASET:
        H5Dclose(id_);
        break;
      case H5I_DATASPACE:
        H5Sclose(id_);
        break;
      case H5I_DATATYPE:
        H5Tclose(id_);
        break;
      case H5I_ATTR:
        H5Aclose(id_);
        break;
      case H5I_GENPROP_LST:
        H5Pclose(id_);
        break;
      default:
        H5Idec_ref(id_);
        break;
    }
  }
  id_ = id;
}

// Not analysed: the lock is taken here and released by the destructor.
Hdf5Lock::Hdf5Lock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Hdf5Mutex().Lock();
  static const bool kGlobalInit = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    H5PLset_loading_state(0);
    return true;
  }();
  (void)kGlobalInit;
  thread_local bool thread_init = false;
  if (!thread_init) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    thread_init = true;
  }
}

Hdf5Lock::~Hdf5Lock() ABSL_NO_THREAD_SAFETY_ANALYSIS { Hdf5Mutex().Unlock(); }

absl::Status Hdf5Error(absl::StatusCode code, absl::string_view context) {
  std::string innermost;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, KeepInnermost, &innermost);
  H5Eclear2(H5E_DEFAULT);
  if (innermost.empty()) innermost = "unknown error";
  return absl::Status(code, absl::StrCat(context, ": ", OneLine(innermost)));
}

std::string TypeDescription(hid_t type) {
  const size_t size = H5Tget_size(type);
  const char* order = H5Tget_order(type) == H5T_ORDER_BE ? ", big-endian" : "";
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: {
      bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
      size_t precision = H5Tget_precision(type);
      if (precision != size * 8) {
        return absl::StrCat(is_signed ? "int" : "uint", " (", precision,
                            " bits in ", size, " bytes", order, ")");
      }
      return absl::StrCat(is_signed ? "int" : "uint", size * 8,
                          order[0] ? " (big-endian)" : "");
    }
    case H5T_FLOAT:
      return absl::StrCat("float (", size, " bytes, ", H5Tget_precision(type),
                          "-bit precision", order, ")");
    case H5T_STRING:
      if (H5Tis_variable_str(type) > 0) return "variable-length string";
      return absl::StrCat("fixed-length string (", size, " bytes)");
    case H5T_COMPOUND:
      return absl::StrCat("compound (", H5Tget_nmembers(type), " members)");
    case H5T_ENUM:
      return absl::StrCat("enum (", H5Tget_nmembers(type), " members, ", size,
                          " bytes)");
    case H5T_VLEN:
      return "variable-length sequence";
    case H5T_ARRAY:
      return "array";
    case H5T_REFERENCE:
      return "reference";
    case H5T_OPAQUE:
      return absl::StrCat("opaque (", size, " bytes)");
    case H5T_BITFIELD:
      return absl::StrCat("bitfield (", size, " bytes)");
    case H5T_TIME:
      return "time";
    default:
      return "unknown type class";
  }
}

absl::StatusOr<Handle> MakeFloat16Type() {
  Handle t(H5Tcopy(H5T_IEEE_F32LE));
  if (!t.valid() || H5Tset_fields(t.get(), 15, 10, 5, 0, 10) < 0 ||
      H5Tset_size(t.get(), 2) < 0 || H5Tset_ebias(t.get(), 15) < 0) {
    return Hdf5Error(absl::StatusCode::kInternal, "defining the float16 type");
  }
  return t;
}

absl::StatusOr<Handle> MakeBoolType() {
  Handle t(H5Tenum_create(H5T_STD_I8LE));
  const int8_t f = 0, tr = 1;
  if (!t.valid() || H5Tenum_insert(t.get(), "FALSE", &f) < 0 ||
      H5Tenum_insert(t.get(), "TRUE", &tr) < 0) {
    return Hdf5Error(absl::StatusCode::kInternal, "defining the bool type");
  }
  return t;
}

absl::Status WriteStringAttribute(hid_t obj, absl::string_view name,
                                  absl::string_view value) {
  std::string n(name);
  Handle acpl(H5Pcreate(H5P_ATTRIBUTE_CREATE));
  if (!acpl.valid() || H5Pset_char_encoding(acpl.get(), H5T_CSET_UTF8) < 0) {
    return Hdf5Error(
        absl::StatusCode::kInternal,
        absl::StrCat("attribute '", format::EscapeText(name), "'"));
  }
  if (IsUtf8WithoutNul(value)) {
    Handle type(H5Tcopy(H5T_C_S1));
    Handle space(H5Screate(H5S_SCALAR));
    if (!type.valid() || !space.valid() ||
        H5Tset_size(type.get(), H5T_VARIABLE) < 0 ||
        H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0) {
      return Hdf5Error(
          absl::StatusCode::kInternal,
          absl::StrCat("attribute '", format::EscapeText(name), "'"));
    }
    std::string copy(value);
    const char* p = copy.c_str();
    Handle attr(H5Acreate2(obj, n.c_str(), type.get(), space.get(), acpl.get(),
                           H5P_DEFAULT));
    if (!attr.valid() || H5Awrite(attr.get(), type.get(), &p) < 0) {
      return Hdf5Error(
          absl::StatusCode::kInternal,
          absl::StrCat("writing attribute '", format::EscapeText(name), "'"));
    }
    return absl::OkStatus();
  }
  hsize_t dim = value.size();
  Handle space(H5Screate_simple(1, &dim, nullptr));
  Handle attr(H5Acreate2(obj, n.c_str(), H5T_STD_U8LE, space.get(), acpl.get(),
                         H5P_DEFAULT));
  if (!attr.valid() ||
      H5Awrite(attr.get(), H5T_NATIVE_UCHAR, value.data()) < 0) {
    return Hdf5Error(
        absl::StatusCode::kInternal,
        absl::StrCat("writing attribute '", format::EscapeText(name), "'"));
  }
  return absl::OkStatus();
}

absl::Status WriteUInt64Attribute(hid_t obj, absl::string_view name,
                                  uint64_t value) {
  return WriteScalar(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}
absl::Status WriteInt64Attribute(hid_t obj, absl::string_view name,
                                 int64_t value) {
  return WriteScalar(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}
absl::Status WriteUInt32Attribute(hid_t obj, absl::string_view name,
                                  uint32_t value) {
  return WriteScalar(obj, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, &value);
}

namespace {

// An attribute that is neither a string nor a 1-d byte array.
absl::Status WrongBytesAttribute(hid_t type, int64_t points,
                                 absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": expected a string or a 1-d byte array, found ",
      TypeDescription(type),
      points == -1
          ? " with a null dataspace"
          : (points == -2 ? " with more than one dimension"
                          : absl::StrCat(" with ", points, " elements"))));
}

absl::Status BytesAttributeTooLong(uint64_t n, uint64_t max_bytes,
                                   absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": ", n, " bytes, the limit is ", max_bytes));
}

// A scalar string attribute of type `type` (variable or fixed length; a
// fixed-length one ends at its first NUL).
absl::StatusOr<std::string> ReadStringAttribute(hid_t attr, hid_t type,
                                                uint64_t max_bytes,
                                                absl::string_view what) {
  Handle mem(H5Tget_native_type(type, H5T_DIR_DEFAULT));
  if (!mem.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, what);
  if (H5Tis_variable_str(type) > 0) {
    char* p = nullptr;
    if (H5Aread(attr, mem.get(), &p) < 0)
      return Hdf5Error(absl::StatusCode::kDataLoss, what);
    // The string HDF5 allocated is freed however this returns.
    std::unique_ptr<char, herr_t (*)(void*)> owned(p, H5free_memory);
    std::string out;
    if (p != nullptr) {
      size_t n = strnlen(p, max_bytes + 1);
      if (n > max_bytes) return BytesAttributeTooLong(n, max_bytes, what);
      out.assign(p, n);
    }
    return out;
  }
  const size_t size = H5Tget_size(type);
  if (size == 0 || size > max_bytes + 1)
    return BytesAttributeTooLong(size, max_bytes, what);
  std::string buf(size, '\0');
  if (H5Aread(attr, mem.get(), buf.data()) < 0) {
    return Hdf5Error(absl::StatusCode::kDataLoss, what);
  }
  size_t nul = buf.find('\0');
  if (nul != std::string::npos) buf.resize(nul);
  if (buf.size() > max_bytes)
    return BytesAttributeTooLong(buf.size(), max_bytes, what);
  return buf;
}

// A 1-d array attribute of `points` one-byte integers of type `type`.
absl::StatusOr<std::string> ReadByteArrayAttribute(hid_t attr, hid_t type,
                                                   int64_t points,
                                                   uint64_t max_bytes,
                                                   absl::string_view what) {
  Handle space(H5Aget_space(attr));
  if (H5Sget_simple_extent_type(space.get()) != H5S_SIMPLE)
    return WrongBytesAttribute(type, points, what);
  if (static_cast<uint64_t>(points) > max_bytes)
    return BytesAttributeTooLong(points, max_bytes, what);
  std::string buf(points, '\0');
  hid_t mem =
      H5Tget_sign(type) == H5T_SGN_2 ? H5T_NATIVE_SCHAR : H5T_NATIVE_UCHAR;
  if (points > 0 && H5Aread(attr, mem, buf.data()) < 0) {
    return Hdf5Error(absl::StatusCode::kDataLoss, what);
  }
  return buf;
}

}  // namespace

absl::StatusOr<std::string> ReadBytesAttributeById(hid_t attr,
                                                   uint64_t max_bytes,
                                                   absl::string_view what) {
  Handle type(H5Aget_type(attr));
  if (!type.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, what);
  CKPT_ASSIGN_OR_RETURN(int64_t points, AttributePoints(attr, what));
  const H5T_class_t cls = H5Tget_class(type.get());
  if (cls == H5T_STRING) {
    if (points != 1) return WrongBytesAttribute(type.get(), points, what);
    return ReadStringAttribute(attr, type.get(), max_bytes, what);
  }
  if (cls == H5T_INTEGER && H5Tget_size(type.get()) == 1 && points >= 0) {
    return ReadByteArrayAttribute(attr, type.get(), points, max_bytes, what);
  }
  return WrongBytesAttribute(type.get(), points, what);
}

absl::StatusOr<std::optional<std::string>> ReadBytesAttribute(
    hid_t obj, absl::string_view name, uint64_t max_bytes,
    absl::string_view where) {
  std::string n(name);
  const std::string what = AttrWhere(where, name);
  htri_t exists = H5Aexists(obj, n.c_str());
  if (exists < 0) return Hdf5Error(absl::StatusCode::kDataLoss, what);
  if (exists == 0) return std::optional<std::string>();
  Handle attr(H5Aopen(obj, n.c_str(), H5P_DEFAULT));
  if (!attr.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, what);
  CKPT_ASSIGN_OR_RETURN(std::string v,
                        ReadBytesAttributeById(attr.get(), max_bytes, what));
  return std::optional<std::string>(std::move(v));
}

absl::StatusOr<std::optional<uint64_t>> ReadUInt64Attribute(
    hid_t obj, absl::string_view name, absl::string_view where) {
  std::string n(name);
  const std::string what = AttrWhere(where, name);
  htri_t exists = H5Aexists(obj, n.c_str());
  if (exists < 0) return Hdf5Error(absl::StatusCode::kDataLoss, what);
  if (exists == 0) return std::optional<uint64_t>();
  Handle attr(H5Aopen(obj, n.c_str(), H5P_DEFAULT));
  if (!attr.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, what);
  Handle type(H5Aget_type(attr.get()));
  if (!type.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, what);
  CKPT_ASSIGN_OR_RETURN(int64_t points, AttributePoints(attr.get(), what));
  if (H5Tget_class(type.get()) != H5T_INTEGER || points != 1 ||
      H5Tget_size(type.get()) > 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": expected one integer, found ", TypeDescription(type.get()),
        points == 1 ? "" : " with a dataspace of other than one element"));
  }
  if (H5Tget_sign(type.get()) == H5T_SGN_2) {
    int64_t v = 0;
    if (H5Aread(attr.get(), H5T_NATIVE_INT64, &v) < 0) {
      return Hdf5Error(absl::StatusCode::kDataLoss, what);
    }
    if (v < 0)
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": negative value ", v));
    return std::optional<uint64_t>(static_cast<uint64_t>(v));
  }
  uint64_t v = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_UINT64, &v) < 0) {
    return Hdf5Error(absl::StatusCode::kDataLoss, what);
  }
  return std::optional<uint64_t>(v);
}

}  // namespace ckpt::interop::hdf5

// Small helpers around the HDF5 C API for the ckpt-convert HDF5 adapter:
// an owning handle, HDF5 errors as absl::Status, one lock for every HDF5
// call, and typed attribute access that distrusts what it reads.
//
// HDF5 is used only by interop/hdf5/; nothing in format/ or libckpt/ links
// it: HDF5 stays in the import/export adapter, off the core read/write path.
#ifndef CKPT_INTEROP_HDF5_HDF5_UTIL_H_
#define CKPT_INTEROP_HDF5_HDF5_UTIL_H_

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/types.h"
#include "util/mutex.h"

namespace ckpt::interop::hdf5 {

// Owns one HDF5 identifier (file, group, dataset, dataspace, datatype,
// attribute, property list) and closes it with the matching H5*close.
// Move-only. REQUIRES: the lock of Hdf5Lock() is held whenever a Handle is
// destroyed or reset while it owns an identifier.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(Handle&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { Reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes the owned identifier (errors are ignored) and takes `id`.
  void Reset(hid_t id = H5I_INVALID_HID);
  // Gives up ownership (for a caller that must check the close).
  hid_t Release() {
    hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// The lock of every HDF5 call; taken through Hdf5Lock.
Mutex& Hdf5Mutex();

// Holds the lock every HDF5 call of this adapter holds (the library may be
// built without thread safety, and HDF5 error stacks are per thread) from
// construction to destruction: `Hdf5Lock lock;`. Taking it also initialises
// HDF5 for the calling thread: automatic error printing is off, and filter
// plugins are never loaded (a hostile file must not make the tool dlopen()
// anything). Not recursive: a thread that holds it must not take it again.
class ABSL_SCOPED_LOCKABLE Hdf5Lock {
 public:
  Hdf5Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION(Hdf5Mutex());
  ~Hdf5Lock() ABSL_UNLOCK_FUNCTION();
  Hdf5Lock(const Hdf5Lock&) = delete;
  Hdf5Lock& operator=(const Hdf5Lock&) = delete;
};

// `code` with message "CONTEXT: HDF5: <innermost HDF5 error message>" (its
// first line) from the calling thread's error stack, which it then clears;
// "CONTEXT: <errno text>" when that message reports a failed system call.
// REQUIRES: lock held.
absl::Status Hdf5Error(absl::StatusCode code, absl::string_view context);

// A short description of an HDF5 datatype for messages: "int32 (little-
// endian)", "float (80-bit)", "compound", "variable-length string", ...
// REQUIRES: lock held.
std::string TypeDescription(hid_t type);

// IEEE 754 binary16, little-endian, defined as h5py defines it so that h5py
// reads it as numpy.float16. The caller owns the returned handle.
// REQUIRES: lock held.
absl::StatusOr<Handle> MakeFloat16Type();
// The h5py boolean: an enum over int8 with FALSE = 0 and TRUE = 1, read by
// h5py as numpy.bool_. REQUIRES: lock held.
absl::StatusOr<Handle> MakeBoolType();

// --- Attributes (REQUIRES: lock held for all of them) ---

// Writes a scalar string attribute `name` on `obj`: a variable-length UTF-8
// string when `value` is valid UTF-8 without NUL bytes (h5py reads `str`),
// else a 1-d uint8 array of its bytes (h5py reads a numpy uint8 array).
absl::Status WriteStringAttribute(hid_t obj, absl::string_view name,
                                  absl::string_view value);
// Write scalar little-endian integer attributes (uint64, int64, uint32).
absl::Status WriteUInt64Attribute(hid_t obj, absl::string_view name,
                                  uint64_t value);
absl::Status WriteInt64Attribute(hid_t obj, absl::string_view name,
                                 int64_t value);
absl::Status WriteUInt32Attribute(hid_t obj, absl::string_view name,
                                  uint32_t value);

// Reads attribute `name` of `obj` as bytes: a scalar (or one-element)
// fixed- or variable-length string (a fixed-length one ends at its first
// NUL), or a 1-d uint8/int8 array. nullopt if the attribute is absent.
// InvalidArgument naming `where`, the attribute and its type for anything
// else, or when it holds more than `max_bytes` bytes.
absl::StatusOr<std::optional<std::string>> ReadBytesAttribute(
    hid_t obj, absl::string_view name, uint64_t max_bytes,
    absl::string_view where);
// Reads an attribute (opened) as bytes; same rules.
absl::StatusOr<std::string> ReadBytesAttributeById(hid_t attr,
                                                   uint64_t max_bytes,
                                                   absl::string_view what);
// Reads a scalar (or one-element) integer attribute as a non-negative value.
// nullopt if absent; InvalidArgument for another type, shape or a negative
// value.
absl::StatusOr<std::optional<uint64_t>> ReadUInt64Attribute(
    hid_t obj, absl::string_view name, absl::string_view where);

}  // namespace ckpt::interop::hdf5

#endif  // CKPT_INTEROP_HDF5_HDF5_UTIL_H_

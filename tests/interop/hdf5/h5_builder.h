// Builds HDF5 files with the C API for the import tests: plain files like
// h5py writes them, and files that break the rules on purpose.
// Not thread-safe; takes the adapter's HDF5 lock for its whole life.
#ifndef CKPT_TESTS_INTEROP_HDF5_H5_BUILDER_H_
#define CKPT_TESTS_INTEROP_HDF5_H5_BUILDER_H_

#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/interop/hdf5/hdf5_util.h"
#include "gtest/gtest.h"

namespace ckpt::testing {

class H5Builder {
 public:
  // Creates (truncates) `path`. With `track_order`, the root group tracks
  // attribute creation order, as ckpt-convert's files do.
  explicit H5Builder(const std::string& path, bool track_order = false) {
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
    if (track_order) {
      H5Pset_attr_creation_order(fcpl,
                                 H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
    }
    file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, H5P_DEFAULT);
    H5Pclose(fcpl);
    EXPECT_GE(file_, 0) << path;
    root_ = H5Gopen2(file_, "/", H5P_DEFAULT);
  }
  ~H5Builder() {
    for (hid_t id : open_) H5Oclose(id);
    H5Gclose(root_);
    H5Fclose(file_);
  }
  H5Builder(const H5Builder&) = delete;
  H5Builder& operator=(const H5Builder&) = delete;

  hid_t file() const { return file_; }
  hid_t root() const { return root_; }

  // A dataset at `path` (groups created as needed) of file type `type`
  // (not taken), shape `dims` (nullopt: scalar; an empty vector: a null
  // dataspace). `data`, if not null, is written with memory type
  // `mem_type` (default: `type`). Returns the open dataset, closed by the
  // destructor.
  hid_t Dataset(const std::string& path, hid_t type,
                std::optional<std::vector<hsize_t>> dims,
                const void* data = nullptr, hid_t dcpl = H5P_DEFAULT,
                hid_t mem_type = H5I_INVALID_HID) {
    hid_t space = !dims.has_value() ? H5Screate(H5S_SCALAR)
                  : dims->empty()
                      ? H5Screate(H5S_NULL)
                      : H5Screate_simple(static_cast<int>(dims->size()),
                                         dims->data(), nullptr);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t ds =
        H5Dcreate2(file_, path.c_str(), type, space, lcpl, dcpl, H5P_DEFAULT);
    H5Pclose(lcpl);
    EXPECT_GE(ds, 0) << path;
    if (data != nullptr) {
      EXPECT_GE(H5Dwrite(ds, mem_type >= 0 ? mem_type : type, H5S_ALL, H5S_ALL,
                         H5P_DEFAULT, data),
                0)
          << path;
    }
    H5Sclose(space);
    open_.push_back(ds);
    return ds;
  }

  void Group(const std::string& path) {
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t g = H5Gcreate2(file_, path.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(g, 0) << path;
    H5Pclose(lcpl);
    open_.push_back(g);
  }

  // A scalar string attribute: variable-length UTF-8 (as h5py writes str)
  // or fixed-length of exactly the value's size (as numpy bytes).
  void StringAttr(hid_t obj, const std::string& name, const std::string& value,
                  bool vlen = true) {
    hid_t type = H5Tcopy(H5T_C_S1);
    if (vlen) {
      H5Tset_size(type, H5T_VARIABLE);
      H5Tset_cset(type, H5T_CSET_UTF8);
    } else {
      H5Tset_size(type, std::max<size_t>(1, value.size()));
      H5Tset_strpad(type, H5T_STR_NULLPAD);
    }
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a =
        H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(a, 0) << name;
    const char* p = value.c_str();
    std::string padded = value;
    padded.resize(std::max<size_t>(1, value.size()), '\0');
    EXPECT_GE(
        H5Awrite(a, type, vlen ? static_cast<const void*>(&p) : padded.data()),
        0);
    H5Aclose(a);
    H5Sclose(space);
    H5Tclose(type);
  }

  // A scalar attribute of file type `type` from native `mem_type` data.
  void ScalarAttr(hid_t obj, const std::string& name, hid_t type,
                  hid_t mem_type, const void* value) {
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a =
        H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(a, 0) << name;
    EXPECT_GE(H5Awrite(a, mem_type, value), 0);
    H5Aclose(a);
    H5Sclose(space);
  }
  void IntAttr(hid_t obj, const std::string& name, int64_t v) {
    ScalarAttr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
  }

 private:
  interop::hdf5::Hdf5Lock lock_;
  hid_t file_ = H5I_INVALID_HID;
  hid_t root_ = H5I_INVALID_HID;
  std::vector<hid_t> open_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_INTEROP_HDF5_H5_BUILDER_H_

// A "plain" HDF5 file as h5py writes it (no ckpt_* attributes), made either
// by h5py (WritePlainFileWithH5py) or, equivalently, with the HDF5 C API
// (WritePlainFileWithCApi), and what importing it must give
// (CheckPlainImport).
#ifndef CKPT_TESTS_INTEROP_HDF5_PLAIN_FILE_H_
#define CKPT_TESTS_INTEROP_HDF5_PLAIN_FILE_H_

#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "ckpt/interop/hdf5/hdf5_util.h"
#include "ckpt/reader.h"
#include "gtest/gtest.h"
#include "interop/hdf5/h5_builder.h"
#include "testing/cli.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/convert/convert_fixture.h"

namespace ckpt::testing {

// The same file, written by h5py.
inline constexpr char kPlainFileH5py[] = R"py(
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("weights/w", data=(np.arange(12, dtype=np.float32) * 0.5).reshape(3, 4),
                     chunks=(2, 2), compression="gzip", compression_opts=4)
    f["weights/b"] = np.array([1, -2, 3.5, 1e300], dtype=">f8")
    f["half"] = np.array([1.5, -2, 0.25], dtype=np.float16)
    f["mask"] = np.array([True, False, True, True, False])
    f["ints/i16be"] = np.array([[1, -2], [300, -400]], dtype=">i2")
    f["count"] = np.int64(7)
    f["empty"] = np.zeros((0,), dtype=np.float32)
    f["blob"] = np.void(b"ab\x00cd")
    f["model.emb"] = np.array([9, 8], dtype=np.uint8)
    f.attrs["lr"] = "0.01"
    f.attrs["epoch"] = 3
    f.attrs["scale"] = 0.5
    f.attrs["tag"] = np.bytes_(b"abc")
    f.attrs["flag"] = True
)py";

inline void WritePlainFileWithCApi(const std::string& path) {
  H5Builder b(path);
  std::vector<float> w(12);
  for (int i = 0; i < 12; ++i) w[i] = i * 0.5f;
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  hsize_t chunk[2] = {2, 2};
  H5Pset_chunk(dcpl, 2, chunk);
  H5Pset_deflate(dcpl, 4);
  b.Dataset("/weights/w", H5T_IEEE_F32LE, std::vector<hsize_t>{3, 4}, w.data(),
            dcpl, H5T_NATIVE_FLOAT);
  H5Pclose(dcpl);
  double bv[4] = {1, -2, 3.5, 1e300};
  b.Dataset("/weights/b", H5T_IEEE_F64BE, std::vector<hsize_t>{4}, bv,
            H5P_DEFAULT, H5T_NATIVE_DOUBLE);
  float half[3] = {1.5f, -2.0f, 0.25f};
  interop::hdf5::Handle f16 = interop::hdf5::MakeFloat16Type().value();
  b.Dataset("/half", f16.get(), std::vector<hsize_t>{3}, half, H5P_DEFAULT,
            H5T_NATIVE_FLOAT);
  int8_t mask[5] = {1, 0, 1, 1, 0};
  interop::hdf5::Handle boolean = interop::hdf5::MakeBoolType().value();
  b.Dataset("/mask", boolean.get(), std::vector<hsize_t>{5}, mask);
  int16_t ints[4] = {1, -2, 300, -400};
  b.Dataset("/ints/i16be", H5T_STD_I16BE, std::vector<hsize_t>{2, 2}, ints,
            H5P_DEFAULT, H5T_NATIVE_INT16);
  int64_t count = 7;
  b.Dataset("/count", H5T_STD_I64LE, std::nullopt, &count, H5P_DEFAULT,
            H5T_NATIVE_INT64);
  b.Dataset("/empty", H5T_IEEE_F32LE, std::vector<hsize_t>{0});
  hid_t opaque = H5Tcreate(H5T_OPAQUE, 5);
  H5Tset_tag(opaque, "");
  b.Dataset("/blob", opaque, std::nullopt, "ab\0cd");
  H5Tclose(opaque);
  uint8_t emb[2] = {9, 8};
  b.Dataset("/model.emb", H5T_STD_U8LE, std::vector<hsize_t>{2}, emb);
  b.StringAttr(b.root(), "lr", "0.01");
  b.IntAttr(b.root(), "epoch", 3);
  double scale = 0.5;
  b.ScalarAttr(b.root(), "scale", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &scale);
  b.StringAttr(b.root(), "tag", "abc", /*vlen=*/false);
  int8_t flag = 1;
  b.ScalarAttr(b.root(), "flag", boolean.get(), boolean.get(), &flag);
}

template <typename T>
std::string LeBytes(std::initializer_list<T> values) {
  std::string out;
  for (T v : values) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));  // the test hosts are little-endian
    out.append(b, sizeof(T));
  }
  return out;
}

// What the import of the plain file at checkpoint `path` must hold.
inline void CheckPlainImport(const std::string& path, uint64_t step) {
  auto reader_or = Reader::Open(path);
  CKPT_ASSERT_OK(reader_or.status());
  auto& reader = **reader_or;
  const format::Manifest& m = reader.manifest();
  EXPECT_EQ(m.info.step, step);
  EXPECT_EQ(m.info.world_size, 1u);
  format::Metadata want_md = {{"epoch", "3"},
                              {"flag", "true"},
                              {"lr", "0.01"},
                              {"scale", "0.5"},
                              {"tag", "abc"}};
  EXPECT_EQ(m.metadata, want_md);
  struct Want {
    std::string name;
    format::EntryKind kind;
    DType dtype;
    Shape shape;
    std::string bytes;
  };
  std::vector<float> w(12);
  for (int i = 0; i < 12; ++i) w[i] = i * 0.5f;
  const std::vector<Want> want = {
      {"blob",
       format::EntryKind::kObject,
       DType::kUInt8,
       {5},
       std::string("ab\0cd", 5)},
      {"count",
       format::EntryKind::kTensor,
       DType::kInt64,
       {},
       LeBytes<int64_t>({7})},
      {"empty", format::EntryKind::kTensor, DType::kFloat32, {0}, ""},
      {"half",
       format::EntryKind::kTensor,
       DType::kFloat16,
       {3},
       LeBytes<uint16_t>({0x3E00, 0xC000, 0x3400})},
      {"ints.i16be",
       format::EntryKind::kTensor,
       DType::kInt16,
       {2, 2},
       LeBytes<int16_t>({1, -2, 300, -400})},
      {"mask",
       format::EntryKind::kTensor,
       DType::kBool,
       {5},
       std::string("\1\0\1\1\0", 5)},
      {"model.emb", format::EntryKind::kTensor, DType::kUInt8, {2}, "\x09\x08"},
      {"weights.b",
       format::EntryKind::kTensor,
       DType::kFloat64,
       {4},
       LeBytes<double>({1, -2, 3.5, 1e300})},
      {"weights.w",
       format::EntryKind::kTensor,
       DType::kFloat32,
       {3, 4},
       std::string(reinterpret_cast<const char*>(w.data()), 48)},
  };
  ASSERT_EQ(m.entries.size(), want.size());
  for (const Want& x : want) {
    SCOPED_TRACE(x.name);
    const format::EntryRecord* e = reader.Find(x.name);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->kind, x.kind);
    EXPECT_EQ(e->dtype, x.dtype);
    EXPECT_EQ(e->shape, x.shape);
    auto bytes = ReadWhole(reader, *e);
    CKPT_ASSERT_OK(bytes.status());
    EXPECT_TRUE(*bytes == x.bytes)
        << absl::CHexEscape(*bytes) << " vs " << absl::CHexEscape(x.bytes);
  }
}

// A python3 that has h5py, or "" (the h5py tests then skip).
inline std::string PythonWithH5py() {
  for (const std::string& py :
       {ckpt::testing::TestPython(), std::string("python3")}) {
    if (py.empty()) continue;
    std::string cmd =
        absl::StrCat(py, " -c 'import h5py, numpy' >/dev/null 2>&1");
    if (std::system(cmd.c_str()) == 0) return py;
  }
  return "";
}

// Runs `script` with `python` and `args`; returns its exit code, stdout in
// `out`.
inline int RunPython(const std::string& python, const std::string& script,
                     const std::string& args, const std::string& tmp_dir,
                     std::string* out) {
  const std::string py = tmp_dir + "/script.py";
  const std::string stdout_file = tmp_dir + "/script.out";
  std::ofstream(py) << script;
  std::string cmd = absl::StrCat(python, " ", py, " ", args, " >", stdout_file);
  int rc = std::system(cmd.c_str());
  *out = ReadFileBytes(stdout_file);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_INTEROP_HDF5_PLAIN_FILE_H_

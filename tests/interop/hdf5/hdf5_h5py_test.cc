// ckpt-convert and h5py, both ways: h5py reads an exported checkpoint with
// the numpy types of tools/README.md (ckpt-convert), and a file h5py writes
// imports. Skipped (with a message) where python3-h5py is not installed;
// the same import from a file made with the HDF5 C API always runs
// (hdf5_import_test.cc, Hdf5ImportTest.PlainFileBecomesAOneRankCheckpoint).
#include <map>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ckpt/interop/hdf5/hdf5_export.h"
#include "ckpt/interop/hdf5/hdf5_import.h"
#include "ckpt/interop/hdf5/hdf5_names.h"
#include "ckpt/interop/hdf5/hdf5_types.h"
#include "gtest/gtest.h"
#include "interop/hdf5/plain_file.h"
#include "testing/status_matchers.h"
#include "tools/convert/convert_fixture.h"

namespace ckpt::interop {
namespace {

using ::ckpt::testing::TempDir;

constexpr char kSkipMessage[] =
    "no Python with h5py and numpy (scripts/setup installs them into "
    ".venv/); the h5py part is skipped";

// Prints one line per dataset, "PATH|NUMPY_DTYPE|SHAPE|ATTRS|HEX_BYTES",
// then one per root attribute, "@NAME|VALUE" (arrays as "hex:...").
constexpr char kDumpScript[] = R"py(
import sys, h5py, numpy as np
out = []
with h5py.File(sys.argv[1], "r") as f:
    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            a = np.asarray(obj[()])
            attrs = ";".join("%s=%s" % (k, obj.attrs[k]) for k in sorted(obj.attrs))
            out.append("/%s|%s|%s|%s|%s" % (name, a.dtype.str, ",".join(map(str, obj.shape)),
                                            attrs, a.tobytes().hex()))
    f.visititems(visit)
    for k in sorted(f.attrs):
        v = f.attrs[k]
        if isinstance(v, np.ndarray):
            v = "hex:" + v.tobytes().hex()
        out.append("@%s|%s" % (k, v))
print("\n".join(out))
)py";

std::string NumpyDType(DType d) {
  switch (d) {
    case DType::kBool:
      return "|b1";
    case DType::kUInt8:
      return "|u1";
    case DType::kUInt16:
      return "<u2";
    case DType::kUInt32:
      return "<u4";
    case DType::kUInt64:
      return "<u8";
    case DType::kInt8:
      return "|i1";
    case DType::kInt16:
      return "<i2";
    case DType::kInt32:
      return "<i4";
    case DType::kInt64:
      return "<i8";
    case DType::kFloat16:
      return "<f2";
    case DType::kBFloat16:
      return "<u2";  // raw bits, with ckpt_dtype
    case DType::kFloat32:
      return "<f4";
    case DType::kFloat64:
      return "<f8";
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
      return "|u1";
  }
  return "?";
}

std::string Hex(const std::string& bytes) {
  return absl::BytesToHexString(bytes);
}

TEST(ConvertH5py, ReadsTheExportedCheckpoint) {
  const std::string python = ckpt::testing::PythonWithH5py();
  if (python.empty()) GTEST_SKIP() << kSkipMessage;
  TempDir dir;
  ckpt::testing::Fixture fx = ckpt::testing::MakeFixture();
  CKPT_ASSERT_OK(ckpt::testing::WriteFixture(fx, dir / "src", 3));
  CKPT_ASSERT_OK(ExportHdf5(dir / "src", dir / "out.h5", {}).status());
  std::string out;
  ASSERT_EQ(ckpt::testing::RunPython(python, kDumpScript, dir / "out.h5",
                                     dir.path(), &out),
            0);

  std::map<std::string, std::string> got;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv =
        absl::StrSplit(line, absl::MaxSplits('|', 1));
    got[kv.first] = kv.second;
  }
  std::map<std::string, std::string> want;
  auto paths = hdf5::DatasetPaths([&] {
    std::vector<std::string> names;
    for (const auto& t : fx.tensors) names.push_back(t.name);
    for (const auto& o : fx.objects) names.push_back(o.first);
    return names;
  }());
  CKPT_ASSERT_OK(paths.status());
  size_t i = 0;
  for (const auto& t : fx.tensors) {
    want[(*paths)[i++]] =
        absl::StrCat(NumpyDType(t.dtype), "|", absl::StrJoin(t.shape, ","), "|",
                     hdf5::StoredRaw(t.dtype)
                         ? absl::StrCat("ckpt_dtype=", DTypeName(t.dtype))
                         : "",
                     "|", Hex(t.global));
  }
  for (const auto& [name, bytes] : fx.objects) {
    want[(*paths)[i++]] =
        absl::StrCat("|u1|", bytes.size(), "|ckpt_kind=object|", Hex(bytes));
  }
  want["@ckpt_format_version"] = "1.0";
  want["@ckpt_step"] = "42";
  want["@ckpt_world_size"] = "3";
  want["@lr"] = "0.001";
  want["@ckpt_ckpt_note"] = "a user key with the reserved prefix";
  want["@blob"] = "hex:0001fe";
  want["@empty"] = "";
  want["@unicode"] = "h\xc3\xa9llo";
  want["@."] = "a key that is one dot";
  for (const auto& [key, value] : want) {
    auto it = got.find(key);
    ASSERT_NE(it, got.end()) << key << " not in h5py's output:\n" << out;
    EXPECT_EQ(it->second, value) << key;
  }
}

TEST(ConvertH5py, WrittenFileImports) {
  const std::string python = ckpt::testing::PythonWithH5py();
  if (python.empty()) GTEST_SKIP() << kSkipMessage;
  TempDir dir;
  std::string out;
  ASSERT_EQ(ckpt::testing::RunPython(python, ckpt::testing::kPlainFileH5py,
                                     dir / "in.h5", dir.path(), &out),
            0);
  Hdf5ImportOptions o;
  o.step = 5;
  CKPT_ASSERT_OK(ImportHdf5(dir / "in.h5", dir / "ckpt", o).status());
  ckpt::testing::CheckPlainImport(dir / "ckpt", 5);
}

}  // namespace
}  // namespace ckpt::interop

// ckpt-convert --from hdf5 (ckpt/interop/hdf5/hdf5_import.h): plain files,
// every way a file can break the rules, and the element reader.
#include "ckpt/interop/hdf5/hdf5_import.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "ckpt/interop/hdf5/hdf5_export.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "interop/hdf5/h5_builder.h"
#include "interop/hdf5/plain_file.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/convert/convert_fixture.h"

namespace ckpt::interop {
namespace {

using ::ckpt::testing::H5Builder;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;
using hdf5::Handle;
using hdf5::Hdf5Lock;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<ImportPlan> Plan(const std::string& path, bool skip = false) {
  Hdf5Lock lock;
  CKPT_ASSIGN_OR_RETURN(Handle f, OpenHdf5File(path));
  PlanOptions o;
  o.skip_unsupported = skip;
  return PlanImport(f.get(), o);
}

std::vector<std::string> Names(const ImportPlan& p) {
  std::vector<std::string> out;
  for (const auto& e : p.entries) out.push_back(e.name);
  return out;
}

class Hdf5ImportTest : public ::testing::Test {
 protected:
  std::string File() const { return dir_ / "in.h5"; }
  TempDir dir_;
  float f4_[4] = {1, 2, 3, 4};
};

TEST_F(Hdf5ImportTest, PlainFileBecomesAOneRankCheckpoint) {
  ckpt::testing::WritePlainFileWithCApi(File());
  CKPT_ASSERT_OK_AND_ASSIGN(Hdf5ImportResult r,
                            ImportHdf5(File(), dir_ / "ckpt", {}));
  EXPECT_EQ(r.step, 0u);
  EXPECT_EQ(r.saved.path, dir_ / "ckpt/step-00000000");
  ckpt::testing::CheckPlainImport(dir_ / "ckpt", 0);
}

TEST_F(Hdf5ImportTest, StepOptionWinsOverTheFile) {
  {
    H5Builder b(File());
    b.Dataset("/x", H5T_IEEE_F32LE, std::vector<hsize_t>{4}, f4_, H5P_DEFAULT,
              H5T_NATIVE_FLOAT);
    uint64_t step = 9;
    b.ScalarAttr(b.root(), "ckpt_step", H5T_STD_U64LE, H5T_NATIVE_UINT64,
                 &step);
  }
  CKPT_ASSERT_OK_AND_ASSIGN(auto r, ImportHdf5(File(), dir_ / "a", {}));
  EXPECT_EQ(r.saved.path, dir_ / "a/step-00000009");
  Hdf5ImportOptions o;
  o.step = 3;
  CKPT_ASSERT_OK_AND_ASSIGN(r, ImportHdf5(File(), dir_ / "a", o));
  EXPECT_EQ(r.saved.path, dir_ / "a/step-00000003");
}

TEST_F(Hdf5ImportTest, FileImageGivesTheSamePlan) {
  ckpt::testing::WritePlainFileWithCApi(File());
  const std::string bytes = ckpt::testing::ReadFileBytes(File());
  CKPT_ASSERT_OK_AND_ASSIGN(ImportPlan from_file, Plan(File()));
  Hdf5Lock lock;
  CKPT_ASSERT_OK_AND_ASSIGN(Handle image, OpenHdf5Image(bytes));
  CKPT_ASSERT_OK_AND_ASSIGN(ImportPlan from_image, PlanImport(image.get()));
  EXPECT_EQ(Names(from_image), Names(from_file));
  EXPECT_EQ(from_image.metadata, from_file.metadata);
  // Truncated images fail cleanly at open or plan time.
  for (size_t n : {size_t{0}, size_t{7}, bytes.size() / 2, bytes.size() - 1}) {
    auto f = OpenHdf5Image(absl::string_view(bytes.data(), n));
    if (f.ok()) (void)PlanImport(f->get());
  }
  EXPECT_THAT(OpenHdf5Image("not hdf5 at all"),
              StatusIs(absl::StatusCode::kInvalidArgument, "file image"));
}

TEST_F(Hdf5ImportTest, MissingFile) {
  EXPECT_THAT(
      ImportHdf5(dir_ / "nothing.h5", dir_ / "ckpt", {}),
      StatusIs(absl::StatusCode::kNotFound, dir_ / "nothing.h5: no such file"));
}

TEST_F(Hdf5ImportTest, NotAnHdf5File) {
  std::ofstream(File()) << "just text\n";
  EXPECT_THAT(ImportHdf5(File(), dir_ / "ckpt", {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       File() + ": not an HDF5 file"));
  EXPECT_THAT(ImportHdf5(dir_.path(), dir_ / "ckpt", {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "is a directory, not an HDF5 file"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "ckpt"));
}

TEST_F(Hdf5ImportTest, StepAlreadyExists) {
  ckpt::testing::WritePlainFileWithCApi(File());
  CKPT_ASSERT_OK(ImportHdf5(File(), dir_ / "ckpt", {}).status());
  EXPECT_THAT(
      ImportHdf5(File(), dir_ / "ckpt", {}),
      StatusIs(
          absl::StatusCode::kAlreadyExists,
          dir_ /
              "ckpt/step-00000000: a checkpoint of step 0 already exists (use "
              "--force to replace it)"));
  Hdf5ImportOptions o;
  o.overwrite = true;
  CKPT_ASSERT_OK(ImportHdf5(File(), dir_ / "ckpt", o).status());
  ckpt::testing::CheckPlainImport(dir_ / "ckpt", 0);
}

TEST_F(Hdf5ImportTest, DestinationIsAFile) {
  ckpt::testing::WritePlainFileWithCApi(File());
  std::ofstream(dir_ / "file") << "x";
  EXPECT_THAT(ImportHdf5(File(), dir_ / "file", {}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       dir_ / "file: exists and is not a directory"));
}

TEST_F(Hdf5ImportTest, UnsupportedTypesNameTheDatasetAndType) {
  {
    H5Builder b(File());
    b.Dataset("/ok", H5T_IEEE_F32LE, std::vector<hsize_t>{4}, f4_, H5P_DEFAULT,
              H5T_NATIVE_FLOAT);
    hid_t compound = H5Tcreate(H5T_COMPOUND, 8);
    H5Tinsert(compound, "a", 0, H5T_STD_I32LE);
    H5Tinsert(compound, "b", 4, H5T_IEEE_F32LE);
    b.Dataset("/c", compound, std::vector<hsize_t>{2});
    H5Tclose(compound);
    hid_t str = H5Tcopy(H5T_C_S1);
    H5Tset_size(str, H5T_VARIABLE);
    b.Dataset("/s", str, std::vector<hsize_t>{2});
    H5Tclose(str);
    b.Dataset("/r", H5T_STD_REF_OBJ, std::vector<hsize_t>{1});
    hsize_t adim = 3;
    hid_t arr = H5Tarray_create2(H5T_STD_I32LE, 1, &adim);
    b.Dataset("/a", arr, std::vector<hsize_t>{2});
    H5Tclose(arr);
    hid_t en = H5Tenum_create(H5T_STD_I8LE);
    int8_t v0 = 0, v1 = 1, v2 = 2;
    H5Tenum_insert(en, "RED", &v0);
    H5Tenum_insert(en, "GREEN", &v1);
    H5Tenum_insert(en, "BLUE", &v2);
    b.Dataset("/e", en, std::vector<hsize_t>{2});
    H5Tclose(en);
    hid_t odd = H5Tcopy(H5T_STD_I32LE);
    H5Tset_precision(odd, 20);
    b.Dataset("/p", odd, std::vector<hsize_t>{2});
    H5Tclose(odd);
    b.Dataset("/long_double", H5T_NATIVE_LDOUBLE, std::vector<hsize_t>{2});
    b.Dataset("/null", H5T_IEEE_F32LE, std::vector<hsize_t>{});
  }
  EXPECT_THAT(Plan(File()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "dataset '/a': unsupported HDF5 type array"));
  CKPT_ASSERT_OK_AND_ASSIGN(ImportPlan p, Plan(File(), /*skip=*/true));
  EXPECT_THAT(Names(p), ElementsAre("ok"));
  std::vector<std::string> reasons;
  for (const auto& s : p.skipped) reasons.push_back(s.what + " -> " + s.reason);
  EXPECT_THAT(
      reasons,
      ElementsAre(
          "/a -> dataset '/a': unsupported HDF5 type array",
          "/c -> dataset '/c': unsupported HDF5 type compound (2 members)",
          "/e -> dataset '/e': unsupported HDF5 type enum (3 members, 1 bytes)",
          HasSubstr("/long_double -> dataset '/long_double': unsupported HDF5 "
                    "type float ("),
          "/null -> dataset '/null': null dataspace (no shape, as h5py.Empty "
          "writes)",
          "/p -> dataset '/p': unsupported HDF5 type int (20 bits in 4 bytes)",
          "/r -> dataset '/r': unsupported HDF5 type reference",
          "/s -> dataset '/s': unsupported HDF5 type variable-length string"));
  // The skipped datasets are not in the checkpoint; the rest is.
  Hdf5ImportOptions o;
  o.plan.skip_unsupported = true;
  CKPT_ASSERT_OK_AND_ASSIGN(auto r, ImportHdf5(File(), dir_ / "ckpt", o));
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir_ / "ckpt"));
  EXPECT_EQ(reader->manifest().entries.size(), 1u);
}

TEST_F(Hdf5ImportTest, TwoDatasetsWithOneEntryName) {
  {
    H5Builder b(File());
    b.Dataset("/x.y", H5T_IEEE_F32LE, std::vector<hsize_t>{4}, f4_, H5P_DEFAULT,
              H5T_NATIVE_FLOAT);
    b.Dataset("/x/y", H5T_IEEE_F32LE, std::vector<hsize_t>{4}, f4_, H5P_DEFAULT,
              H5T_NATIVE_FLOAT);
  }
  EXPECT_THAT(
      Plan(File()),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "dataset '/x/y' and dataset '/x.y' both map to entry 'x.y'"));
  CKPT_ASSERT_OK_AND_ASSIGN(ImportPlan p, Plan(File(), true));
  EXPECT_THAT(Names(p), ElementsAre("x.y"));
  EXPECT_EQ(p.entries[0].path, "/x.y");
  ASSERT_EQ(p.skipped.size(), 1u);
  EXPECT_EQ(p.skipped[0].what, "/x/y");
}

TEST_F(Hdf5ImportTest, PathThatIsNoEntryName) {
  {
    H5Builder b(File());
    b.Dataset("/a..b", H5T_IEEE_F32LE, std::vector<hsize_t>{4}, f4_,
              H5P_DEFAULT, H5T_NATIVE_FLOAT);
  }
  EXPECT_THAT(Plan(File()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "dataset '/a..b' has no valid entry name: invalid name "
                       "'a..b': contains '..'"));
}

TEST_F(Hdf5ImportTest, ControlCharacterInALinkName) {
  {
    H5Builder b(File());
    b.Dataset("/bad\x01name", H5T_IEEE_F32LE, std::vector<hsize_t>{4}, f4_,
              H5P_DEFAULT, H5T_NATIVE_FLOAT);
  }
  EXPECT_THAT(Plan(File()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "dataset '/bad\\x01name' has no valid entry name"));
}

TEST_F(Hdf5ImportTest, ReservedLinkNamesMapBack) {
  {
    H5Builder b(File());
    for (const char* p :
         {"/opt/w/.self", "/opt/w/m", "/.empty/h", "/t/.empty"}) {
      b.Dataset(p, H5T_IEEE_F32LE, std::vector<hsize_t>{4}, f4_, H5P_DEFAULT,
                H5T_NATIVE_FLOAT);
    }
  }
  CKPT_ASSERT_OK_AND_ASSIGN(ImportPlan p, Plan(File()));
  EXPECT_THAT(Names(p), ElementsAre(".h", "opt.w", "opt.w.m", "t."));
}

TEST_F(Hdf5ImportTest, DTypeAttributeOfTheWrongType) {
  {
    H5Builder b(File());
    hid_t ds = b.Dataset("/x", H5T_STD_U16LE, std::vector<hsize_t>{2});
    b.IntAttr(ds, "ckpt_dtype", 11);
  }
  EXPECT_THAT(Plan(File()), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "dataset '/x': attribute 'ckpt_dtype': "
                                     "expected a string or a 1-d byte "
                                     "array, found int64 with 1 elements"));
}

TEST_F(Hdf5ImportTest, DTypeAttributeUnknown) {
  {
    H5Builder b(File());
    hid_t ds = b.Dataset("/x", H5T_STD_U16LE, std::vector<hsize_t>{2});
    b.StringAttr(ds, "ckpt_dtype", "bfloat17");
  }
  EXPECT_THAT(Plan(File()), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "dataset '/x': attribute ckpt_dtype: "));
  EXPECT_THAT(Plan(File()),
              StatusIs(absl::StatusCode::kInvalidArgument, "bfloat17"));
}

TEST_F(Hdf5ImportTest, DTypeAttributeDoesNotFitTheType) {
  {
    H5Builder b(File());
    hid_t ds = b.Dataset("/f32", H5T_IEEE_F32LE, std::vector<hsize_t>{2});
    b.StringAttr(ds, "ckpt_dtype", "bfloat16");
    ds = b.Dataset("/u8", H5T_STD_U8LE, std::vector<hsize_t>{2});
    b.StringAttr(ds, "ckpt_dtype", "bfloat16");
    ds = b.Dataset("/i32", H5T_STD_I32LE, std::vector<hsize_t>{2});
    b.StringAttr(ds, "ckpt_dtype", "float32");
  }
  CKPT_ASSERT_OK_AND_ASSIGN(ImportPlan p, Plan(File(), true));
  ASSERT_EQ(p.skipped.size(), 3u);
  EXPECT_EQ(p.skipped[0].reason,
            "dataset '/f32': attribute ckpt_dtype is 'bfloat16', which is "
            "stored as 16-bit "
            "integers, but the HDF5 type is float (4 bytes, 32-bit precision)");
  EXPECT_EQ(p.skipped[1].reason,
            "dataset '/i32': attribute ckpt_dtype is 'float32' but the HDF5 "
            "type is int32");
  EXPECT_EQ(p.skipped[2].reason,
            "dataset '/u8': attribute ckpt_dtype is 'bfloat16', which is "
            "stored as 16-bit "
            "integers, but the HDF5 type is uint8");
}

TEST_F(Hdf5ImportTest, RawDTypeFromASignedOrBigEndianInteger) {
  {
    H5Builder b(File());
    uint16_t bits[2] = {0x3F80, 0xBF80};  // bfloat16 1.0, -1.0
    hid_t ds = b.Dataset("/be", H5T_STD_I16BE, std::vector<hsize_t>{2}, bits,
                         H5P_DEFAULT, H5T_NATIVE_UINT16);
    b.StringAttr(ds, "ckpt_dtype", "bfloat16");
  }
  CKPT_ASSERT_OK(ImportHdf5(File(), dir_ / "ckpt", {}).status());
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir_ / "ckpt"));
  const format::EntryRecord* e = reader->Find("be");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dtype, DType::kBFloat16);
  CKPT_ASSERT_OK_AND_ASSIGN(std::string bytes,
                            ckpt::testing::ReadWhole(*reader, *e));
  EXPECT_EQ(bytes, ckpt::testing::LeBytes<uint16_t>({0x3F80, 0xBF80}));
}

TEST_F(Hdf5ImportTest, KindAttributeProblems) {
  {
    H5Builder b(File());
    hid_t ds = b.Dataset("/f", H5T_IEEE_F32LE, std::vector<hsize_t>{4});
    b.StringAttr(ds, "ckpt_kind", "object");
    ds = b.Dataset("/u2d", H5T_STD_U8LE, std::vector<hsize_t>{2, 2});
    b.StringAttr(ds, "ckpt_kind", "object");
    ds = b.Dataset("/w", H5T_STD_U8LE, std::vector<hsize_t>{2});
    b.StringAttr(ds, "ckpt_kind", "weights");
    hid_t opaque = H5Tcreate(H5T_OPAQUE, 2);
    ds = b.Dataset("/o", opaque, std::vector<hsize_t>{2});
    b.StringAttr(ds, "ckpt_kind", "tensor");
    b.Dataset("/o2d", opaque, std::vector<hsize_t>{2, 2});
    H5Tclose(opaque);
  }
  CKPT_ASSERT_OK_AND_ASSIGN(ImportPlan p, Plan(File(), true));
  std::vector<std::string> reasons;
  for (const auto& s : p.skipped) reasons.push_back(s.reason);
  EXPECT_THAT(
      reasons,
      ElementsAre(
          "dataset '/f': attribute ckpt_kind is 'object' but the dataset is "
          "float (4 bytes, 32-bit precision) [4], not a 1-d array of uint8",
          "dataset '/o': an opaque dataset can only be an object",
          "dataset '/o2d': an opaque dataset must be a scalar or 1-d, not [2, "
          "2]",
          "dataset '/u2d': attribute ckpt_kind is 'object' but the dataset is "
          "uint8 [2, 2], not a 1-d array of uint8",
          "dataset '/w': attribute ckpt_kind is 'weights', not 'object' or "
          "'tensor'"));
}

TEST_F(Hdf5ImportTest, OpaqueDatasetsAreObjects) {
  {
    H5Builder b(File());
    hid_t opaque = H5Tcreate(H5T_OPAQUE, 3);
    b.Dataset("/one", opaque, std::vector<hsize_t>{2}, "abcdef");
    H5Tclose(opaque);
  }
  CKPT_ASSERT_OK(ImportHdf5(File(), dir_ / "ckpt", {}).status());
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir_ / "ckpt"));
  auto bytes = reader->ReadObject("one");
  CKPT_ASSERT_OK(bytes.status());
  EXPECT_EQ(*bytes, "abcdef");
}

TEST_F(Hdf5ImportTest, RootStepOfTheWrongType) {
  {
    H5Builder b(File());
    b.StringAttr(b.root(), "ckpt_step", "42");
  }
  EXPECT_THAT(
      Plan(File()),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "root group: attribute 'ckpt_step': expected one integer, "
               "found variable-length string"));
  CKPT_ASSERT_OK_AND_ASSIGN(ImportPlan p, Plan(File(), true));
  ASSERT_EQ(p.skipped.size(), 1u);
  EXPECT_EQ(p.skipped[0].what, "/@ckpt_step");
  EXPECT_FALSE(p.step.has_value());
}

TEST_F(Hdf5ImportTest, RootStepNegative) {
  {
    H5Builder b(File());
    b.IntAttr(b.root(), "ckpt_step", -1);
  }
  EXPECT_THAT(Plan(File()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "root group: attribute 'ckpt_step': negative value -1"));
}

TEST_F(Hdf5ImportTest, NewerFormatVersionIsRefusedEvenWhenSkipping) {
  {
    H5Builder b(File());
    b.StringAttr(b.root(), "ckpt_format_version", "2.0");
  }
  EXPECT_THAT(
      Plan(File(), true),
      StatusIs(
          absl::StatusCode::kFailedPrecondition,
          "root attribute 'ckpt_format_version': the file was written for ckpt "
          "format v2, this tool reads v1"));
}

TEST_F(Hdf5ImportTest, RootAttributesBecomeMetadataInCreationOrder) {
  {
    H5Builder b(File(), /*track_order=*/true);
    b.StringAttr(b.root(), "zeta", "1");
    b.StringAttr(b.root(), "ckpt_ckpt_x", "escaped");
    b.StringAttr(b.root(), "ckpt_future_field", "ignored");
    b.StringAttr(b.root(), "alpha", std::string(1 << 20, 'a'));
    uint8_t bytes[3] = {0, 1, 255};
    hsize_t n = 3;
    hid_t space = H5Screate_simple(1, &n, nullptr);
    hid_t a = H5Acreate2(b.root(), "blob", H5T_STD_U8LE, space, H5P_DEFAULT,
                         H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_UINT8, bytes);
    H5Aclose(a);
    H5Sclose(space);
  }
  CKPT_ASSERT_OK_AND_ASSIGN(ImportPlan p, Plan(File()));
  ASSERT_EQ(p.metadata.size(), 4u);
  EXPECT_EQ(p.metadata[0],
            std::make_pair(std::string("zeta"), std::string("1")));
  EXPECT_EQ(p.metadata[1],
            std::make_pair(std::string("ckpt_x"), std::string("escaped")));
  EXPECT_EQ(p.metadata[2].first, "alpha");
  EXPECT_EQ(p.metadata[2].second.size(), 1u << 20);
  EXPECT_EQ(p.metadata[3],
            std::make_pair(std::string("blob"), std::string("\0\1\xff", 3)));
}

TEST_F(Hdf5ImportTest, MetadataValueTooLong) {
  {
    H5Builder b(File());
    b.StringAttr(b.root(), "big", std::string((1 << 20) + 1, 'a'));
  }
  EXPECT_THAT(
      Plan(File()),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "root attribute 'big': 1048577 bytes, the limit is 1048576"));
}

TEST_F(Hdf5ImportTest, RootAttributeThatIsNoMetadata) {
  {
    H5Builder b(File());
    hsize_t n = 2;
    hid_t space = H5Screate_simple(1, &n, nullptr);
    hid_t a = H5Acreate2(b.root(), "vec", H5T_IEEE_F64LE, space, H5P_DEFAULT,
                         H5P_DEFAULT);
    double v[2] = {1, 2};
    H5Awrite(a, H5T_NATIVE_DOUBLE, v);
    H5Aclose(a);
    H5Sclose(space);
  }
  EXPECT_THAT(
      Plan(File()),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          "root attribute 'vec': expected a string or a 1-d byte array, found "
          "float (8 bytes, 64-bit precision) with 2 elements"));
}

TEST_F(Hdf5ImportTest, ExternalRawDataIsNeverRead) {
  std::ofstream(dir_ / "secret") << "secret data, 16B";
  {
    H5Builder b(File());
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, (dir_ / "secret").c_str(), 0, 16);
    b.Dataset("/ext", H5T_STD_U8LE, std::vector<hsize_t>{16}, nullptr, dcpl);
    H5Pclose(dcpl);
  }
  EXPECT_THAT(Plan(File()), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "dataset '/ext': its raw data is in "
                                     "external files, which are never read"));
}

TEST_F(Hdf5ImportTest, HugeChunksAreRefused) {
  {
    H5Builder b(File());
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t chunk[2] = {1 << 15, 1 << 14};  // 512 MiB of uint8
    H5Pset_chunk(dcpl, 2, chunk);
    b.Dataset("/big", H5T_STD_U8LE, std::vector<hsize_t>{1 << 20, 1 << 20},
              nullptr, dcpl);
    H5Pclose(dcpl);
  }
  EXPECT_THAT(Plan(File()), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "dataset '/big': HDF5 chunks of more than "
                                     "268435456 bytes are not read"));
}

TEST_F(Hdf5ImportTest, ShapeBeyondTheFormatLimits) {
  {
    H5Builder b(File());
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t chunk[2] = {1, 1};
    H5Pset_chunk(dcpl, 2, chunk);
    b.Dataset("/huge", H5T_IEEE_F64LE,
              std::vector<hsize_t>{1ull << 40, 1ull << 22}, nullptr, dcpl);
    H5Pclose(dcpl);
  }
  EXPECT_THAT(Plan(File()),
              StatusIs(absl::StatusCode::kInvalidArgument, "dataset '/huge'"));
}

TEST_F(Hdf5ImportTest, LinksOtherThanHardLinksAreNotFollowed) {
  {
    H5Builder b(File());
    b.Dataset("/g/x", H5T_IEEE_F32LE, std::vector<hsize_t>{4}, f4_, H5P_DEFAULT,
              H5T_NATIVE_FLOAT);
    H5Lcreate_soft("/g/x", b.file(), "/soft", H5P_DEFAULT, H5P_DEFAULT);
    H5Lcreate_external((dir_ / "other.h5").c_str(), "/y", b.file(), "/ext",
                       H5P_DEFAULT, H5P_DEFAULT);
    H5Lcreate_hard(b.file(), "/g/x", b.file(), "/alias", H5P_DEFAULT,
                   H5P_DEFAULT);
    H5Lcreate_hard(b.file(), "/", b.file(), "/g/loop", H5P_DEFAULT,
                   H5P_DEFAULT);
  }
  CKPT_ASSERT_OK_AND_ASSIGN(ImportPlan p, Plan(File()));
  // One entry: the hard-link alias and the cycle back to the root are
  // visited once; the soft and the external link are not followed.
  ASSERT_EQ(p.entries.size(), 1u);
  EXPECT_TRUE(p.entries[0].name == "alias" || p.entries[0].name == "g.x")
      << p.entries[0].name;
}

TEST_F(Hdf5ImportTest, BoolOtherThanZeroOrOneIsDataLoss) {
  {
    H5Builder b(File());
    int8_t v[3] = {0, 1, 2};
    CKPT_ASSERT_OK_AND_ASSIGN(Handle boolean, hdf5::MakeBoolType());
    b.Dataset("/m", boolean.get(), std::vector<hsize_t>{3}, v);
  }
  EXPECT_THAT(
      ImportHdf5(File(), dir_ / "ckpt", {}),
      StatusIs(absl::StatusCode::kDataLoss,
               File() + ": dataset '/m': element 2 is 2, not a bool (0 or 1)"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "ckpt/step-00000000"));
}

TEST_F(Hdf5ImportTest, ReadElementsOfAnyFlatRange) {
  const Shape shape = {3, 4, 5};
  std::vector<int32_t> all(60);
  for (int i = 0; i < 60; ++i) all[i] = i * 7 - 100;
  {
    H5Builder b(File());
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t chunk[3] = {2, 3, 2};
    H5Pset_chunk(dcpl, 3, chunk);
    H5Pset_deflate(dcpl, 1);
    b.Dataset("/t", H5T_STD_I32BE, std::vector<hsize_t>{3, 4, 5}, all.data(),
              dcpl, H5T_NATIVE_INT32);
    H5Pclose(dcpl);
  }
  Hdf5Lock lock;
  CKPT_ASSERT_OK_AND_ASSIGN(Handle f, OpenHdf5File(File()));
  CKPT_ASSERT_OK_AND_ASSIGN(ImportPlan p, PlanImport(f.get()));
  ASSERT_EQ(p.entries.size(), 1u);
  for (uint64_t start = 0; start < 60; ++start) {
    for (uint64_t count = 1; start + count <= 60; count += 1 + count / 3) {
      std::vector<int32_t> got(count);
      CKPT_ASSERT_OK(
          ReadElements(f.get(), p.entries[0], start, count, got.data()));
      ASSERT_EQ(got, std::vector<int32_t>(all.begin() + start,
                                          all.begin() + start + count))
          << start << "+" << count;
    }
  }
}

TEST(Hdf5FlatRangeBoxes, CoverExactlyTheRangeInOrder) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 300; ++iter) {
    Shape shape;
    const int nd = 1 + rng() % 4;
    for (int d = 0; d < nd; ++d) shape.push_back(1 + rng() % 5);
    const uint64_t n = ckpt::testing::Numel(shape);
    const uint64_t start = rng() % n;
    const uint64_t count = 1 + rng() % (n - start);
    std::vector<Box> boxes = FlatRangeBoxes(shape, start, count);
    EXPECT_LE(boxes.size(), static_cast<size_t>(2 * nd - 1));
    // The boxes' elements, in order, are exactly start, start + 1, ...
    uint64_t next = start;
    for (const Box& b : boxes) {
      std::vector<uint64_t> idx;
      ForEachRun(shape, b, FlatRange{0, n},
                 [&](uint64_t, uint64_t dst, uint64_t len) {
                   for (uint64_t k = 0; k < len; ++k) idx.push_back(dst + k);
                 });
      for (uint64_t g : idx)
        ASSERT_EQ(g, next++) << ShapeToString(shape) << " " << start;
    }
    EXPECT_EQ(next, start + count);
  }
}

}  // namespace
}  // namespace ckpt::interop

// ckpt-convert --to hdf5 (ckpt/interop/hdf5/hdf5_export.h): the file read back
// through the HDF5 C API, and the round trip through ImportHdf5.
#include "ckpt/interop/hdf5/hdf5_export.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "ckpt/interop/hdf5/hdf5_import.h"
#include "ckpt/interop/hdf5/hdf5_types.h"
#include "ckpt/interop/hdf5/hdf5_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/convert/convert_fixture.h"

namespace ckpt::interop {
namespace {

using ::ckpt::testing::Fixture;
using ::ckpt::testing::FixtureTensor;
using ::ckpt::testing::MakeFixture;
using ::ckpt::testing::SameContent;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteFixture;
using hdf5::Handle;
using hdf5::Hdf5Lock;

// Small chunks and slabs, so that every tensor of the fixture is written in
// several slabs of several chunks and batches hold several slabs.
Hdf5ExportOptions SmallPieces() {
  Hdf5ExportOptions o;
  o.chunk_bytes = 16;
  o.slab_bytes = 48;
  return o;
}

// The dataset of each fixture tensor, by the mapping of hdf5_names.h.
std::string PathOf(const std::string& name) {
  if (name == "opt.w") return "/opt/w/.self";
  if (name == ".hidden") return "/.empty/hidden";
  if (name == "trailing.") return "/trailing/.empty";
  std::string p = "/" + name;
  std::replace(p.begin(), p.end(), '.', '/');
  return p;
}

class Hdf5ExportTest : public ::testing::TestWithParam<format::Codec> {
 protected:
  void SetUp() override {
    fixture_ = MakeFixture();
    CKPT_ASSERT_OK(WriteFixture(fixture_, dir_ / "src", 4, GetParam()));
  }
  Fixture fixture_;
  TempDir dir_;
};

TEST_P(Hdf5ExportTest, DatasetsReadBackThroughTheHdf5CApi) {
  CKPT_ASSERT_OK_AND_ASSIGN(
      Hdf5ExportResult r,
      ExportHdf5(dir_ / "src", dir_ / "out.h5", SmallPieces()));
  EXPECT_EQ(r.entries.size(),
            fixture_.tensors.size() + fixture_.objects.size());
  EXPECT_EQ(r.output, dir_ / "out.h5");
  EXPECT_EQ(r.info.world_size, 4u);

  Hdf5Lock lock;
  CKPT_ASSERT_OK_AND_ASSIGN(Handle file, OpenHdf5File(dir_ / "out.h5"));
  for (const FixtureTensor& t : fixture_.tensors) {
    SCOPED_TRACE(t.name);
    const std::string path = PathOf(t.name);
    Handle ds(H5Dopen2(file.get(), path.c_str(), H5P_DEFAULT));
    ASSERT_TRUE(ds.valid()) << path;
    Handle type(H5Dget_type(ds.get()));
    Handle space(H5Dget_space(ds.get()));
    // Shape.
    if (t.shape.empty()) {
      EXPECT_EQ(H5Sget_simple_extent_type(space.get()), H5S_SCALAR);
    } else {
      ASSERT_EQ(H5Sget_simple_extent_ndims(space.get()),
                static_cast<int>(t.shape.size()));
      std::vector<hsize_t> dims(t.shape.size());
      H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
      EXPECT_EQ(std::vector<uint64_t>(dims.begin(), dims.end()),
                std::vector<uint64_t>(t.shape.begin(), t.shape.end()));
    }
    // Type: native where HDF5 has one, raw bits plus ckpt_dtype otherwise.
    EXPECT_EQ(H5Tget_size(type.get()), static_cast<size_t>(DTypeSize(t.dtype)));
    CKPT_ASSERT_OK_AND_ASSIGN(
        auto attr, hdf5::ReadBytesAttribute(ds.get(), "ckpt_dtype", 64, path));
    switch (t.dtype) {
      case DType::kBool:
        EXPECT_EQ(H5Tget_class(type.get()), H5T_ENUM);
        break;
      case DType::kFloat16:
      case DType::kFloat32:
      case DType::kFloat64:
        EXPECT_EQ(H5Tget_class(type.get()), H5T_FLOAT);
        break;
      default:
        EXPECT_EQ(H5Tget_class(type.get()), H5T_INTEGER);
        EXPECT_EQ(H5Tget_order(type.get()), H5T_ORDER_LE);
        break;
    }
    if (hdf5::StoredRaw(t.dtype)) {
      ASSERT_TRUE(attr.has_value());
      EXPECT_EQ(*attr, DTypeName(t.dtype));
      EXPECT_EQ(H5Tget_sign(type.get()), H5T_SGN_NONE);
    } else {
      EXPECT_FALSE(attr.has_value());
      CKPT_ASSERT_OK_AND_ASSIGN(hdf5::ImportType it,
                                hdf5::ClassifyType(type.get(), {}, path));
      EXPECT_EQ(it.dtype, t.dtype);
    }
    // Layout: chunked with shuffle and deflate unless there is no element
    // or the tensor is a scalar.
    Handle dcpl(H5Dget_create_plist(ds.get()));
    const bool has_elements = !t.global.empty() && !t.shape.empty();
    EXPECT_EQ(H5Pget_layout(dcpl.get()),
              has_elements ? H5D_CHUNKED : H5D_CONTIGUOUS);
    if (has_elements) {
      const int nfilters = H5Pget_nfilters(dcpl.get());
      ASSERT_EQ(nfilters, DTypeSize(t.dtype) > 1 ? 2 : 1);
      unsigned flags;
      size_t n = 0;
      unsigned cfg;
      EXPECT_EQ(H5Pget_filter2(dcpl.get(), nfilters - 1, &flags, &n, nullptr, 0,
                               nullptr, &cfg),
                H5Z_FILTER_DEFLATE);
    }
    // Values, bit for bit (the file type is the ckpt layout).
    std::string got(t.global.size(), '\0');
    if (!got.empty()) {
      ASSERT_GE(H5Dread(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                        got.data()),
                0);
    }
    EXPECT_TRUE(got == t.global);
  }
  // Objects: 1-d uint8 with ckpt_kind = "object".
  for (const auto& [name, bytes] : fixture_.objects) {
    SCOPED_TRACE(name);
    const std::string path = PathOf(name);
    Handle ds(H5Dopen2(file.get(), path.c_str(), H5P_DEFAULT));
    ASSERT_TRUE(ds.valid());
    CKPT_ASSERT_OK_AND_ASSIGN(
        auto kind, hdf5::ReadBytesAttribute(ds.get(), "ckpt_kind", 64, path));
    EXPECT_EQ(kind, std::optional<std::string>("object"));
    Handle space(H5Dget_space(ds.get()));
    hsize_t dim = 99;
    ASSERT_EQ(H5Sget_simple_extent_ndims(space.get()), 1);
    H5Sget_simple_extent_dims(space.get(), &dim, nullptr);
    EXPECT_EQ(dim, bytes.size());
    std::string got(bytes.size(), '\0');
    if (!got.empty()) {
      ASSERT_GE(H5Dread(ds.get(), H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL,
                        H5P_DEFAULT, got.data()),
                0);
    }
    EXPECT_EQ(got, bytes);
  }
  // Root attributes: checkpoint info and user metadata.
  Handle root(H5Gopen2(file.get(), "/", H5P_DEFAULT));
  CKPT_ASSERT_OK_AND_ASSIGN(
      auto step, hdf5::ReadUInt64Attribute(root.get(), "ckpt_step", "/"));
  EXPECT_EQ(step, std::optional<uint64_t>(42));
  CKPT_ASSERT_OK_AND_ASSIGN(
      auto world,
      hdf5::ReadUInt64Attribute(root.get(), "ckpt_world_size", "/"));
  EXPECT_EQ(world, std::optional<uint64_t>(4));
  CKPT_ASSERT_OK_AND_ASSIGN(
      auto version,
      hdf5::ReadBytesAttribute(root.get(), "ckpt_format_version", 64, "/"));
  EXPECT_EQ(version, std::optional<std::string>("1.0"));
  CKPT_ASSERT_OK_AND_ASSIGN(
      auto id,
      hdf5::ReadBytesAttribute(root.get(), "ckpt_checkpoint_id", 64, "/"));
  EXPECT_EQ(id, std::optional<std::string>(format::IdToHex(r.info.id)));
  for (const auto& [key, value] : fixture_.metadata) {
    const std::string attr = key.rfind("ckpt_", 0) == 0 ? "ckpt_" + key : key;
    CKPT_ASSERT_OK_AND_ASSIGN(
        auto v, hdf5::ReadBytesAttribute(root.get(), attr, 1 << 20, "/"));
    EXPECT_EQ(v, std::optional<std::string>(value)) << key;
  }
  // Text is a variable-length UTF-8 string (h5py: str), bytes a uint8 array.
  Handle lr(H5Aopen(root.get(), "lr", H5P_DEFAULT));
  Handle lr_type(H5Aget_type(lr.get()));
  EXPECT_EQ(H5Tget_class(lr_type.get()), H5T_STRING);
  EXPECT_GT(H5Tis_variable_str(lr_type.get()), 0);
  EXPECT_EQ(H5Tget_cset(lr_type.get()), H5T_CSET_UTF8);
  Handle blob(H5Aopen(root.get(), "blob", H5P_DEFAULT));
  Handle blob_type(H5Aget_type(blob.get()));
  EXPECT_EQ(H5Tget_class(blob_type.get()), H5T_INTEGER);
}

TEST_P(Hdf5ExportTest, RoundTripIsExact) {
  CKPT_ASSERT_OK(
      ExportHdf5(dir_ / "src", dir_ / "out.h5", SmallPieces()).status());
  Hdf5ImportOptions io;
  io.codec = GetParam();
  CKPT_ASSERT_OK_AND_ASSIGN(Hdf5ImportResult r,
                            ImportHdf5(dir_ / "out.h5", dir_ / "back", io));
  EXPECT_EQ(r.step, 42u);
  EXPECT_TRUE(r.plan.skipped.empty());
  CKPT_EXPECT_OK(SameContent(dir_ / "src", dir_ / "back"));
  CKPT_ASSERT_OK_AND_ASSIGN(auto back, Reader::Open(dir_ / "back"));
  EXPECT_EQ(back->manifest().info.world_size, 1u);
}

TEST_P(Hdf5ExportTest, RoundTripWithDefaultOptionsAndNoCompression) {
  CKPT_ASSERT_OK(ExportHdf5(dir_ / "src", dir_ / "a.h5", {}).status());
  Hdf5ExportOptions none;
  none.compression = Hdf5Compression::kNone;
  CKPT_ASSERT_OK(ExportHdf5(dir_ / "src", dir_ / "b.h5", none).status());
  CKPT_ASSERT_OK(ImportHdf5(dir_ / "a.h5", dir_ / "a", {}).status());
  CKPT_ASSERT_OK(ImportHdf5(dir_ / "b.h5", dir_ / "b", {}).status());
  CKPT_EXPECT_OK(SameContent(dir_ / "src", dir_ / "a"));
  CKPT_EXPECT_OK(SameContent(dir_ / "src", dir_ / "b"));
}

INSTANTIATE_TEST_SUITE_P(Codecs, Hdf5ExportTest,
                         ::testing::Values(format::Codec::kNone,
                                           format::Codec::kZstd),
                         [](const auto& info) {
                           return info.param == format::Codec::kZstd ? "zstd"
                                                                     : "none";
                         });

TEST(Hdf5Export, SameCheckpointGivesTheSameFile) {
  TempDir dir;
  CKPT_ASSERT_OK(WriteFixture(MakeFixture(), dir / "src", 2));
  CKPT_ASSERT_OK(ExportHdf5(dir / "src", dir / "a.h5", {}).status());
  CKPT_ASSERT_OK(ExportHdf5(dir / "src", dir / "b.h5", {}).status());
  EXPECT_TRUE(ckpt::testing::ReadFileBytes(dir / "a.h5") ==
              ckpt::testing::ReadFileBytes(dir / "b.h5"));
}

// Objects are read a batch at a time, with one Reader::Load a batch of
// consecutive objects of at most slab_bytes together (a larger one alone):
// one Load per object made an export of many small objects take a Load
// each (issue 28). Objects of 0 to 99 bytes among the tensors, in batches
// of 48 bytes, come back exactly.
TEST(Hdf5Export, ManyObjectsAreReadInBatches) {
  TempDir dir;
  Fixture f = MakeFixture();
  for (int i = 0; i < 100; ++i) {
    f.objects.push_back({absl::StrCat("objs.o", 100 + i),
                         std::string(i, static_cast<char>('a' + i % 26))});
  }
  CKPT_ASSERT_OK(WriteFixture(f, dir / "src", 3));
  CKPT_ASSERT_OK(
      ExportHdf5(dir / "src", dir / "out.h5", SmallPieces()).status());
  CKPT_ASSERT_OK(ImportHdf5(dir / "out.h5", dir / "back", {}).status());
  CKPT_EXPECT_OK(SameContent(dir / "src", dir / "back"));
}

TEST(Hdf5Export, OutputExists) {
  TempDir dir;
  CKPT_ASSERT_OK(WriteFixture(MakeFixture(), dir / "src", 2));
  std::ofstream(dir / "out.h5") << "keep me";
  EXPECT_THAT(
      ExportHdf5(dir / "src", dir / "out.h5", {}),
      StatusIs(absl::StatusCode::kAlreadyExists,
               dir / "out.h5: already exists (use --force to replace it)"));
  EXPECT_EQ(ckpt::testing::ReadFileBytes(dir / "out.h5"), "keep me");
  Hdf5ExportOptions o;
  o.overwrite = true;
  CKPT_ASSERT_OK(ExportHdf5(dir / "src", dir / "out.h5", o).status());
  CKPT_ASSERT_OK(ImportHdf5(dir / "out.h5", dir / "back", {}).status());
  CKPT_EXPECT_OK(SameContent(dir / "src", dir / "back"));
}

TEST(Hdf5Export, OutputModeFollowsTheUmask) {
  TempDir dir;
  CKPT_ASSERT_OK(WriteFixture(MakeFixture(), dir / "src", 1));
  const mode_t old = umask(022);
  auto r = ExportHdf5(dir / "src", dir / "out.h5", {});
  umask(old);
  CKPT_ASSERT_OK(r.status());
  EXPECT_EQ(std::filesystem::status(dir / "out.h5").permissions(),
            std::filesystem::perms(0644));
}

TEST(Hdf5Export, OutputDirectoryMissing) {
  TempDir dir;
  CKPT_ASSERT_OK(WriteFixture(MakeFixture(), dir / "src", 1));
  EXPECT_THAT(ExportHdf5(dir / "src", dir / "no/out.h5", {}),
              StatusIs(absl::StatusCode::kNotFound, "does not exist"));
}

TEST(Hdf5Export, SourceMissing) {
  TempDir dir;
  EXPECT_THAT(ExportHdf5(dir / "nothing", dir / "out.h5", {}),
              StatusIs(absl::StatusCode::kNotFound, "nothing"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out.h5"));
}

TEST(Hdf5Export, PartialEntryIsRefused) {
  TempDir dir;
  auto writer = Writer::Create({}).value();
  std::vector<float> half(8, 1.0f);
  TensorOptions to;
  to.partial = true;
  CKPT_ASSERT_OK(writer->AddTensor("emb", DType::kFloat32, {4, 4},
                                   Box{{0, 0}, {2, 4}}, half.data(), to));
  CKPT_ASSERT_OK(writer->Save(dir / "src", 1, {}).status());
  EXPECT_THAT(ExportHdf5(dir / "src", dir / "out.h5", {}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "entry 'emb' is partial"));
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().find("out.h5"), std::string::npos)
        << e.path();
  }
}

TEST(Hdf5Export, BadOptions) {
  TempDir dir;
  Hdf5ExportOptions o;
  o.level = 10;
  EXPECT_THAT(ExportHdf5(dir / "src", dir / "out.h5", o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "deflate level 10 is outside 0..9"));
}

TEST(Hdf5ChunkShape, TrailingDimsWholeOneDimCut) {
  EXPECT_EQ(ChunkShape({4096, 4096}, 4, 1 << 20), (Dims{64, 4096}));
  EXPECT_EQ(ChunkShape({10000000}, 4, 1 << 20), (Dims{262144}));
  EXPECT_EQ(ChunkShape({3, 5}, 4, 1 << 20), (Dims{3, 5}));
  EXPECT_EQ(ChunkShape({2, 3, 1000000}, 2, 1 << 20), (Dims{1, 1, 524288}));
  EXPECT_EQ(ChunkShape({7, 3, 5}, 8, 100), (Dims{1, 2, 5}));
  EXPECT_EQ(ChunkShape({7}, 8, 4), (Dims{1}));  // at least one element
  EXPECT_EQ(ChunkShape({}, 4, 1 << 20), (Dims{}));
  EXPECT_EQ(ChunkShape({0, 4}, 4, 1 << 20), (Dims{}));
}

TEST(Hdf5SlabShape, WholeChunksWithinTheBudget) {
  // Chunk [64, 4096] f32 = 1 MiB; 64 MiB slabs = 4096 rows: the whole tensor.
  EXPECT_EQ(SlabShape({4096, 4096}, {64, 4096}, 4, 64 << 20),
            (Dims{4096, 4096}));
  // 16 MiB: 1024 rows, a multiple of 64.
  EXPECT_EQ(SlabShape({4096, 4096}, {64, 4096}, 4, 16 << 20),
            (Dims{1024, 4096}));
  // A budget below one chunk still gives one chunk row.
  EXPECT_EQ(SlabShape({4096, 4096}, {64, 4096}, 4, 1000), (Dims{64, 4096}));
  // Cut inside the last dim: earlier dims one.
  EXPECT_EQ(SlabShape({2, 3, 1000000}, {1, 1, 524288}, 2, 2 << 20),
            (Dims{1, 1, 1000000}));
  EXPECT_EQ(SlabShape({2, 3, 1000000}, {1, 1, 524288}, 2, 1 << 20),
            (Dims{1, 1, 524288}));
  // Contiguous (no chunks): any cut.
  EXPECT_EQ(SlabShape({10, 10}, {}, 1, 35), (Dims{3, 10}));
  EXPECT_EQ(SlabShape({}, {}, 4, 35), (Dims{}));
}

}  // namespace
}  // namespace ckpt::interop

// DCP metadata decoded from the committed fixtures: real torch 1.13 output
// (tests/data/interop/dcp_torch113) and the layout of current releases
// (dcp_modern, written by tests/data/interop/make_dcp.py modern).
#include "ckpt/interop/dcp_metadata.h"

#include <fstream>
#include <sstream>

#include "ckpt/format/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace ckpt::interop {
namespace {

using ::ckpt::testing::StatusIs;

std::string Data(const std::string& name) {
  return ::ckpt::testing::ReadFileBytes(std::string(CKPT_SOURCE_DIR) +
                                        "/tests/data/interop/" + name);
}

void ExpectFixtureTensors(const DcpMetadata& m) {
  ASSERT_EQ(m.tensors.size(), 5u);
  EXPECT_EQ(m.tensors[0].fqn, "model.norm");
  EXPECT_EQ(m.tensors[0].dtype, DType::kBFloat16);
  EXPECT_EQ(m.tensors[0].size, Shape{7});
  const DcpTensor& cols = m.tensors[1];
  EXPECT_EQ(cols.fqn, "model.w_cols");
  EXPECT_EQ(cols.dtype, DType::kInt32);
  ASSERT_EQ(cols.chunks.size(), 2u);
  EXPECT_EQ(cols.chunks[1].offsets, (Dims{0, 2}));
  EXPECT_EQ(cols.chunks[1].sizes, (Dims{4, 4}));
  EXPECT_EQ(m.tensors[3].fqn, "model.w_uneven");
  EXPECT_EQ(m.tensors[3].dtype, DType::kFloat64);
  EXPECT_EQ(m.tensors[4].fqn, "opt.step_count");
  EXPECT_EQ(m.tensors[4].size, Shape{});
  EXPECT_EQ(m.bytes_items, std::vector<std::string>{"extra.note"});
  EXPECT_EQ(m.storage.size(), 9u);  // 8 chunks + 1 bytes item
}

TEST(DcpMetadataTest, Torch113Layout) {
  CKPT_ASSERT_OK_AND_ASSIGN(DcpMetadata m,
                            DecodeDcpMetadata(Data("dcp_torch113/.metadata")));
  EXPECT_EQ(m.module, "torch.distributed._shard.checkpoint.metadata");
  EXPECT_EQ(m.version, "");
  EXPECT_FALSE(m.has_storage_meta);
  ExpectFixtureTensors(m);
  for (const DcpStorage& s : m.storage) {
    EXPECT_THAT(s.relative_path,
                ::testing::MatchesRegex("__[01]_[0-9]+\\.distcp"));
    EXPECT_EQ(s.offset, 0u);  // 1.13 writes one file per item
  }
}

TEST(DcpMetadataTest, CurrentReleaseLayout) {
  CKPT_ASSERT_OK_AND_ASSIGN(DcpMetadata m,
                            DecodeDcpMetadata(Data("dcp_modern/.metadata")));
  EXPECT_EQ(m.module, "torch.distributed.checkpoint.metadata");
  EXPECT_EQ(m.version, "1.0.0");
  EXPECT_TRUE(m.has_storage_meta);
  EXPECT_EQ(m.checkpoint_id, "dcp_modern");
  EXPECT_TRUE(m.has_planner_data);
  ExpectFixtureTensors(m);
  // One concatenated file per rank, items addressed by offset and length.
  uint64_t rank0_items = 0;
  for (const DcpStorage& s : m.storage) {
    rank0_items += s.relative_path == "__0_0.distcp";
    EXPECT_TRUE(s.transform_descriptors.empty());
  }
  EXPECT_EQ(rank0_items, 6u);
}

TEST(DcpMetadataTest, PickleCallingOsSystem) {
  EXPECT_THAT(DecodeDcpMetadata(Data("hostile/dcp_os_system/.metadata")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "pickle global 'posix.system' is not allowed"));
}

TEST(DcpMetadataTest, RootThatIsNotMetadata) {
  EXPECT_THAT(
      DecodeDcpMetadata(std::string("\x80\x02N.", 4)),
      StatusIs(absl::StatusCode::kDataLoss, "the root is None, not Metadata"));
}

TEST(DcpMetadataTest, TorchDtypes) {
  EXPECT_EQ(*DTypeFromTorch("torch.half"), DType::kFloat16);
  EXPECT_EQ(*DTypeFromTorch("torch.float8_e4m3fn"), DType::kFloat8E4M3FN);
  EXPECT_THAT(
      DTypeFromTorch("torch.complex64"),
      StatusIs(absl::StatusCode::kFailedPrecondition, "no ckpt equivalent"));
}

TEST(DcpMetadataTest, GatherStridedView) {
  // A transposed 2x3 view of a 3x2 storage [0..5].
  TorchTensorRef t;
  t.dtype = DType::kUInt8;
  t.storage_numel = 6;
  t.size = {2, 3};
  t.stride = {1, 2};
  CKPT_ASSERT_OK_AND_ASSIGN(std::string out,
                            GatherTensor(t, std::string("\0\1\2\3\4\5", 6)));
  EXPECT_EQ(out, std::string("\0\2\4\1\3\5", 6));
  t.storage_offset = 1;
  EXPECT_THAT(GatherTensor(t, std::string(6, '\0')),
              StatusIs(absl::StatusCode::kDataLoss,
                       "reaches element 6 of a storage of 6"));
}

}  // namespace
}  // namespace ckpt::interop

// The resharding matrix: save under one layout on M ranks, load under
// another on N ranks, compare element-wise with the global reference.
#include <map>

#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "ckpt/reader.h"
#include "ckpt/writer.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::Extract;
using ::ckpt::testing::Layout;
using ::ckpt::testing::LayoutName;
using ::ckpt::testing::PieceOf;
using ::ckpt::testing::ReferenceBytes;
using ::ckpt::testing::TempDir;

struct Tensor {
  std::string name;
  DType dtype;
  Shape shape;
  std::string global;
};

std::vector<Tensor> MatrixTensors() {
  std::vector<Tensor> out;
  const std::vector<Shape> shapes = {{}, {0, 3}, {7}, {5, 6}, {3, 4, 5}};
  uint64_t seed = 1;
  for (DType d : kAllDTypes) {
    for (const Shape& s : shapes) {
      out.push_back({std::string(DTypeName(d)) + "." + ShapeToString(s), d, s,
                     ReferenceBytes(d, s, seed++)});
    }
  }
  // Spans many 4 KiB blocks, with an odd row length.
  Shape big{67, 129};
  out.push_back(
      {"big", DType::kFloat64, big, ReferenceBytes(DType::kFloat64, big, 999)});
  return out;
}

// Saves `tensors` from `world` in-process ranks under `layout`.
absl::Status SaveAll(const std::string& root, uint64_t step,
                     const std::vector<Tensor>& tensors, Layout layout,
                     int world, const SaveOptions& options) {
  InProcessWorld w(world);
  // Pieces must stay alive during Save: one buffer per rank and tensor.
  std::vector<std::vector<std::string>> bufs(
      world, std::vector<std::string>(tensors.size()));
  return RunRanks(w, [&](Communicator& comm) -> absl::Status {
    Writer::Options wo;
    wo.comm = &comm;
    CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i];
      auto piece = PieceOf(layout, t.shape, comm.rank(), world);
      std::string& buf = bufs[comm.rank()][i];
      buf = Extract(t.global, t.dtype, t.shape, piece.region);
      TensorOptions to;
      to.replica = piece.replica;
      CKPT_RETURN_IF_ERROR(writer->AddTensor(t.name, t.dtype, t.shape,
                                             piece.region, buf.data(), to));
    }
    CKPT_RETURN_IF_ERROR(
        writer->SetObject("rng.rank" + std::to_string(comm.rank()),
                          "state-of-rank-" + std::to_string(comm.rank())));
    return writer->Save(root, step, options).status();
  });
}

// Loads every tensor as `world` ranks under `layout` (one Load per rank)
// and compares with the reference.
void LoadAndCompare(const std::string& root, const std::vector<Tensor>& tensors,
                    Layout layout, int world, const std::string& label) {
  auto reader = Reader::Open(root);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> bufs(tensors.size());
    std::vector<LoadRequest> reqs;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i];
      auto piece = PieceOf(layout, t.shape, rank, world);
      bufs[i].assign(RegionElements(piece.region) * DTypeSize(t.dtype), '\xEE');
      reqs.push_back({t.name, t.dtype, t.shape, piece.region, bufs[i].data()});
    }
    LoadOptions lo;
    lo.filter = [](const std::string& n) { return n.rfind("rng.", 0) != 0; };
    auto report = (*reader)->Load(reqs, lo);
    ASSERT_TRUE(report.ok()) << label << ": " << report.status();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i];
      auto piece = PieceOf(layout, t.shape, rank, world);
      ASSERT_EQ(bufs[i], Extract(t.global, t.dtype, t.shape, piece.region))
          << label << " rank " << rank << " tensor " << t.name << " region "
          << RegionToString(piece.region);
    }
  }
}

class ReshardMatrixTest
    : public ::testing::TestWithParam<std::tuple<Layout, format::Codec>> {};

TEST_P(ReshardMatrixTest, SaveOnThreeLoadUnderEveryLayoutOnTwoAndFour) {
  auto [save_layout, codec] = GetParam();
  std::vector<Tensor> tensors = MatrixTensors();
  TempDir dir;
  SaveOptions so;
  so.codec = codec;
  so.block_size = 4096;
  so.io_threads = 3;
  CKPT_ASSERT_OK(SaveAll(dir.path(), 1, tensors, save_layout, 3, so));
  for (Layout load_layout : testing::kAllLayouts) {
    for (int world : {1, 2, 4}) {
      LoadAndCompare(dir.path(), tensors, load_layout, world,
                     std::string(LayoutName(save_layout)) + "->" +
                         LayoutName(load_layout) + " x" +
                         std::to_string(world));
    }
  }
  // Objects come back by name.
  auto reader = Reader::Open(dir.path());
  CKPT_ASSERT_OK(reader);
  auto obj = (*reader)->ReadObject("rng.rank2");
  CKPT_ASSERT_OK(obj);
  EXPECT_EQ(*obj, "state-of-rank-2");
}

INSTANTIATE_TEST_SUITE_P(
    AllLayouts, ReshardMatrixTest,
    ::testing::Combine(::testing::ValuesIn(testing::kAllLayouts),
                       ::testing::Values(format::Codec::kNone,
                                         format::Codec::kZstd)),
    [](const auto& info) {
      return std::string(LayoutName(std::get<0>(info.param))) +
             (std::get<1>(info.param) == format::Codec::kZstd ? "_zstd"
                                                              : "_none");
    });

}  // namespace
}  // namespace ckpt

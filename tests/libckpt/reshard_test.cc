// The resharding matrix: save under one layout on M ranks, load under
// another on N ranks, compare element-wise with the global reference.
#include <map>
#include <set>

#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "ckpt/reader.h"
#include "ckpt/writer.h"
#include "gtest/gtest.h"
#include "libckpt/forwarding_communicator.h"
#include "libckpt/test_util.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::Delivery;
using ::ckpt::testing::Extract;
using ::ckpt::testing::Layout;
using ::ckpt::testing::LayoutName;
using ::ckpt::testing::PieceOf;
using ::ckpt::testing::ReferenceBytes;
using ::ckpt::testing::RunRanksWith;
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

// Stored bytes of the blocks that `regions` (every rank's requests) need,
// by brute force over every chunk of every requested entry. Codec none:
// a block's stored size is its raw size.
uint64_t NeededBlockBytes(
    const Reader& reader,
    const std::vector<std::pair<std::string, Region>>& regions) {
  std::map<std::pair<std::string, size_t>, std::set<uint64_t>> blocks;
  for (const auto& [name, region] : regions) {
    const format::EntryRecord& e = *reader.Find(name);
    const uint64_t es = DTypeSize(e.dtype);
    for (size_t c = 0; c < e.chunks.size(); ++c) {
      const uint64_t bs = e.chunks[c].block_size;
      ForEachRun(e.shape, e.chunks[c].region, region,
                 [&](uint64_t s, uint64_t, uint64_t k) {
                   for (uint64_t b = s * es / bs; b * bs < (s + k) * es; ++b) {
                     blocks[{name, c}].insert(b);
                   }
                 });
    }
  }
  uint64_t total = 0;
  for (const auto& [key, set] : blocks) {
    const format::EntryRecord& e = *reader.Find(key.first);
    const format::ChunkRecord& c = e.chunks[key.second];
    const uint64_t raw = RegionElements(c.region) * DTypeSize(e.dtype);
    for (uint64_t b : set)
      total += std::min(c.block_size, raw - b * c.block_size);
  }
  return total;
}

// Every rank of `world` loads its pieces under `layout` with one
// cooperative Load; compares with the reference, and checks that the ranks
// read between them exactly the stored bytes of the blocks needed (with
// `codec` none, by brute force; always, the bytes one single-rank Load of
// all ranks' requests reads).
void CooperativeLoadAndCompare(const std::string& root,
                               const std::vector<Tensor>& tensors,
                               Layout layout, int world, format::Codec codec,
                               Delivery delivery, const std::string& label) {
  InProcessWorld w(world);
  std::vector<std::vector<std::string>> bufs(
      world, std::vector<std::string>(tensors.size()));
  std::vector<LoadReport> reports(world);
  std::vector<int> all_to_all_calls;
  absl::Status st = RunRanksWith(
      w, delivery,
      [&](Communicator& comm) -> absl::Status {
        const int rank = comm.rank();
        ReaderOptions ro;
        ro.communicator = &comm;
        CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(root, ro));
        std::vector<LoadRequest> reqs;
        for (size_t i = 0; i < tensors.size(); ++i) {
          const Tensor& t = tensors[i];
          auto piece = PieceOf(layout, t.shape, rank, world);
          bufs[rank][i].assign(
              RegionElements(piece.region) * DTypeSize(t.dtype), '\xEE');
          reqs.push_back(
              {t.name, t.dtype, t.shape, piece.region, bufs[rank][i].data()});
        }
        LoadOptions lo = testing::OptionsFor(delivery);
        lo.filter = [](const std::string& n) {
          return n.rfind("rng.", 0) != 0;
        };
        CKPT_ASSIGN_OR_RETURN(reports[rank], reader->Load(reqs, lo));
        return absl::OkStatus();
      },
      &all_to_all_calls);
  ASSERT_TRUE(st.ok()) << label << ": " << st;
  if (delivery != Delivery::kAllToAll) {
    for (int rank = 0; rank < world; ++rank) {
      EXPECT_EQ(all_to_all_calls[rank], 0) << label << " rank " << rank;
    }
  }
  std::vector<std::pair<std::string, Region>> regions;
  std::vector<LoadRequest> all;
  std::vector<std::string> scratch;
  scratch.reserve(world * tensors.size());
  uint64_t read = 0, received = 0;
  for (int rank = 0; rank < world; ++rank) {
    read += reports[rank].bytes_read;
    received += reports[rank].bytes_received;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i];
      auto piece = PieceOf(layout, t.shape, rank, world);
      ASSERT_EQ(bufs[rank][i],
                Extract(t.global, t.dtype, t.shape, piece.region))
          << label << " rank " << rank << " tensor " << t.name;
      regions.emplace_back(t.name, piece.region);
      scratch.emplace_back(bufs[rank][i].size(), '\0');
      all.push_back(
          {t.name, t.dtype, t.shape, piece.region, scratch.back().data()});
    }
  }
  auto reader = Reader::Open(root);
  CKPT_ASSERT_OK(reader);
  LoadOptions lo;
  lo.allow_unrequested = true;
  auto single = (*reader)->Load(all, lo);
  CKPT_ASSERT_OK(single);
  EXPECT_EQ(read, single->bytes_read) << label;
  // Replicas: every rank wants every byte, and reads only its share.
  if (layout == Layout::kReplicated) {
    EXPECT_EQ(received, (world - 1) * single->bytes_loaded / world) << label;
  }
  if (codec == format::Codec::kNone) {
    EXPECT_EQ(read, NeededBlockBytes(**reader, regions)) << label;
  }
}

// Each instance loads under every layout, on 2 and 4 ranks, delivering
// directly and by exchange (AllToAll on 2 ranks, shared memory on 4).
// With CKPT_RESHARD_MATRIX_ROTATE=1 (scripts/sanitize sets it:
// under TSan the full matrix took 210 s of the 336 s of tests) an
// instance runs one of the four (world, delivery) pairs per load layout,
// rotating with the layout and the instance, so that every instance still
// loads under every layout, on both worlds and with both deliveries, and
// every (save layout, load layout) pair runs two of the four pairs (one
// per codec): the same code paths, a quarter of the loads.
TEST_P(ReshardMatrixTest, CooperativeLoadsUnderEveryLayoutReadEachBlockOnce) {
  auto [save_layout, codec] = GetParam();
  std::vector<Tensor> tensors = MatrixTensors();
  TempDir dir;
  SaveOptions so;
  so.codec = codec;
  so.block_size = 4096;
  so.io_threads = 3;
  CKPT_ASSERT_OK(SaveAll(dir.path(), 1, tensors, save_layout, 3, so));
  const bool rotate = testing::EnvOr("CKPT_RESHARD_MATRIX_ROTATE", 0) == 1;
  const int instance = static_cast<int>(save_layout) * 2 +
                       (codec == format::Codec::kZstd ? 1 : 0);
  int load_index = 0;
  for (Layout load_layout : testing::kAllLayouts) {
    const int pair = (load_index++ + instance) % 4;
    for (int world : {2, 4}) {
      // Between processes the bytes go through AllToAll or shared memory:
      // one of the two per world size, so that the matrix covers both
      // without a third pass (their transport has its own tests,
      // coop_load_test.cc).
      const Delivery exchange =
          world == 2 ? Delivery::kAllToAll : Delivery::kSharedMemory;
      for (Delivery d : {Delivery::kDirect, exchange}) {
        if (rotate &&
            pair != (world == 4 ? 2 : 0) + (d == Delivery::kDirect ? 0 : 1)) {
          continue;
        }
        CooperativeLoadAndCompare(
            dir.path(), tensors, load_layout, world, codec, d,
            std::string(LayoutName(save_layout)) + "->" +
                LayoutName(load_layout) + " x" + std::to_string(world) +
                " cooperative " + testing::DeliveryName(d));
      }
    }
  }
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

#include "synth/synth_model.h"

#include <map>
#include <set>

#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::synth {
namespace {

using ::ckpt::testing::StatusIs;

TEST(SynthModel, TensorsOfTheTable) {
  Model m = DescribeModel(ConfigFor(2, 16), DType::kBFloat16);
  EXPECT_EQ(m.config.vocab, 133u);
  EXPECT_EQ(m.config.ffn, 64u);
  // 1 embedding + 7 per layer + final norm, then two states of each.
  ASSERT_EQ(m.tensors.size(), 3u * (1 + 7 * 2 + 1));
  EXPECT_EQ(m.tensors[0].name, "embed.weight");
  EXPECT_EQ(m.tensors[0].shape, (Shape{133, 16}));
  EXPECT_EQ(m.tensors[2].name, "layers.0.attn.qkv.weight");
  EXPECT_EQ(m.tensors[2].shape, (Shape{16, 48}));
  EXPECT_EQ(m.tensors[2].tp, TpSplit::kColumns);
  EXPECT_EQ(m.tensors[15].name, "final_norm.weight");
  EXPECT_EQ(m.tensors[16].name, "optimizer.exp_avg.embed.weight");
  EXPECT_EQ(m.tensors[16].dtype, DType::kFloat32);
  EXPECT_EQ(m.tensors[16].param, "embed.weight");
  EXPECT_EQ(m.tensors[32].name, "optimizer.exp_avg_sq.embed.weight");
  EXPECT_EQ(m.tensors[32].kind, ValueKind::kExpAvgSq);
  std::set<std::string> names;
  for (const SynthTensor& t : m.tensors) {
    EXPECT_THAT(format::ValidateEntryName(t.name), ::ckpt::testing::IsOk());
    EXPECT_TRUE(names.insert(t.name).second) << t.name;
  }
  EXPECT_EQ(m.param_bytes, m.param_elements * 2);
  EXPECT_EQ(m.total_bytes, m.param_elements * 10);
}

TEST(SynthModel, FsdpUnitsConcatenateTheirTensors) {
  Model m = DescribeModel(ConfigFor(3, 8), DType::kFloat32);
  ASSERT_EQ(m.fsdp_units.size(), 5u);  // embedding, 3 layers, final norm
  std::vector<uint64_t> sum(m.fsdp_units.size(), 0);
  for (const SynthTensor& t : m.tensors) {
    if (t.optimizer_state) continue;
    EXPECT_EQ(t.fsdp_offset, sum[t.fsdp_unit]) << t.name;
    sum[t.fsdp_unit] += t.numel;
  }
  for (size_t u = 0; u < sum.size(); ++u) EXPECT_EQ(sum[u], m.fsdp_units[u]);
}

TEST(SynthModel, ConfigForSizeComesClose) {
  for (double mib : {4.0, 16.0, 100.0, 1000.0, 5000.0}) {
    for (DType d : {DType::kBFloat16, DType::kFloat32}) {
      Model m = DescribeModel(ConfigForSize(mib, d), d);
      const double got = m.total_bytes / 1048576.0;
      EXPECT_NEAR(got / mib, 1.0, 0.15) << mib << " MiB " << DTypeName(d);
    }
  }
  EXPECT_EQ(ConfigForSize(16, DType::kBFloat16).layers, 2);
  EXPECT_EQ(ConfigForSize(100, DType::kBFloat16).layers, 4);
  EXPECT_EQ(ConfigForSize(5000, DType::kBFloat16).layers, 8);
  EXPECT_EQ(ConfigForSize(0.001, DType::kBFloat16).hidden,
            8u);  // the smallest model
}

TEST(SynthModel, ParseLayout) {
  for (SynthLayout l : kAllSynthLayouts) {
    EXPECT_THAT(ParseLayout(LayoutName(l)), ::ckpt::testing::IsOk());
    EXPECT_EQ(*ParseLayout(LayoutName(l)), l);
  }
  EXPECT_THAT(
      ParseLayout("zero3"),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          "unknown layout 'zero3' (expected tp, fsdp, replicated or mixed)"));
}

// Every layout, on every world size, covers each tensor exactly once with
// valid regions; regions held by several ranks are replicas on all but at
// most one of them.
TEST(SynthModel, EveryLayoutCoversEveryTensorOnAnyWorldSize) {
  Model m = DescribeModel(ConfigFor(2, 8), DType::kBFloat16);
  for (SynthLayout layout : kAllSynthLayouts) {
    for (int world = 1; world <= 8; ++world) {
      for (const SynthTensor& t : m.tensors) {
        SCOPED_TRACE(::testing::Message() << LayoutName(layout) << " world "
                                          << world << " " << t.name);
        std::vector<Region> unique;
        std::map<std::string, int> non_replicas;
        for (int r = 0; r < world; ++r) {
          SynthPiece p = PieceOf(m, t, layout, r, world);
          ASSERT_THAT(ValidateRegion(p.region, t.shape),
                      ::ckpt::testing::IsOk());
          if (RegionElements(p.region) == 0) continue;
          const std::string key = RegionToString(p.region);
          if (!non_replicas.count(key)) unique.push_back(p.region);
          non_replicas[key] += p.replica ? 0 : 1;
        }
        for (const auto& [key, n] : non_replicas) EXPECT_LE(n, 1) << key;
        EXPECT_THAT(CheckCover(t.shape, unique, /*allow_gaps=*/false),
                    ::ckpt::testing::IsOk());
      }
    }
  }
}

TEST(SynthModel, TpSplitsColumnsRowsAndVocab) {
  Model m = DescribeModel(ConfigFor(1, 16), DType::kBFloat16);
  auto piece = [&](const std::string& name, int r, int n) {
    for (const SynthTensor& t : m.tensors)
      if (t.name == name) return PieceOf(m, t, SynthLayout::kTp, r, n);
    ADD_FAILURE() << name;
    return SynthPiece{};
  };
  EXPECT_EQ(std::get<Box>(piece("layers.0.attn.qkv.weight", 1, 4).region),
            (Box{{0, 12}, {16, 12}}));
  EXPECT_EQ(std::get<Box>(piece("layers.0.attn.out.weight", 3, 4).region),
            (Box{{12, 0}, {4, 16}}));
  // 133 vocabulary rows over 4 ranks: 33, 33, 33, 34.
  EXPECT_EQ(std::get<Box>(piece("embed.weight", 3, 4).region),
            (Box{{99, 0}, {34, 16}}));
  EXPECT_TRUE(piece("layers.0.attn_norm.weight", 2, 4).replica);
  EXPECT_FALSE(piece("layers.0.mlp.up.weight", 2, 4).replica);
  EXPECT_EQ(
      std::get<Box>(
          piece("optimizer.exp_avg.layers.0.mlp.down.weight", 0, 2).region),
      (Box{{0, 0}, {32, 16}}));
}

TEST(SynthModel, FsdpGivesUnevenFlatRangesAndEmptyPieces) {
  Model m = DescribeModel(ConfigFor(2, 8), DType::kBFloat16);
  int empty = 0;
  std::set<uint64_t> lengths;
  for (const SynthTensor& t : m.tensors) {
    for (int r = 0; r < 4; ++r) {
      SynthPiece p = PieceOf(m, t, SynthLayout::kFsdp, r, 4);
      ASSERT_TRUE(std::holds_alternative<FlatRange>(p.region));
      EXPECT_FALSE(p.replica);
      uint64_t n = RegionElements(p.region);
      if (n == 0) ++empty;
      if (n != 0 && n != t.numel) lengths.insert(n);
    }
  }
  EXPECT_GT(empty, 0);
  EXPECT_GT(lengths.size(), 3u);  // partial ranges of many lengths
}

TEST(SynthModel, MixedHasBoxesFlatRangesAndReplicas) {
  Model m = DescribeModel(ConfigFor(2, 8), DType::kBFloat16);
  int boxes = 0, partial_boxes = 0, flats = 0, replicas = 0;
  for (const SynthTensor& t : m.tensors) {
    SynthPiece p = PieceOf(m, t, SynthLayout::kMixed, 1, 4);  // TP 2 x DP 2
    if (const Box* b = std::get_if<Box>(&p.region)) {
      ++boxes;
      if (!(*b == FullBox(t.shape))) ++partial_boxes;
    } else if (RegionElements(p.region) != 0) {
      ++flats;
    }
    replicas += p.replica;
    if (t.optimizer_state) {
      EXPECT_TRUE(std::holds_alternative<FlatRange>(p.region)) << t.name;
    }
  }
  EXPECT_GT(partial_boxes, 0);
  EXPECT_GT(boxes, partial_boxes);  // norms
  EXPECT_GT(flats, 0);
  EXPECT_GT(replicas,
            partial_boxes);  // TP boxes replicated over DP, plus norms
  // Layer 1 is FSDP: a flat range.
  for (const SynthTensor& t : m.tensors) {
    if (t.name == "layers.1.mlp.up.weight") {
      EXPECT_TRUE(std::holds_alternative<FlatRange>(
          PieceOf(m, t, SynthLayout::kMixed, 0, 4).region));
    }
  }
}

}  // namespace
}  // namespace ckpt::synth

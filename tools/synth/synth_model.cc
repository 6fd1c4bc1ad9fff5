#include "synth/synth_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "ckpt/format/names.h"

namespace ckpt::synth {
namespace {

// Part i of n balanced parts of [0, total): [total*i/n, total*(i+1)/n).
std::pair<uint64_t, uint64_t> BalancedPart(uint64_t total, int n, int i) {
  uint64_t begin = total * i / n;
  uint64_t end = total * (i + 1) / n;
  return {begin, end - begin};
}

SynthPiece Nothing() { return {FlatRange{0, 0}, false}; }

// Tensor parallelism of degree `degree`, this rank's index `index` in its
// group; `replica` when other groups hold the same boxes.
SynthPiece TpPiece(const SynthTensor& t, int degree, int index, bool replica) {
  Box full = FullBox(t.shape);
  if (t.tp == TpSplit::kReplicated) return {full, true};
  size_t d = t.tp == TpSplit::kRows ? 0 : t.shape.size() - 1;
  auto [begin, size] = BalancedPart(t.shape[d], degree, index);
  if (size == 0) return Nothing();
  full.offset[d] = begin;
  full.size[d] = size;
  return {full, replica};
}

// FSDP over `world` ranks: this rank's part of the tensor's flat unit.
SynthPiece FsdpPiece(const Model& model, const SynthTensor& t, int rank,
                     int world) {
  const uint64_t unit = model.fsdp_units[t.fsdp_unit];
  const uint64_t part = (unit + world - 1) / world;
  const uint64_t lo =
      std::max<uint64_t>(t.fsdp_offset, std::min(unit, part * rank));
  const uint64_t hi = std::min<uint64_t>(t.fsdp_offset + t.numel,
                                         std::min(unit, part * (rank + 1)));
  if (lo >= hi) return Nothing();
  return {FlatRange{lo - t.fsdp_offset, hi - lo}, false};
}

}  // namespace

absl::string_view LayoutName(SynthLayout layout) {
  switch (layout) {
    case SynthLayout::kTp:
      return "tp";
    case SynthLayout::kFsdp:
      return "fsdp";
    case SynthLayout::kReplicated:
      return "replicated";
    case SynthLayout::kMixed:
      return "mixed";
  }
  return "?";
}

absl::StatusOr<SynthLayout> ParseLayout(absl::string_view name) {
  for (SynthLayout l : kAllSynthLayouts) {
    if (LayoutName(l) == name) return l;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown layout '", format::EscapeText(name),
                   "' (expected tp, fsdp, replicated or mixed)"));
}

ModelConfig ConfigFor(int layers, uint64_t hidden) {
  ModelConfig c;
  c.layers = layers;
  c.hidden = hidden;
  c.ffn = 4 * hidden;
  c.vocab = 8 * hidden + 5;
  return c;
}

ModelConfig ConfigForSize(double size_mib, DType param_dtype) {
  const double bytes = std::max(0.0, size_mib) * 1024 * 1024;
  const int layers = size_mib < 64      ? 2
                     : size_mib < 1024  ? 4
                     : size_mib < 16384 ? 8
                                        : 16;
  // Per element: the parameter plus two float32 states.
  const double elements = bytes / (DTypeSize(param_dtype) + 8);
  // elements(h) = (8h + 5)h + L(12h^2 + 5h) + h = a h^2 + b h.
  const double a = 8 + 12.0 * layers;
  const double b = 6 + 5.0 * layers;
  const double h = (-b + std::sqrt(b * b + 4 * a * elements)) / (2 * a);
  const uint64_t hidden =
      std::max<uint64_t>(8, static_cast<uint64_t>(std::llround(h / 8)) * 8);
  return ConfigFor(layers, hidden);
}

Model DescribeModel(const ModelConfig& config, DType param_dtype) {
  Model m;
  m.config = config;
  m.param_dtype = param_dtype;
  const uint64_t h = config.hidden;
  auto add = [&](std::string name, Shape shape, ValueKind kind, TpSplit tp,
                 int layer) {
    SynthTensor t;
    t.name = std::move(name);
    t.dtype = param_dtype;
    t.shape = std::move(shape);
    t.kind = kind;
    t.tp = tp;
    t.layer = layer;
    t.numel = 1;
    for (uint64_t d : t.shape) t.numel *= d;
    t.fsdp_unit = static_cast<int>(m.fsdp_units.size()) - 1;
    t.fsdp_offset = m.fsdp_units.back();
    m.fsdp_units.back() += t.numel;
    m.param_elements += t.numel;
    m.tensors.push_back(std::move(t));
  };
  m.fsdp_units.push_back(0);
  add("embed.weight", {config.vocab, h}, ValueKind::kWeight, TpSplit::kRows,
      -1);
  for (int i = 0; i < config.layers; ++i) {
    const std::string p = absl::StrCat("layers.", i, ".");
    m.fsdp_units.push_back(0);
    add(p + "attn_norm.weight", {h}, ValueKind::kNorm, TpSplit::kReplicated, i);
    add(p + "attn.qkv.weight", {h, 3 * h}, ValueKind::kWeight,
        TpSplit::kColumns, i);
    add(p + "attn.qkv.bias", {3 * h}, ValueKind::kWeight, TpSplit::kColumns, i);
    add(p + "attn.out.weight", {h, h}, ValueKind::kWeight, TpSplit::kRows, i);
    add(p + "mlp_norm.weight", {h}, ValueKind::kNorm, TpSplit::kReplicated, i);
    add(p + "mlp.up.weight", {h, config.ffn}, ValueKind::kWeight,
        TpSplit::kColumns, i);
    add(p + "mlp.down.weight", {config.ffn, h}, ValueKind::kWeight,
        TpSplit::kRows, i);
  }
  m.fsdp_units.push_back(0);
  add("final_norm.weight", {h}, ValueKind::kNorm, TpSplit::kReplicated, -1);

  const size_t params = m.tensors.size();
  for (const char* state : {"exp_avg", "exp_avg_sq"}) {
    for (size_t i = 0; i < params; ++i) {
      SynthTensor t = m.tensors[i];
      t.param = t.name;
      t.name = absl::StrCat("optimizer.", state, ".", t.param);
      t.dtype = DType::kFloat32;
      t.kind = std::string(state) == "exp_avg" ? ValueKind::kExpAvg
                                               : ValueKind::kExpAvgSq;
      t.optimizer_state = true;
      m.tensors.push_back(std::move(t));
    }
  }
  m.param_bytes = m.param_elements * DTypeSize(param_dtype);
  m.total_bytes =
      m.param_bytes + 2 * m.param_elements * DTypeSize(DType::kFloat32);
  return m;
}

SynthPiece PieceOf(const Model& model, const SynthTensor& t, SynthLayout layout,
                   int rank, int world) {
  switch (layout) {
    case SynthLayout::kTp:
      return TpPiece(t, world, rank, false);
    case SynthLayout::kFsdp:
      return FsdpPiece(model, t, rank, world);
    case SynthLayout::kReplicated:
      return {FullBox(t.shape), true};
    case SynthLayout::kMixed: {
      // ZeRO: optimizer states sharded over every rank.
      if (t.optimizer_state) return FsdpPiece(model, t, rank, world);
      const int tp = world % 2 == 0 ? 2 : 1;
      const int dp = world / tp;
      if (t.layer >= 0 && t.layer % 2 == 1)
        return FsdpPiece(model, t, rank, world);
      return TpPiece(t, tp, rank % tp, dp > 1);
    }
  }
  return Nothing();
}

std::string RngObjectName(int rank) { return absl::StrCat("rng.rank", rank); }

}  // namespace ckpt::synth

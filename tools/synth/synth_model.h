// The synthetic transformer that ckpt-synth writes and verifies: its tensors
// (global shapes, element types, how values are distributed) and the piece of
// each tensor that rank r of N holds under each of the four layouts.
//
// Model (L layers, hidden size H, MLP size F = 4H, vocabulary V = 8H + 5):
//
//   embed.weight                       [V, H]    vocab-parallel (rows)
//   layers.<i>.attn_norm.weight        [H]       replicated
//   layers.<i>.attn.qkv.weight         [H, 3H]   column-parallel (last dim)
//   layers.<i>.attn.qkv.bias           [3H]      column-parallel
//   layers.<i>.attn.out.weight         [H, H]    row-parallel (dim 0)
//   layers.<i>.mlp_norm.weight         [H]       replicated
//   layers.<i>.mlp.up.weight           [H, F]    column-parallel
//   layers.<i>.mlp.down.weight         [F, H]    row-parallel
//   final_norm.weight                  [H]       replicated
//
// plus optimizer.exp_avg.<param> and optimizer.exp_avg_sq.<param> (float32,
// same shape, sharded exactly like their parameter). V is deliberately not a
// multiple of common world sizes, so vocab-parallel splits are uneven.
//
// Layouts (rank r of N):
//   tp          tensor parallelism of degree N: column-parallel tensors split
//               their last dim, row-parallel and embedding tensors dim 0,
//               norms are replicas on every rank. Splits are balanced:
//               part i of n elements is [n*i/N, n*(i+1)/N).
//   fsdp        FSDP flat parameters: the tensors of each unit (the
//               embedding, each layer, the final norm) are concatenated in
//               model order into one flat buffer, which is split into N equal
//               parts of ceil(U/N) elements; a rank's piece of a tensor is the
//               intersection of its part with the tensor, an uneven flat range
//               of the tensor's flattening (often empty).
//   replicated  every rank holds every tensor whole (replicas).
//   mixed       a 2-D parallel job with TP degree T = 2 when N is even (else 1)
//               and DP degree N/T: the embedding and even layers are tensor
//               parallel over the T ranks of a TP group (n-d boxes, replicated
//               across the DP groups), odd layers are FSDP-sharded over all N
//               ranks (flat ranges), norms of even layers and the final norm
//               are replicas on every rank, and every optimizer state is
//               ZeRO-sharded over all N ranks (flat ranges of the FSDP units),
//               whatever its parameter's layout.
//
// Every layout covers every tensor exactly once, replicas aside (checked by
// tests/tools/synth/synth_model_test.cc for N = 1..8).
//
// Thread safety: everything here is a pure function of its arguments.
#ifndef CKPT_TOOLS_SYNTH_SYNTH_MODEL_H_
#define CKPT_TOOLS_SYNTH_SYNTH_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/types.h"

namespace ckpt::synth {

enum class SynthLayout { kTp, kFsdp, kReplicated, kMixed };
inline constexpr SynthLayout kAllSynthLayouts[] = {
    SynthLayout::kTp, SynthLayout::kFsdp, SynthLayout::kReplicated,
    SynthLayout::kMixed};

// "tp", "fsdp", "replicated", "mixed".
absl::string_view LayoutName(SynthLayout layout);
// Parses a LayoutName. InvalidArgument naming the input and the choices.
absl::StatusOr<SynthLayout> ParseLayout(absl::string_view name);

// Dimensions of the model. See the table above.
struct ModelConfig {
  int layers = 2;
  uint64_t hidden = 64;
  uint64_t ffn = 256;
  uint64_t vocab = 517;
  friend bool operator==(const ModelConfig& a, const ModelConfig& b) {
    return a.layers == b.layers && a.hidden == b.hidden && a.ffn == b.ffn &&
           a.vocab == b.vocab;
  }
};

// The model of hidden size `hidden` (>= 1) with `layers` (>= 1) layers.
ModelConfig ConfigFor(int layers, uint64_t hidden);

// A model whose parameters (of `param_dtype`) plus their two float32 Adam
// states come to about `size_mib` MiB: 2 layers below 64 MiB, 4 below 1 GiB,
// 8 below 16 GiB, 16 above; the hidden size is the multiple of 8 (at least
// 8, so the smallest model is about 21 KiB) that comes closest.
ModelConfig ConfigForSize(double size_mib, DType param_dtype);

// How a tensor's values are distributed (see synth_values.h).
enum class ValueKind {
  kWeight,    // 0.02 * u, u uniform in [-1, 1)
  kNorm,      // 1 + 0.1 * u
  kExpAvg,    // 1e-3 * u
  kExpAvgSq,  // 5e-7 * (1 + u): non-negative
  kBytes,     // raw bytes (objects)
};

// How tensor parallelism splits a tensor.
enum class TpSplit {
  kRows,        // dim 0 (row-parallel, vocab-parallel embedding)
  kColumns,     // last dim (column-parallel)
  kReplicated,  // whole on every rank (norms)
};

struct SynthTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  ValueKind kind = ValueKind::kWeight;
  TpSplit tp = TpSplit::kReplicated;
  int layer = -1;  // -1: embedding or final norm
  bool optimizer_state = false;
  std::string param;         // the parameter an optimizer state belongs to
  int fsdp_unit = 0;         // index into Model::fsdp_units
  uint64_t fsdp_offset = 0;  // element offset in the unit's flat buffer
  uint64_t numel = 0;
};

struct Model {
  ModelConfig config;
  DType param_dtype = DType::kBFloat16;
  // Parameters in model order, then optimizer.exp_avg.*, then
  // optimizer.exp_avg_sq.* (each in model order).
  std::vector<SynthTensor> tensors;
  std::vector<uint64_t> fsdp_units;  // element count of each flat buffer
  uint64_t param_elements = 0;
  uint64_t param_bytes = 0;  // parameters only
  uint64_t total_bytes = 0;  // parameters and optimizer states
};

// The tensors of `config` with parameters of `param_dtype`.
Model DescribeModel(const ModelConfig& config, DType param_dtype);

// What one rank holds of a tensor.
struct SynthPiece {
  Region region;         // FlatRange{0, 0} when the rank holds nothing
  bool replica = false;  // another rank holds the same region
};

// The piece of `tensor` (of `model`) held by rank `rank` of `world` under
// `layout`. REQUIRES: 0 <= rank < world.
SynthPiece PieceOf(const Model& model, const SynthTensor& tensor,
                   SynthLayout layout, int rank, int world);

// The objects every checkpoint holds: "step" (the step as decimal text,
// saved by rank 0) and "rng.rank<r>" for each writing rank r (its RNG
// state: kRngStateSize bytes from the value function, saved by rank r).
inline constexpr uint64_t kRngStateSize = 32;
std::string RngObjectName(int rank);

}  // namespace ckpt::synth

#endif  // CKPT_TOOLS_SYNTH_SYNTH_MODEL_H_

// The deterministic values of ckpt-synth: element `index` (in the row-major
// flattening of the global tensor) of tensor `name` under seed `seed` is a
// pure function of the three, so any region of any tensor can be generated
// or checked without materialising the rest.
//
//   key  = XXH64(name bytes, seed)                 (xxHash's 64-bit hash)
//   bits = SplitMix64(key + (index + 1) * 0x9E3779B97F4A7C15)
//
// and the element is derived from `bits` by its dtype and ValueKind:
//   float32/float64/bfloat16/float16: v = mean + scale * u, where
//     u = (bits >> 40) / 2^23 - 1 (24 bits, uniform in [-1, 1)) and
//     (mean, scale) = (0, 0.02) weights, (1, 0.1) norms, (0, 1e-3) exp_avg,
//     (5e-7, 5e-7) exp_avg_sq; computed in float (double for float64) and
//     rounded to nearest even.
//   float8_e4m3fn/float8_e5m2: the low byte of bits with bit 6 (the top
//     exponent bit) cleared: always finite.
//   bool: bits & 1. Integers and ValueKind::kBytes: the low DTypeSize bytes
//     of bits, little-endian.
// Elements are stored little-endian, as in the format.
//
// Changing any of this changes every synthetic checkpoint: bump
// kValueVersion (recorded as metadata "synth.version").
//
// Thread safety: pure functions.
#ifndef CKPT_TOOLS_SYNTH_SYNTH_VALUES_H_
#define CKPT_TOOLS_SYNTH_SYNTH_VALUES_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "ckpt/types.h"
#include "synth/synth_model.h"

namespace ckpt::synth {

inline constexpr int kValueVersion = 1;

// XXH64 of `name` seeded with `seed`.
uint64_t TensorKey(uint64_t seed, absl::string_view name);
// SplitMix64 of the counter for element `index`.
uint64_t ElementBits(uint64_t key, uint64_t index);

// Writes element `index` of the tensor (DTypeSize(dtype) bytes) to `out`.
void ElementValue(uint64_t seed, absl::string_view name, DType dtype,
                  ValueKind kind, uint64_t index, void* out);

// Writes the elements of `region` of `tensor` to `out`, in the region's
// layout (RegionElements(region) * DTypeSize(tensor.dtype) bytes).
// REQUIRES: region valid for tensor.shape.
void FillRegion(uint64_t seed, const SynthTensor& tensor, const Region& region,
                void* out);

// The first element of `data` (laid out as `region`) that differs from the
// generator, or found == false.
struct Difference {
  bool found = false;
  uint64_t local_index = 0;   // position in the region's layout
  uint64_t global_index = 0;  // position in the global flattening
};
Difference FirstDifference(uint64_t seed, const SynthTensor& tensor,
                           const Region& region, const void* data);

// The bytes of an object: element i is the low byte of ElementBits(key, i).
std::string ObjectBytes(uint64_t seed, absl::string_view name, uint64_t size);

// "0x3c23 (0.00998)": the element's stored bytes as a little-endian hex
// number, and its value where the dtype has a natural decimal form.
std::string ElementText(DType dtype, const void* element);

// IEEE binary16 and bfloat16 from float, rounding to nearest even; and
// back (exact).
uint16_t FloatToHalf(float f);
uint16_t FloatToBFloat16(float f);
float HalfToFloat(uint16_t h);
float BFloat16ToFloat(uint16_t b);

}  // namespace ckpt::synth

#endif  // CKPT_TOOLS_SYNTH_SYNTH_VALUES_H_

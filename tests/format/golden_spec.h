// The contents of the v1 golden checkpoint in tests/data/v1/golden, shared
// by its one-time generator (golden_gen.cc) and the tests that read it.
// Changing anything here breaks the golden tests: golden files are never
// regenerated; a new format version gets a new directory.
#ifndef CKPT_TESTS_FORMAT_GOLDEN_SPEC_H_
#define CKPT_TESTS_FORMAT_GOLDEN_SPEC_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt/format/dtype.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/geometry.h"

namespace ckpt::golden {

inline constexpr char kGoldenDir[] = "tests/data/v1/golden";
inline constexpr char kGoldenCheckpoint[] =
    "tests/data/v1/golden/step-00000042";
inline constexpr uint64_t kStep = 42;
inline constexpr char kObjectName[] = "rng";
inline constexpr char kObjectValue[] = "golden-rng-state";

struct GoldenChunk {
  Region region;
  uint32_t shard;
};
struct GoldenEntry {
  std::string name;
  DType dtype;
  Shape shape;
  format::Codec codec;
  std::vector<GoldenChunk> chunks;
};

// Byte k of the global row-major tensor `name`: a pattern that is different
// for every entry and keeps bool bytes 0/1.
inline uint8_t GoldenByte(const GoldenEntry& e, uint64_t k) {
  if (e.dtype == DType::kBool) return static_cast<uint8_t>((k / 1) % 2);
  uint32_t h = 2166136261u;
  for (char c : e.name) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  return static_cast<uint8_t>((k * 131 + h) >> 3);
}

// Global bytes of an entry.
inline std::string GoldenBytes(const GoldenEntry& e) {
  uint64_t n = 1;
  for (uint64_t d : e.shape) n *= d;
  n *= DTypeSize(e.dtype);
  std::string out(n, '\0');
  if (e.name == "model.box") {  // float32 values i*6+j, readable in dumps
    for (uint64_t i = 0; i < n / 4; ++i) {
      float v = static_cast<float>(i);
      std::memcpy(out.data() + 4 * i, &v, 4);
    }
    return out;
  }
  for (uint64_t k = 0; k < n; ++k) out[k] = static_cast<char>(GoldenByte(e, k));
  return out;
}

inline std::vector<GoldenEntry> GoldenEntries() {
  using format::Codec;
  std::vector<GoldenEntry> v;
  uint32_t shard = 0;
  for (DType d : kAllDTypes) {
    v.push_back({std::string("dtypes.") + std::string(DTypeName(d)),
                 d,
                 {3, 5},
                 Codec::kNone,
                 {{FullBox({3, 5}), shard}}});
    shard ^= 1;
  }
  v.push_back({"model.box",
               DType::kFloat32,
               {4, 6},
               Codec::kNone,
               {{Box{{0, 0}, {2, 3}}, 0},
                {Box{{0, 3}, {2, 3}}, 1},
                {Box{{2, 0}, {2, 3}}, 1},
                {Box{{2, 3}, {2, 3}}, 0}}});
  v.push_back({"model.flat",
               DType::kBFloat16,
               {10},
               Codec::kNone,
               {{FlatRange{0, 3}, 0}, {FlatRange{3, 7}, 1}}});
  v.push_back({"optimizer.big.exp_avg",
               DType::kFloat32,
               {3000},
               Codec::kZstd,
               {{FlatRange{0, 1000}, 0}, {FlatRange{1000, 2000}, 1}}});
  v.push_back({"scalar",
               DType::kInt64,
               {},
               Codec::kNone,
               {{Region(std::in_place_type<Box>), 1}}});
  v.push_back({"empty", DType::kFloat32, {0, 4}, Codec::kNone, {}});
  return v;
}

}  // namespace ckpt::golden

#endif  // CKPT_TESTS_FORMAT_GOLDEN_SPEC_H_

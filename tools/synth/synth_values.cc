#include "synth/synth_values.h"

#include <xxhash.h>

#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "ckpt/format/narrow_float.h"

namespace ckpt::synth {
namespace {

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;

struct Dist {
  float mean, scale;
};

Dist DistOf(ValueKind kind) {
  switch (kind) {
    case ValueKind::kWeight:
      return {0.0f, 0.02f};
    case ValueKind::kNorm:
      return {1.0f, 0.1f};
    case ValueKind::kExpAvg:
      return {0.0f, 1e-3f};
    case ValueKind::kExpAvgSq:
      return {5e-7f, 5e-7f};
    case ValueKind::kBytes:
      return {0.0f, 1.0f};
  }
  return {0.0f, 1.0f};
}

// u uniform in [-1, 1) from the top 24 bits.
inline double Uniform(uint64_t bits) {
  return static_cast<double>(bits >> 40) * (1.0 / 8388608.0) - 1.0;
}

inline void Store(void* out, const void* v, int n) { std::memcpy(out, v, n); }

// Writes elements [global, global + n) to `out`. The dtype switch is hoisted
// out of the element loop.
void FillRun(uint64_t key, DType dtype, ValueKind kind, uint64_t global,
             uint64_t n, char* out) {
  const Dist d = DistOf(kind);
  const bool raw = kind == ValueKind::kBytes;
  auto loop = [&](int es, auto&& fn) {
    for (uint64_t i = 0; i < n; ++i)
      fn(ElementBits(key, global + i), out + i * es);
  };
  auto as_float = [&](uint64_t bits) {
    return d.mean + d.scale * static_cast<float>(Uniform(bits));
  };
  if (raw || !IsFloatingPoint(dtype)) {
    if (dtype == DType::kBool) {
      loop(1, [](uint64_t b, char* o) { *o = static_cast<char>(b & 1); });
      return;
    }
    const int es = DTypeSize(dtype);
    loop(es, [es](uint64_t b, char* o) {
      for (int k = 0; k < es; ++k) o[k] = static_cast<char>(b >> (8 * k));
    });
    return;
  }
  switch (dtype) {
    case DType::kFloat32:
      loop(4, [&](uint64_t b, char* o) {
        float v = as_float(b);
        Store(o, &v, 4);
      });
      return;
    case DType::kFloat64:
      loop(8, [&](uint64_t b, char* o) {
        double v = static_cast<double>(d.mean) +
                   static_cast<double>(d.scale) * Uniform(b);
        Store(o, &v, 8);
      });
      return;
    case DType::kBFloat16:
      loop(2, [&](uint64_t b, char* o) {
        uint16_t v = FloatToBFloat16(as_float(b));
        Store(o, &v, 2);
      });
      return;
    case DType::kFloat16:
      loop(2, [&](uint64_t b, char* o) {
        uint16_t v = FloatToHalf(as_float(b));
        Store(o, &v, 2);
      });
      return;
    default:  // float8: finite bit patterns
      loop(1, [](uint64_t b, char* o) { *o = static_cast<char>(b & 0xBF); });
      return;
  }
}

}  // namespace

uint64_t TensorKey(uint64_t seed, absl::string_view name) {
  return XXH64(name.data(), name.size(), seed);
}

uint64_t ElementBits(uint64_t key, uint64_t index) {
  uint64_t z = key + (index + 1) * kGamma;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u)
    return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  x += 0x7FFFu + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return sign | 0x7E00;   // NaN
  if (ax >= 0x477FF000u) return sign | 0x7C00;  // rounds to infinity (>= 65520)
  if (ax < 0x38800000u) {  // below 2^-14: subnormal or zero
    float a;
    std::memcpy(&a, &ax, 4);
    // Units of 2^-24; exact scaling, then round to nearest even. 0x400
    // (rounding up to the smallest normal) is the right encoding too.
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));
  }
  uint32_t h = ((((ax >> 23) - 127 + 15) << 10) | ((ax & 0x7FFFFFu) >> 13));
  const uint32_t rem = ax & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return sign | static_cast<uint16_t>(h);
}

float HalfToFloat(uint16_t h) {
  return static_cast<float>(format::Float16ToDouble(h));
}

float BFloat16ToFloat(uint16_t b) {
  return static_cast<float>(format::BFloat16ToDouble(b));
}

void ElementValue(uint64_t seed, absl::string_view name, DType dtype,
                  ValueKind kind, uint64_t index, void* out) {
  FillRun(TensorKey(seed, name), dtype, kind, index, 1,
          static_cast<char*>(out));
}

void FillRegion(uint64_t seed, const SynthTensor& t, const Region& region,
                void* out) {
  const uint64_t key = TensorKey(seed, t.name);
  const int es = DTypeSize(t.dtype);
  char* o = static_cast<char*>(out);
  ForEachRun(t.shape, region, FullBox(t.shape),
             [&](uint64_t local, uint64_t global, uint64_t n) {
               FillRun(key, t.dtype, t.kind, global, n, o + local * es);
             });
}

Difference FirstDifference(uint64_t seed, const SynthTensor& t,
                           const Region& region, const void* data) {
  constexpr uint64_t kBatch = 8192;  // elements generated per comparison
  const uint64_t key = TensorKey(seed, t.name);
  const int es = DTypeSize(t.dtype);
  const char* d = static_cast<const char*>(data);
  char expected[kBatch * 8];
  Difference diff;
  // Runs come in increasing global order, so the first difference found is
  // the one with the lowest global index.
  ForEachRun(
      t.shape, region, FullBox(t.shape),
      [&](uint64_t local, uint64_t global, uint64_t n) {
        for (uint64_t done = 0; done < n && !diff.found; done += kBatch) {
          const uint64_t k = std::min(kBatch, n - done);
          FillRun(key, t.dtype, t.kind, global + done, k, expected);
          const char* actual = d + (local + done) * es;
          if (std::memcmp(expected, actual, k * es) == 0) continue;
          for (uint64_t i = 0; i < k; ++i) {
            if (std::memcmp(expected + i * es, actual + i * es, es) != 0) {
              diff = {true, local + done + i, global + done + i};
              break;
            }
          }
        }
      });
  return diff;
}

std::string ObjectBytes(uint64_t seed, absl::string_view name, uint64_t size) {
  std::string out(size, '\0');
  FillRun(TensorKey(seed, name), DType::kUInt8, ValueKind::kBytes, 0, size,
          out.data());
  return out;
}

std::string ElementText(DType dtype, const void* element) {
  const int es = DTypeSize(dtype);
  const unsigned char* p = static_cast<const unsigned char*>(element);
  uint64_t raw = 0;
  for (int k = 0; k < es; ++k) raw |= static_cast<uint64_t>(p[k]) << (8 * k);
  std::string hex = absl::StrFormat("0x%0*x", 2 * es, raw);
  switch (dtype) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return absl::StrFormat("%s (%g)", hex, f);
    }
    case DType::kFloat64: {
      double f;
      std::memcpy(&f, p, 8);
      return absl::StrFormat("%s (%g)", hex, f);
    }
    case DType::kBFloat16:
      return absl::StrFormat("%s (%g)", hex,
                             BFloat16ToFloat(static_cast<uint16_t>(raw)));
    case DType::kFloat16:
      return absl::StrFormat("%s (%g)", hex,
                             HalfToFloat(static_cast<uint16_t>(raw)));
    case DType::kBool:
    case DType::kUInt8:
    case DType::kUInt16:
    case DType::kUInt32:
    case DType::kUInt64:
      return absl::StrFormat("%s (%u)", hex, raw);
    case DType::kInt8:
      return absl::StrFormat("%s (%d)", hex, static_cast<int8_t>(raw));
    case DType::kInt16:
      return absl::StrFormat("%s (%d)", hex, static_cast<int16_t>(raw));
    case DType::kInt32:
      return absl::StrFormat("%s (%d)", hex, static_cast<int32_t>(raw));
    case DType::kInt64:
      return absl::StrFormat("%s (%d)", hex, static_cast<int64_t>(raw));
    default:
      return hex;
  }
}

}  // namespace ckpt::synth

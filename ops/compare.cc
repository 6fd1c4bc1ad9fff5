#include "ckpt/ops/compare.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_format.h"
#include "ckpt/format/narrow_float.h"

namespace ckpt::ops {
namespace {

using format::BFloat16ToDouble;
using format::Float16ToDouble;
using format::Float8E4M3FNToDouble;
using format::Float8E5M2ToDouble;

// Elements are little-endian on disk (spec/FORMAT.md §9), whatever the host.
uint64_t LoadLE(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    v |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

enum class Category { kBool, kSigned, kUnsigned, kFloat };

Category CategoryOf(DType d) {
  switch (d) {
    case DType::kBool:
      return Category::kBool;
    case DType::kInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
      return Category::kSigned;
    case DType::kUInt8:
    case DType::kUInt16:
    case DType::kUInt32:
    case DType::kUInt64:
      return Category::kUnsigned;
    default:
      return Category::kFloat;
  }
}

int64_t LoadSigned(const char* p, int es) {
  uint64_t v = LoadLE(p, es);
  if (es < 8 && (v >> (8 * es - 1)) != 0)
    v |= ~uint64_t{0} << (8 * es);  // sign-extend
  return static_cast<int64_t>(v);
}

// |x - y| exactly, as an unsigned 64-bit count.
uint64_t AbsDiffSigned(int64_t x, int64_t y) {
  return x >= y ? static_cast<uint64_t>(x) - static_cast<uint64_t>(y)
                : static_cast<uint64_t>(y) - static_cast<uint64_t>(x);
}

// Difference reported for two decoded floats that compare unequal.
double FloatAbsDiff(double x, double y) {
  const bool nx = std::isnan(x), ny = std::isnan(y);
  if (nx && ny) return 0;
  if (nx || ny) return std::numeric_limits<double>::infinity();
  if (x == y) return 0;  // +0 / -0 in exact mode
  return std::fabs(x - y);
}

bool FloatClose(double x, double y, const Tolerance& tol) {
  const bool nx = std::isnan(x), ny = std::isnan(y);
  if (nx || ny) return nx && ny;
  if (x == y) return true;
  if (std::isinf(x) || std::isinf(y)) return false;
  return std::fabs(x - y) <= tol.atol + tol.rtol * std::fabs(y);
}

void Record(DType dtype, const char* pa, const char* pb, uint64_t index,
            double diff, CompareStats* s) {
  ++s->differing;
  if (diff > s->max_abs_diff || std::isnan(s->max_abs_diff))
    s->max_abs_diff = diff;
  if (!s->has_first) {
    s->has_first = true;
    s->first_index = index;
    s->first_a = ElementToString(dtype, pa);
    s->first_b = ElementToString(dtype, pb);
  }
}

}  // namespace

double ElementToDouble(DType dtype, const char* p) {
  const int es = DTypeSize(dtype);
  switch (dtype) {
    case DType::kBool:
      return p[0] != 0 ? 1.0 : 0.0;
    case DType::kFloat16:
      return Float16ToDouble(static_cast<uint16_t>(LoadLE(p, 2)));
    case DType::kBFloat16:
      return BFloat16ToDouble(static_cast<uint16_t>(LoadLE(p, 2)));
    case DType::kFloat32: {
      uint32_t bits = static_cast<uint32_t>(LoadLE(p, 4));
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::kFloat64: {
      uint64_t bits = LoadLE(p, 8);
      double f;
      std::memcpy(&f, &bits, 8);
      return f;
    }
    case DType::kFloat8E4M3FN:
      return Float8E4M3FNToDouble(static_cast<uint8_t>(p[0]));
    case DType::kFloat8E5M2:
      return Float8E5M2ToDouble(static_cast<uint8_t>(p[0]));
    default:
      break;
  }
  if (CategoryOf(dtype) == Category::kSigned)
    return static_cast<double>(LoadSigned(p, es));
  return static_cast<double>(LoadLE(p, es));
}

std::string ElementToString(DType dtype, const char* p) {
  const int es = DTypeSize(dtype);
  switch (CategoryOf(dtype)) {
    case Category::kBool:
      return p[0] != 0 ? "true" : "false";
    case Category::kSigned:
      return std::to_string(LoadSigned(p, es));
    case Category::kUnsigned:
      return std::to_string(LoadLE(p, es));
    case Category::kFloat:
      break;
  }
  double v = ElementToDouble(dtype, p);
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Digits that round-trip: 17 for float64, 9 for the narrower floats.
  return dtype == DType::kFloat64 ? absl::StrFormat("%.17g", v)
                                  : absl::StrFormat("%.9g", v);
}

namespace {

// The element loop for one category, with the element decoded by `load`
// (inlined per dtype). Elements whose bytes are equal are equal in every
// mode, so runs of equal bytes are skipped with memcmp a block at a time.
template <Category kCat, typename Load>
void CompareLoop(DType dtype, int es, const char* a, const char* b, uint64_t n,
                 uint64_t base, const Tolerance& tol, CompareStats* stats,
                 Load load) {
  const bool exact = tol.exact();
  constexpr uint64_t kBlock = 256;
  for (uint64_t b0 = 0; b0 < n; b0 += kBlock) {
    const uint64_t b1 = std::min(n, b0 + kBlock);
    if (std::memcmp(a + b0 * es, b + b0 * es, (b1 - b0) * es) == 0) continue;
    for (uint64_t i = b0; i < b1; ++i) {
      const char* pa = a + i * es;
      const char* pb = b + i * es;
      if (std::memcmp(pa, pb, es) == 0) continue;
      if constexpr (kCat == Category::kBool) {
        const bool x = pa[0] != 0, y = pb[0] != 0;
        if (!exact && x == y) continue;
        Record(dtype, pa, pb, base + i, x == y ? 0.0 : 1.0, stats);
      } else if constexpr (kCat == Category::kSigned) {
        const int64_t x = LoadSigned(pa, es), y = LoadSigned(pb, es);
        const double d = static_cast<double>(AbsDiffSigned(x, y));
        if (!exact &&
            d <= tol.atol + tol.rtol * std::fabs(static_cast<double>(y)))
          continue;
        Record(dtype, pa, pb, base + i, d, stats);
      } else if constexpr (kCat == Category::kUnsigned) {
        const uint64_t x = LoadLE(pa, es), y = LoadLE(pb, es);
        const double d = static_cast<double>(x >= y ? x - y : y - x);
        if (!exact && d <= tol.atol + tol.rtol * static_cast<double>(y))
          continue;
        Record(dtype, pa, pb, base + i, d, stats);
      } else {
        const double x = load(pa), y = load(pb);
        if (!exact && FloatClose(x, y, tol)) continue;
        Record(dtype, pa, pb, base + i, FloatAbsDiff(x, y), stats);
      }
    }
  }
}

template <DType kD>
double LoadAs(const char* p) {
  return ElementToDouble(kD, p);
}

}  // namespace

void CompareElements(DType dtype, const char* a, const char* b, uint64_t n,
                     uint64_t base, const Tolerance& tol, CompareStats* stats) {
  const int es = DTypeSize(dtype);
  if (std::memcmp(a, b, n * es) == 0) return;
  auto none = [](const char*) { return 0.0; };
  switch (CategoryOf(dtype)) {
    case Category::kBool:
      return CompareLoop<Category::kBool>(dtype, es, a, b, n, base, tol, stats,
                                          none);
    case Category::kSigned:
      return CompareLoop<Category::kSigned>(dtype, es, a, b, n, base, tol,
                                            stats, none);
    case Category::kUnsigned:
      return CompareLoop<Category::kUnsigned>(dtype, es, a, b, n, base, tol,
                                              stats, none);
    case Category::kFloat:
      break;
  }
  switch (dtype) {
#define CKPT_DIFF_FLOAT_CASE(D)                                                \
  case D:                                                                      \
    return CompareLoop<Category::kFloat>(dtype, es, a, b, n, base, tol, stats, \
                                         LoadAs<D>);
    CKPT_DIFF_FLOAT_CASE(DType::kFloat16)
    CKPT_DIFF_FLOAT_CASE(DType::kBFloat16)
    CKPT_DIFF_FLOAT_CASE(DType::kFloat32)
    CKPT_DIFF_FLOAT_CASE(DType::kFloat64)
    CKPT_DIFF_FLOAT_CASE(DType::kFloat8E4M3FN)
    CKPT_DIFF_FLOAT_CASE(DType::kFloat8E5M2)
#undef CKPT_DIFF_FLOAT_CASE
    default:
      return;
  }
}

}  // namespace ckpt::ops

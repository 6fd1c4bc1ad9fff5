#include "ckpt/ops/values.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"

namespace ckpt::ops {
namespace {

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Adds n elements, each converted to double by `to_double`.
template <typename T, typename Fn>
void Accumulate(const char* data, uint64_t n, ValueStats* s, Fn to_double) {
  ValueStats local;
  for (uint64_t i = 0; i < n; ++i) {
    double v = to_double(Load<T>(data + i * sizeof(T)));
    if (std::isnan(v)) {
      ++local.nan;
    } else if (std::isinf(v)) {
      ++local.inf;
    } else {
      local.AddFinite(v);
    }
  }
  local.count = n;
  s->Merge(local);
}

// Counts elements whose exponent field is all ones (`exp_mask`), split by
// the fraction field (`frac_mask`): zero is Inf, nonzero is NaN. A cheap
// first pass finds out whether there is anything to count at all.
template <typename T>
NonFiniteCount CountIeee(const char* data, uint64_t n, T exp_mask,
                         T frac_mask) {
  NonFiniteCount out;
  uint64_t any = 0;
  for (uint64_t i = 0; i < n; ++i) {
    any += (Load<T>(data + i * sizeof(T)) & exp_mask) == exp_mask;
  }
  if (any == 0) return out;
  for (uint64_t i = 0; i < n; ++i) {
    T v = Load<T>(data + i * sizeof(T));
    if ((v & exp_mask) != exp_mask) continue;
    if ((v & frac_mask) != 0) {
      ++out.nan;
    } else {
      ++out.inf;
    }
    if (out.first < 0) out.first = static_cast<int64_t>(i);
  }
  return out;
}

}  // namespace

void ValueStats::AddFinite(double v) {
  ++finite;
  min = std::min(min, v);
  max = std::max(max, v);
  sum += v;
  const double a = std::fabs(v);
  if (a == 0) return;
  if (a > l2_scale) {
    const double r = l2_scale / a;
    l2_ssq = 1 + l2_ssq * r * r;
    l2_scale = a;
  } else {
    const double r = a / l2_scale;
    l2_ssq += r * r;
  }
}

void ValueStats::Merge(const ValueStats& o) {
  count += o.count;
  finite += o.finite;
  nan += o.nan;
  inf += o.inf;
  min = std::min(min, o.min);
  max = std::max(max, o.max);
  sum += o.sum;
  if (o.l2_scale == 0) return;
  if (o.l2_scale > l2_scale) {
    const double r = l2_scale / o.l2_scale;
    l2_ssq = o.l2_ssq + l2_ssq * r * r;
    l2_scale = o.l2_scale;
  } else {
    const double r = o.l2_scale / l2_scale;
    l2_ssq += o.l2_ssq * r * r;
  }
}

double ValueStats::mean() const {
  return finite == 0 ? std::nan("") : sum / finite;
}
double ValueStats::l2() const { return l2_scale * std::sqrt(l2_ssq); }

void AccumulateValues(DType dtype, const char* d, uint64_t n, ValueStats* s) {
  switch (dtype) {
    case DType::kBool:
      return Accumulate<uint8_t>(d, n, s,
                                 [](uint8_t v) { return v != 0 ? 1.0 : 0.0; });
    case DType::kUInt8:
      return Accumulate<uint8_t>(d, n, s, [](uint8_t v) { return double(v); });
    case DType::kUInt16:
      return Accumulate<uint16_t>(d, n, s,
                                  [](uint16_t v) { return double(v); });
    case DType::kUInt32:
      return Accumulate<uint32_t>(d, n, s,
                                  [](uint32_t v) { return double(v); });
    case DType::kUInt64:
      return Accumulate<uint64_t>(d, n, s,
                                  [](uint64_t v) { return double(v); });
    case DType::kInt8:
      return Accumulate<int8_t>(d, n, s, [](int8_t v) { return double(v); });
    case DType::kInt16:
      return Accumulate<int16_t>(d, n, s, [](int16_t v) { return double(v); });
    case DType::kInt32:
      return Accumulate<int32_t>(d, n, s, [](int32_t v) { return double(v); });
    case DType::kInt64:
      return Accumulate<int64_t>(d, n, s, [](int64_t v) { return double(v); });
    case DType::kFloat16:
      return Accumulate<uint16_t>(d, n, s, Float16ToDouble);
    case DType::kBFloat16:
      return Accumulate<uint16_t>(d, n, s, BFloat16ToDouble);
    case DType::kFloat32:
      return Accumulate<float>(d, n, s, [](float v) { return double(v); });
    case DType::kFloat64:
      return Accumulate<double>(d, n, s, [](double v) { return v; });
    case DType::kFloat8E4M3FN:
      return Accumulate<uint8_t>(d, n, s, Float8E4M3FNToDouble);
    case DType::kFloat8E5M2:
      return Accumulate<uint8_t>(d, n, s, Float8E5M2ToDouble);
  }
}

NonFiniteCount CountNonFinite(DType dtype, const char* d, uint64_t n) {
  switch (dtype) {
    case DType::kFloat16:
      return CountIeee<uint16_t>(d, n, 0x7c00, 0x03ff);
    case DType::kBFloat16:
      return CountIeee<uint16_t>(d, n, 0x7f80, 0x007f);
    case DType::kFloat32:
      return CountIeee<uint32_t>(d, n, 0x7f800000u, 0x007fffffu);
    case DType::kFloat64:
      return CountIeee<uint64_t>(d, n, 0x7ff0000000000000ull,
                                 0x000fffffffffffffull);
    case DType::kFloat8E5M2:
      return CountIeee<uint8_t>(d, n, 0x7c, 0x03);
    case DType::kFloat8E4M3FN: {
      // S.1111.111 is NaN; there is no Inf, so the "exponent" mask covers
      // the fraction too and the fraction mask is never consulted as zero.
      return CountIeee<uint8_t>(d, n, 0x7f, 0x7f);
    }
    default:
      return NonFiniteCount{};
  }
}

std::string CompactNumber(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return absl::StrFormat("%.6g", v);
}

}  // namespace ckpt::ops

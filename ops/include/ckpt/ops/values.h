// Element values of stored tensors, for ckpt-inspect --stats and
// ckpt-validate --check-finite: decoding of every dtype of spec/FORMAT.md §9
// to double, NaN/Inf classification, and running statistics.
//
// Elements are little-endian (§9); this code assumes a little-endian host,
// as the rest of ckpt does. Pure computation, no I/O.
#ifndef CKPT_OPS_VALUES_H_
#define CKPT_OPS_VALUES_H_

#include <cstdint>
#include <limits>
#include <string>

#include "ckpt/format/dtype.h"
#include "ckpt/format/narrow_float.h"

namespace ckpt::ops {

// Exact conversions of the narrow floating-point formats
// (ckpt/format/narrow_float.h).
using format::BFloat16ToDouble;
using format::Float16ToDouble;
using format::Float8E4M3FNToDouble;
using format::Float8E5M2ToDouble;

// Running statistics of the elements of a tensor. min, max, sum and the L2
// norm are over the finite elements only; NaN and +-Inf are counted apart.
// The norm is kept scaled (as LAPACK's dlassq does), so it does not
// overflow before the result does. For
// integer dtypes and bool (read as 0/1) every element is finite; 64-bit
// integers are converted to double, so extremes beyond 2^53 are rounded.
struct ValueStats {
  uint64_t count = 0;   // every element seen
  uint64_t finite = 0;  // elements included in min/max/sum
  uint64_t nan = 0;
  uint64_t inf = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double sum = 0;
  double l2_scale = 0;  // largest |x| seen
  double l2_ssq = 0;    // sum of (x / l2_scale)^2

  // Adds one finite value.
  void AddFinite(double v);

  void Merge(const ValueStats& other);
  // Mean and L2 norm of the finite elements (mean is NaN when there are
  // none; the norm is then 0).
  double mean() const;
  double l2() const;
};

// Adds the `n` elements of `dtype` at `data` to *stats.
// REQUIRES: data holds n * DTypeSize(dtype) bytes.
void AccumulateValues(DType dtype, const char* data, uint64_t n,
                      ValueStats* stats);

// NaN and Inf among n elements, and the index of the first of either (-1 if
// none). Always zero for integer dtypes and bool; float8_e4m3fn has no Inf.
struct NonFiniteCount {
  uint64_t nan = 0;
  uint64_t inf = 0;
  int64_t first = -1;
};
// REQUIRES: data holds n * DTypeSize(dtype) bytes.
NonFiniteCount CountNonFinite(DType dtype, const char* data, uint64_t n);

// A value in at most 6 significant digits ("0.25", "-3", "1.5e+20", "nan",
// "inf"), for tables.
std::string CompactNumber(double v);

}  // namespace ckpt::ops

#endif  // CKPT_OPS_VALUES_H_

// Element-wise comparison of two buffers of one dtype, for ckpt-diff.
//
// Semantics (tools/README.md (ckpt-diff)):
//  - exact mode (atol == 0 and rtol == 0, the default): two elements are
//    equal iff their bytes are equal. NaN equals NaN with the same bits;
//    +0 and -0 differ.
//  - tolerance mode: like numpy.isclose(a, b, rtol, atol, equal_nan=True):
//    |a - b| <= atol + rtol * |b|, computed in double. Any NaN equals any
//    NaN; a NaN never equals a number; an infinity equals only the same
//    infinity; +0 equals -0. Integers are compared through their exact
//    difference; bool compares truth values (any non-zero byte is true).
// The absolute difference reported for a differing pair is |a - b| in
// double, +inf when exactly one side is NaN, and 0 when both are NaN.
#ifndef CKPT_OPS_COMPARE_H_
#define CKPT_OPS_COMPARE_H_

#include <cstdint>
#include <string>

#include "ckpt/types.h"

namespace ckpt::ops {

struct Tolerance {
  double atol = 0;
  double rtol = 0;
  bool exact() const { return atol == 0 && rtol == 0; }
};

// Accumulated result of comparing the elements of one entry.
struct CompareStats {
  uint64_t differing = 0;
  double max_abs_diff = 0;  // over differing elements; may be +inf
  // The first differing element (lowest index in the order compared).
  bool has_first = false;
  uint64_t first_index = 0;      // as passed through `base` below
  std::string first_a, first_b;  // its values, printed (ElementToString)
};

// Compares `n` elements of `dtype` at `a` and `b`. Element i is reported as
// index base + i in `stats->first_index`. REQUIRES: a and b hold n elements.
void CompareElements(DType dtype, const char* a, const char* b, uint64_t n,
                     uint64_t base, const Tolerance& tol, CompareStats* stats);

// The value of the element at `p` as text: integers exactly, floats with
// enough digits to round-trip ("nan", "inf", "-inf"), bool as true/false.
std::string ElementToString(DType dtype, const char* p);

// The value of the element at `p` as a double (integers rounded, bool 0/1).
// Floats of every width are decoded as spec/FORMAT.md §9 specifies.
double ElementToDouble(DType dtype, const char* p);

}  // namespace ckpt::ops

#endif  // CKPT_OPS_COMPARE_H_

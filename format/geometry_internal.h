// Small helpers shared by geometry.cc and coverage.cc. Private to format/.
#ifndef CKPT_FORMAT_GEOMETRY_INTERNAL_H_
#define CKPT_FORMAT_GEOMETRY_INTERNAL_H_

#include <algorithm>
#include <cstdint>

#include "ckpt/format/geometry.h"

namespace ckpt::geometry_internal {

// Row-major strides of `dims` (the last is 1).
inline Dims Strides(absl::Span<const uint64_t> dims) {
  Dims s(dims.size());
  uint64_t acc = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    s[i] = acc;
    acc *= dims[i];
  }
  return s;
}

inline uint64_t BoxElements(const Box& b) {
  uint64_t n = 1;
  for (uint64_t s : b.size) n *= s;
  return n;
}

// Intersection of two boxes; false when empty.
inline bool IntersectBoxes(const Box& a, const Box& b, Box* out) {
  size_t n = a.offset.size();
  out->offset.resize(n);
  out->size.resize(n);
  for (size_t d = 0; d < n; ++d) {
    uint64_t lo = std::max(a.offset[d], b.offset[d]);
    uint64_t hi = std::min(a.offset[d] + a.size[d], b.offset[d] + b.size[d]);
    if (lo >= hi) return false;
    out->offset[d] = lo;
    out->size[d] = hi - lo;
  }
  return true;
}

}  // namespace ckpt::geometry_internal

#endif  // CKPT_FORMAT_GEOMETRY_INTERNAL_H_

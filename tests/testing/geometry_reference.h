// Brute-force reference for tensor geometry, independent of the library's
// run computation: tests compare format/geometry.cc against it.
#ifndef CKPT_TESTS_TESTING_GEOMETRY_REFERENCE_H_
#define CKPT_TESTS_TESTING_GEOMETRY_REFERENCE_H_

#include <cstdint>
#include <variant>

#include "ckpt/format/geometry.h"

namespace ckpt::testing {

// Position of global element g in region r's layout, or -1.
inline int64_t LocalIndexOf(const Shape& shape, const Region& r, uint64_t g) {
  if (const FlatRange* f = std::get_if<FlatRange>(&r)) {
    return (g >= f->start && g < f->start + f->length) ? int64_t(g - f->start)
                                                       : -1;
  }
  const Box& b = std::get<Box>(r);
  uint64_t rem = g, local = 0;
  Dims coord(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    coord[d] = rem % shape[d];
    rem /= shape[d];
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (coord[d] < b.offset[d] || coord[d] >= b.offset[d] + b.size[d])
      return -1;
    local = local * b.size[d] + (coord[d] - b.offset[d]);
  }
  return int64_t(local);
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_GEOMETRY_REFERENCE_H_

#include "ckpt/ops/local_range.h"

#include <variant>

namespace ckpt::ops {
namespace {

// Appends the boxes of local elements [b, e) of the sub-box of `box` whose
// dims before `d` are fixed to `fixed` (box-local indices) and whose dims
// from `d` on are full.
void Decompose(const Box& box, size_t d, Dims& fixed, uint64_t b, uint64_t e,
               std::vector<Region>* out) {
  const size_t n = box.size.size();
  if (b >= e) return;
  uint64_t total = 1;
  for (size_t k = d; k < n; ++k) total *= box.size[k];
  auto emit = [&](uint64_t lo, uint64_t hi, bool partial_dim) {
    Box sub = box;
    for (size_t k = 0; k < d; ++k) {
      sub.offset[k] = box.offset[k] + fixed[k];
      sub.size[k] = 1;
    }
    if (partial_dim) {
      sub.offset[d] = box.offset[d] + lo;
      sub.size[d] = hi - lo;
    }
    out->push_back(std::move(sub));
  };
  if (d == n || (b == 0 && e == total)) {
    emit(0, 0, false);
    return;
  }
  const uint64_t stride = total / box.size[d];  // elements per index of dim d
  if (d + 1 == n) {
    emit(b, e, true);
    return;
  }
  const uint64_t i0 = b / stride, i1 = (e - 1) / stride;
  fixed.push_back(0);
  if (i0 == i1) {
    fixed.back() = i0;
    Decompose(box, d + 1, fixed, b - i0 * stride, e - i0 * stride, out);
    fixed.pop_back();
    return;
  }
  uint64_t lo = i0, hi = i1 + 1;
  if (b % stride != 0) {  // head: the rest of index i0
    fixed.back() = i0;
    Decompose(box, d + 1, fixed, b % stride, stride, out);
    lo = i0 + 1;
  }
  const bool tail = e % stride != 0;
  if (tail) hi = i1;
  fixed.pop_back();
  if (lo < hi) emit(lo, hi, true);
  if (tail) {  // the start of index i1
    fixed.push_back(i1);
    Decompose(box, d + 1, fixed, 0, e - i1 * stride, out);
    fixed.pop_back();
  }
}

}  // namespace

std::vector<Region> LocalRangeToRegions(const Region& region, uint64_t begin,
                                        uint64_t end) {
  std::vector<Region> out;
  if (begin >= end) return out;
  if (const FlatRange* f = std::get_if<FlatRange>(&region)) {
    out.push_back(FlatRange{f->start + begin, end - begin});
    return out;
  }
  Dims fixed;
  Decompose(std::get<Box>(region), 0, fixed, begin, end, &out);
  return out;
}

Dims GlobalCoordinates(const Shape& shape, const Region& region,
                       uint64_t local) {
  Dims coord(shape.size());
  if (const FlatRange* f = std::get_if<FlatRange>(&region)) {
    uint64_t g = f->start + local;
    for (size_t d = shape.size(); d-- > 0;) {
      coord[d] = g % shape[d];
      g /= shape[d];
    }
    return coord;
  }
  const Box& b = std::get<Box>(region);
  for (size_t d = shape.size(); d-- > 0;) {
    coord[d] = b.offset[d] + local % b.size[d];
    local /= b.size[d];
  }
  return coord;
}

}  // namespace ckpt::ops

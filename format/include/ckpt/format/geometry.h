// Tensor geometry (spec/FORMAT.md §8.2): global shapes, n-d boxes and flat
// ranges of the row-major flattening, their intersection, and the exact-cover
// check used by writers, readers and validators. Pure computation.
//
// Element indices are uint64. Every function that takes a region assumes it
// was accepted by ValidateRegion for the same shape (REQUIRES), so no
// arithmetic here can overflow: ValidateShape guarantees the element count
// and the byte count of the whole tensor fit in int64.
#ifndef CKPT_FORMAT_GEOMETRY_H_
#define CKPT_FORMAT_GEOMETRY_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ckpt {

// Two dims inline: most chunks are boxes of one or two dims, which then
// allocate nothing, and a Box takes 48 bytes rather than 80 with four
// (a decoded ChunkRecord, records.h, is mostly its region).
using Dims = absl::InlinedVector<uint64_t, 2>;
using Shape = Dims;

// An n-d box: offset[d] <= x[d] < offset[d] + size[d]. Its elements are laid
// out in row-major order of the box itself.
struct Box {
  Dims offset;
  Dims size;
  friend bool operator==(const Box& a, const Box& b) {
    return a.offset == b.offset && a.size == b.size;
  }
};

// Elements [start, start + length) of the row-major flattening of the global
// tensor, laid out in that order.
struct FlatRange {
  uint64_t start = 0;
  uint64_t length = 0;
  friend bool operator==(const FlatRange& a, const FlatRange& b) {
    return a.start == b.start && a.length == b.length;
  }
};

// A chunk's or a destination's place in the global tensor.
using Region = std::variant<Box, FlatRange>;

// The whole tensor as a box.
Box FullBox(const Shape& shape);

// Product of dims; InvalidArgument on overflow of int64.
absl::StatusOr<uint64_t> NumElements(absl::Span<const uint64_t> shape);
// OK iff ndim <= kMaxDims and numel * elem_size fits in int64.
absl::Status ValidateShape(const Shape& shape, int elem_size);
// OK iff the region lies inside the tensor. Overflow-safe. InvalidArgument
// with a message naming the region and the shape.
absl::Status ValidateRegion(const Region& region, const Shape& shape);

// Element count of a valid region.
uint64_t RegionElements(const Region& region);

// Calls fn(src_index, dst_index, count) for each maximal run of elements that
// lie in both `src` and `dst`, where src_index and dst_index are positions in
// the layouts of `src` and `dst` (box-local row-major, or offset from the
// flat range's start). Runs are emitted in increasing global order and are
// contiguous in both layouts. Returns the total element count.
// REQUIRES: both regions valid for `shape`.
uint64_t ForEachRun(const Shape& shape, const Region& src, const Region& dst,
                    absl::FunctionRef<void(uint64_t, uint64_t, uint64_t)> fn);

// Number of elements in both regions. REQUIRES: both valid for `shape`.
uint64_t IntersectionElements(const Shape& shape, const Region& a,
                              const Region& b);

// "[0:4, 8:16]" for a box, "flat[100:200)" for a flat range.
std::string RegionToString(const Region& region);
std::string ShapeToString(absl::Span<const uint64_t> shape);

// Checks that `regions` do not overlap and, unless `allow_gaps`, that they
// cover the whole tensor. O(n log n) for flat ranges, boxes on a grid, and
// irregular boxes whose extents differ in at most two dims. Irregular boxes
// that differ in three or more dims are swept along the dim in which the
// fewest pairs overlap; when even that needs more than 64 * n + 2^22 box
// comparisons, the layout is refused rather than checked for minutes.
// Memory and work are bounded by the regions given, never by the sizes
// they declare (ckpt/format/coverage.h, which also checks regions in
// place).
// Errors are InvalidArgument:
//   "chunks 3 and 7 overlap in [0:4, 8:16]"
//   "elements not covered by any chunk, e.g. [4:8, 0:16] (96 of 256 elements
//   missing)" "irregular chunk layout too complex to verify (100000 chunks):
//   ..."
// REQUIRES: every region valid for `shape`.
absl::Status CheckCover(const Shape& shape, absl::Span<const Region> regions,
                        bool allow_gaps);

}  // namespace ckpt

#endif  // CKPT_FORMAT_GEOMETRY_H_

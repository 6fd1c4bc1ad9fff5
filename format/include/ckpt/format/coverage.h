// The coverage check of spec/FORMAT.md §8.5 (chunks of an entry neither
// overlap nor, unless the entry is partial, leave gaps) over regions that
// stay where they are: a manifest's chunks are checked in place, never
// copied. CheckCover (geometry.h) is the same check over a span.
//
// Memory and work are bounded by the regions given, never by the sizes
// they declare (spec §11 "Resource use"):
//  - regions that are one run of the flattening (flat ranges, and boxes
//    that are one run) are checked as intervals: O(n log n), 24 bytes per
//    non-empty one; overlaps among them are found before anything else;
//  - when other boxes remain, every region becomes boxes (a flat range
//    is cut into up to 2 * ndim - 1 of them). The count is known before
//    anything is allocated, and the layout is refused as too complex to
//    verify when the boxes cut from flat ranges would have more than
//    kCoverFlatCoordinates + 8 per flat range coordinates (ndim a box);
//    each box takes 16 * ndim bytes;
//  - those boxes are checked on the grid of their boundaries when it has
//    at most max(8 * boxes, 2^16) cells (4 bytes each), else swept, and a
//    sweep that would compare more than 64 * boxes + 2^22 pairs is refused.
#ifndef CKPT_FORMAT_COVERAGE_H_
#define CKPT_FORMAT_COVERAGE_H_

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "ckpt/format/geometry.h"
#include "ckpt/format/records.h"

namespace ckpt {

// Coordinates (ndim a box) that the boxes cut from an entry's flat ranges
// may take beyond 8 per flat range: 2^18, 4 MiB of boxes.
inline constexpr uint64_t kCoverFlatCoordinates = 1u << 18;

// The region of the i-th of the regions checked, for i < their count. The
// reference must stay valid until the next call.
using RegionAt = absl::FunctionRef<const Region&(size_t)>;

// CheckCover(shape, {region_at(0), ..., region_at(n - 1)}, allow_gaps)
// without copying the regions; the same errors (InvalidArgument), and
// "irregular chunk layout too complex to verify (N chunks): ..." for a
// layout beyond the bounds above.
// REQUIRES: every region valid for `shape`; n < 2^32.
absl::Status CheckCoverOf(const Shape& shape, size_t n, RegionAt region_at,
                          bool allow_gaps);

namespace format {

// CheckCoverOf over the chunks of `e`, gaps allowed when it is partial.
// REQUIRES: `e` as DecodeManifest accepts it.
absl::Status CheckEntryCover(const EntryRecord& e);

}  // namespace format
}  // namespace ckpt

#endif  // CKPT_FORMAT_COVERAGE_H_

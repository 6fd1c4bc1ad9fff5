// Cutting a region of a tensor into pieces of bounded size that can each be
// loaded with one ckpt::Reader::Load. Shared by ckpt-diff (which compares
// global tensors window by window) and ckpt-reshard (whose tensor sources
// serve byte ranges of a destination piece).
#ifndef CKPT_OPS_LOCAL_RANGE_H_
#define CKPT_OPS_LOCAL_RANGE_H_

#include <cstdint>
#include <vector>

#include "ckpt/types.h"

namespace ckpt::ops {

// The elements [begin, end) of region `region`, counted in the region's own
// layout (box-local row-major, or the flat range in order), as regions of
// the global tensor, in order. Each returned region is contiguous in that
// layout, and they follow each other: loading them one after the other
// into consecutive memory yields exactly the elements [begin, end) of the
// region's layout.
//
// A flat range gives one flat range. A box gives at most 2 * ndim - 1 boxes:
// each has its leading dims fixed to one index, one dim partial and its
// trailing dims full.
// REQUIRES: `region` valid for its tensor; begin <= end <= RegionElements.
std::vector<Region> LocalRangeToRegions(const Region& region, uint64_t begin,
                                        uint64_t end);

// Coordinates in the global tensor of element `local` of `region`'s layout
// (for messages: "first difference at [3, 5]"). For a flat range the global
// flat index is converted with `shape`.
// REQUIRES: local < RegionElements(region), region valid for `shape`.
Dims GlobalCoordinates(const Shape& shape, const Region& region,
                       uint64_t local);

}  // namespace ckpt::ops

#endif  // CKPT_OPS_LOCAL_RANGE_H_

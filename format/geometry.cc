#include "ckpt/format/geometry.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/format/format_constants.h"

namespace ckpt {
namespace {

constexpr uint64_t kMaxI64 =
    static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

Dims Strides(absl::Span<const uint64_t> dims) {
  Dims s(dims.size());
  uint64_t acc = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    s[i] = acc;
    acc *= dims[i];
  }
  return s;
}

uint64_t BoxElements(const Box& b) {
  uint64_t n = 1;
  for (uint64_t s : b.size) n *= s;
  return n;
}

// Coalesces adjacent runs before handing them to the caller.
class RunEmitter {
 public:
  explicit RunEmitter(absl::FunctionRef<void(uint64_t, uint64_t, uint64_t)> fn)
      : fn_(fn) {}
  void Add(uint64_t s, uint64_t d, uint64_t n) {
    if (n == 0) return;
    total_ += n;
    if (count_ != 0 && s == src_ + count_ && d == dst_ + count_) {
      count_ += n;
      return;
    }
    Flush();
    src_ = s;
    dst_ = d;
    count_ = n;
  }
  uint64_t Finish() {
    Flush();
    return total_;
  }

 private:
  void Flush() {
    if (count_ != 0) fn_(src_, dst_, count_);
    count_ = 0;
  }
  absl::FunctionRef<void(uint64_t, uint64_t, uint64_t)> fn_;
  uint64_t src_ = 0, dst_ = 0, count_ = 0, total_ = 0;
};

// Intersection of two boxes; false when empty.
bool IntersectBoxes(const Box& a, const Box& b, Box* out) {
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

// Decomposes a flat range into at most 2*ndim-1 boxes.
void FlatToBoxes(const Shape& shape, const FlatRange& f,
                 std::vector<Box>* out) {
  size_t n = shape.size();
  if (f.length == 0) return;
  if (n == 0) {
    out->push_back(Box{});
    return;
  }
  Dims stride = Strides(shape);
  uint64_t a = f.start, b = f.start + f.length;
  while (a < b) {
    Dims coord(n);
    uint64_t rem = a;
    for (size_t d = 0; d < n; ++d) {
      coord[d] = rem / stride[d];
      rem %= stride[d];
    }
    for (size_t d = 0; d < n; ++d) {
      if (a % stride[d] != 0 || a + stride[d] > b) continue;
      uint64_t cnt = std::min((b - a) / stride[d], shape[d] - coord[d]);
      Box box;
      box.offset.resize(n);
      box.size.resize(n);
      for (size_t e = 0; e < n; ++e) {
        if (e < d) {
          box.offset[e] = coord[e];
          box.size[e] = 1;
        } else if (e == d) {
          box.offset[e] = coord[e];
          box.size[e] = cnt;
        } else {
          box.offset[e] = 0;
          box.size[e] = shape[e];
        }
      }
      out->push_back(std::move(box));
      a += cnt * stride[d];
      break;
    }
  }
}

// If `b` is one contiguous run of the global flattening, returns it.
bool BoxAsFlat(const Shape& shape, const Box& b, FlatRange* out) {
  size_t n = shape.size();
  uint64_t numel = BoxElements(b);
  if (numel == 0) {
    *out = FlatRange{0, 0};
    return true;
  }
  // Find the first dim with size > 1; all later dims must be full.
  size_t k = 0;
  while (k < n && b.size[k] == 1) ++k;
  for (size_t d = k + 1; d < n; ++d) {
    if (b.offset[d] != 0 || b.size[d] != shape[d]) return false;
  }
  Dims stride = Strides(shape);
  uint64_t start = 0;
  for (size_t d = 0; d < n; ++d) start += b.offset[d] * stride[d];
  *out = FlatRange{start, numel};
  return true;
}

absl::Status OverlapError(size_t i, size_t j, const Region& where) {
  return absl::InvalidArgumentError(
      absl::StrCat("chunks ", std::min(i, j), " and ", std::max(i, j),
                   " overlap in ", RegionToString(where)));
}

absl::Status GapError(uint64_t missing, uint64_t numel, const Region* example) {
  return absl::InvalidArgumentError(absl::StrCat(
      "elements not covered by any chunk",
      example ? absl::StrCat(", e.g. ", RegionToString(*example)) : "", " (",
      missing, " of ", numel, " elements missing)"));
}

// For messages: a flat range that is exactly one box is shown as that box.
Region Pretty(const Shape& shape, const FlatRange& f) {
  std::vector<Box> boxes;
  FlatToBoxes(shape, f, &boxes);
  if (boxes.size() == 1) return boxes[0];
  return f;
}

absl::Status CheckIntervals(const Shape& shape, uint64_t numel,
                            std::vector<std::pair<FlatRange, size_t>> iv,
                            bool allow_gaps) {
  std::sort(iv.begin(), iv.end(), [](const auto& x, const auto& y) {
    return x.first.start < y.first.start;
  });
  uint64_t covered_to = 0;
  size_t last = 0;
  uint64_t missing = 0;
  std::optional<FlatRange> first_gap;
  for (const auto& [r, idx] : iv) {
    if (r.length == 0) continue;
    if (r.start < covered_to) {
      uint64_t hi = std::min(covered_to, r.start + r.length);
      return OverlapError(last, idx,
                          Pretty(shape, FlatRange{r.start, hi - r.start}));
    }
    if (r.start > covered_to) {
      missing += r.start - covered_to;
      if (!first_gap) first_gap = FlatRange{covered_to, r.start - covered_to};
    }
    covered_to = r.start + r.length;
    last = idx;
  }
  if (covered_to < numel) {
    missing += numel - covered_to;
    if (!first_gap) first_gap = FlatRange{covered_to, numel - covered_to};
  }
  if (!allow_gaps && missing != 0) {
    Region ex = Pretty(shape, *first_gap);
    return GapError(missing, numel, &ex);
  }
  return absl::OkStatus();
}

// The grid that every box boundary (and the tensor's) spans: along each
// dimension the sorted distinct boundaries; cell c covers
// [bounds[d][c[d]], bounds[d][c[d] + 1]) in every dimension d, and cells
// are numbered row-major.
struct Grid {
  std::vector<std::vector<uint64_t>> bounds;
  Dims stride;  // of the cell numbering
  uint64_t cells = 0;

  // The grid, or nullopt when it would have more cells than `limit` (or
  // an axis without cells).
  static std::optional<Grid> Of(const Shape& shape,
                                const std::vector<Box>& boxes, uint64_t limit) {
    const size_t n = shape.size();
    Grid g;
    g.bounds.resize(n);
    for (size_t d = 0; d < n; ++d) {
      auto& v = g.bounds[d];
      v.reserve(2 * boxes.size() + 2);
      v.push_back(0);
      v.push_back(shape[d]);
      for (const Box& b : boxes) {
        v.push_back(b.offset[d]);
        v.push_back(b.offset[d] + b.size[d]);
      }
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
    }
    g.cells = 1;
    Dims counts(n);
    for (size_t d = 0; d < n; ++d) {
      counts[d] = g.bounds[d].size() - 1;
      if (counts[d] == 0 || g.cells > limit / counts[d]) return std::nullopt;
      g.cells *= counts[d];
    }
    g.stride = Strides(counts);
    return g;
  }

  // The cell range [lo, hi) of `b` per dimension; false if `b` is empty.
  bool Span(const Box& b, Dims* lo, Dims* hi) const {
    const size_t n = bounds.size();
    lo->assign(n, 0);
    hi->assign(n, 0);
    for (size_t d = 0; d < n; ++d) {
      const auto& v = bounds[d];
      (*lo)[d] = std::lower_bound(v.begin(), v.end(), b.offset[d]) - v.begin();
      (*hi)[d] = std::lower_bound(v.begin(), v.end(), b.offset[d] + b.size[d]) -
                 v.begin();
      if ((*lo)[d] == (*hi)[d]) return false;
    }
    return true;
  }

  // The box of cell number `idx`.
  Box CellBox(uint64_t idx) const {
    Box cell;
    for (size_t d = 0; d < bounds.size(); ++d) {
      const uint64_t c = idx / stride[d];
      idx %= stride[d];
      cell.offset.push_back(bounds[d][c]);
      cell.size.push_back(bounds[d][c + 1] - bounds[d][c]);
    }
    return cell;
  }
};

// Marks the cells of box i with i; the first cell already marked is an
// overlap, returned as an error naming both owners.
absl::Status MarkCells(const Grid& grid, const std::vector<Box>& boxes,
                       const std::vector<size_t>& owner,
                       std::vector<int64_t>* mark) {
  const size_t n = grid.bounds.size();
  Dims lo, hi;
  for (size_t i = 0; i < boxes.size(); ++i) {
    if (!grid.Span(boxes[i], &lo, &hi)) continue;  // empty box
    Dims c = lo;
    for (;;) {
      uint64_t idx = 0;
      for (size_t d = 0; d < n; ++d) idx += c[d] * grid.stride[d];
      if ((*mark)[idx] >= 0) {
        return OverlapError(owner[(*mark)[idx]], owner[i], grid.CellBox(idx));
      }
      (*mark)[idx] = static_cast<int64_t>(i);
      size_t d = n;
      while (d-- > 0) {
        if (++c[d] < hi[d]) break;
        c[d] = lo[d];
      }
      if (d == static_cast<size_t>(-1)) break;
    }
  }
  return absl::OkStatus();
}

// The elements in unmarked cells, as a gap error with the first such cell
// as example; OK when every cell is marked.
absl::Status CheckNoGap(const Shape& shape, const Grid& grid,
                        const std::vector<int64_t>& mark) {
  uint64_t missing = 0;
  std::optional<Box> example;
  for (uint64_t idx = 0; idx < grid.cells; ++idx) {
    if (mark[idx] >= 0) continue;
    Box cell = grid.CellBox(idx);
    missing += BoxElements(cell);
    if (!example) example = std::move(cell);
  }
  if (missing == 0) return absl::OkStatus();
  uint64_t numel = 1;
  for (uint64_t s : shape) numel *= s;
  Region ex = *example;
  return GapError(missing, numel, &ex);
}

// Boxes on a grid: mark cells of the grid spanned by all box boundaries.
// Returns false (and does nothing) when the grid would be too large.
bool CheckGrid(const Shape& shape, const std::vector<Box>& boxes,
               const std::vector<size_t>& owner, bool allow_gaps,
               absl::Status* result) {
  const uint64_t limit = std::max<uint64_t>(8 * boxes.size(), 1u << 16);
  std::optional<Grid> grid = Grid::Of(shape, boxes, limit);
  if (!grid) return false;
  std::vector<int64_t> mark(grid->cells, -1);
  *result = MarkCells(*grid, boxes, owner, &mark);
  if (result->ok() && !allow_gaps) *result = CheckNoGap(shape, *grid, mark);
  return true;
}

// Number of pairs among the non-empty intervals [lo[i], hi[i]) that
// intersect: all pairs minus those where one ends before the other starts.
uint64_t IntersectingPairs(std::vector<uint64_t> lo, std::vector<uint64_t> hi) {
  std::sort(lo.begin(), lo.end());
  std::sort(hi.begin(), hi.end());
  const uint64_t n = lo.size();
  uint64_t disjoint = 0;
  size_t ended = 0;
  for (uint64_t start : lo) {
    while (ended < hi.size() && hi[ended] <= start) ++ended;
    disjoint += ended;
  }
  return n * (n - 1) / 2 - disjoint;
}

// Exact check for boxes that differ in at most two dims (`d0`, `d1`; d1 may
// equal d0 when they differ in one): sweep along d0, keeping the d1
// intervals of the boxes that span the sweep position in an ordered map.
// Those intervals are pairwise disjoint until the first overlap is found, so
// a new box need only be compared with its two neighbours. O(n log n).
absl::Status Sweep2D(const std::vector<Box>& boxes,
                     const std::vector<size_t>& live,
                     const std::vector<size_t>& owner, size_t d0, size_t d1) {
  struct Rect {
    uint64_t lo0, hi0, lo1, hi1;
    size_t box;
  };
  std::vector<Rect> rects;
  rects.reserve(live.size());
  for (size_t i : live) {
    const Box& b = boxes[i];
    Rect r{b.offset[d0], b.offset[d0] + b.size[d0], 0, 1, i};
    if (d1 != d0) {
      r.lo1 = b.offset[d1];
      r.hi1 = b.offset[d1] + b.size[d1];
    }
    rects.push_back(r);
  }
  std::sort(rects.begin(), rects.end(),
            [](const Rect& a, const Rect& b) { return a.lo0 < b.lo0; });
  std::map<uint64_t, const Rect*> active;  // by lo1
  // (hi0, lo1) of the active rects, soonest end first.
  std::priority_queue<std::pair<uint64_t, uint64_t>,
                      std::vector<std::pair<uint64_t, uint64_t>>,
                      std::greater<>>
      ends;
  for (const Rect& r : rects) {
    while (!ends.empty() && ends.top().first <= r.lo0) {
      active.erase(ends.top().second);
      ends.pop();
    }
    auto next = active.lower_bound(r.lo1);
    const Rect* other = nullptr;
    if (next != active.end() && next->second->lo1 < r.hi1) {
      other = next->second;
    } else if (next != active.begin() && std::prev(next)->second->hi1 > r.lo1) {
      other = std::prev(next)->second;
    }
    if (other != nullptr) {
      Box x;
      IntersectBoxes(boxes[r.box], boxes[other->box], &x);
      return OverlapError(owner[other->box], owner[r.box], x);
    }
    active.emplace_hint(next, r.lo1, &r);
    ends.emplace(r.hi0, r.lo1);
  }
  return absl::OkStatus();
}

// The dims in which the `live` boxes differ (in offset or size); the others
// cannot separate two boxes.
std::vector<size_t> SeparatingDims(size_t n, const std::vector<Box>& boxes,
                                   const std::vector<size_t>& live) {
  std::vector<size_t> dims;
  for (size_t d = 0; d < n && !live.empty(); ++d) {
    const Box& f = boxes[live[0]];
    for (size_t i : live) {
      if (boxes[i].offset[d] != f.offset[d] || boxes[i].size[d] != f.size[d]) {
        dims.push_back(d);
        break;
      }
    }
  }
  return dims;
}

// Sweeps the `live` boxes along the dim of `dims` in which the fewest pairs
// overlap, comparing every pair that overlaps in it: the first overlap as
// an error, InvalidArgument when that count is above the budget. Sorts
// `live`.
absl::Status SweepFewestPairs(const std::vector<Box>& boxes,
                              std::vector<size_t>& live,
                              const std::vector<size_t>& owner,
                              const std::vector<size_t>& dims,
                              size_t num_chunks) {
  size_t best = dims[0];
  uint64_t best_pairs = std::numeric_limits<uint64_t>::max();
  std::vector<uint64_t> lo(live.size()), hi(live.size());
  for (size_t d : dims) {
    for (size_t k = 0; k < live.size(); ++k) {
      lo[k] = boxes[live[k]].offset[d];
      hi[k] = lo[k] + boxes[live[k]].size[d];
    }
    uint64_t pairs = IntersectingPairs(lo, hi);
    if (pairs < best_pairs) {
      best_pairs = pairs;
      best = d;
    }
  }
  const uint64_t budget = 64 * static_cast<uint64_t>(live.size()) + (1u << 22);
  if (best_pairs > budget) {
    return absl::InvalidArgumentError(
        absl::StrCat("irregular chunk layout too complex to verify (",
                     num_chunks, " chunks): ", best_pairs,
                     " pairs of boxes to compare, the limit is ", budget));
  }
  std::sort(live.begin(), live.end(), [&](size_t a, size_t b) {
    return boxes[a].offset[best] < boxes[b].offset[best];
  });
  std::vector<size_t> active;
  for (size_t i : live) {
    const Box& b = boxes[i];
    active.erase(std::remove_if(active.begin(), active.end(),
                                [&](size_t j) {
                                  return boxes[j].offset[best] +
                                             boxes[j].size[best] <=
                                         b.offset[best];
                                }),
                 active.end());
    for (size_t j : active) {
      Box x;
      if (IntersectBoxes(b, boxes[j], &x)) {
        return OverlapError(owner[j], owner[i], x);
      }
    }
    active.push_back(i);
  }
  return absl::OkStatus();
}

// Irregular boxes (the grid would be too large). Dims in which every
// non-empty box has the same extent cannot separate two boxes, so they are
// ignored. With at most two dims left the check is exact and O(n log n)
// (Sweep2D). Otherwise boxes are swept along the dim in which the fewest
// pairs of boxes overlap, comparing every pair that overlaps in it; that
// count is known in advance, and above a budget the layout is refused
// rather than spending minutes on it.
absl::Status CheckSweep(const Shape& shape, const std::vector<Box>& boxes,
                        const std::vector<size_t>& owner, size_t num_chunks,
                        bool allow_gaps) {
  std::vector<size_t> live;
  uint64_t covered = 0;
  for (size_t i = 0; i < boxes.size(); ++i) {
    uint64_t vol = BoxElements(boxes[i]);
    if (vol == 0) continue;
    live.push_back(i);
    covered += vol;
  }
  const std::vector<size_t> dims = SeparatingDims(shape.size(), boxes, live);
  absl::Status overlap;
  if (dims.empty()) {
    // All live boxes are the same box.
    if (live.size() > 1) {
      overlap = OverlapError(owner[live[0]], owner[live[1]], boxes[live[0]]);
    }
  } else if (dims.size() <= 2) {
    overlap = Sweep2D(boxes, live, owner, dims[0], dims.back());
  } else {
    overlap = SweepFewestPairs(boxes, live, owner, dims, num_chunks);
  }
  if (!overlap.ok()) return overlap;
  uint64_t numel = 1;
  for (uint64_t s : shape) numel *= s;
  if (!allow_gaps && covered != numel) {
    return GapError(numel - covered, numel, nullptr);
  }
  return absl::OkStatus();
}

}  // namespace

Box FullBox(const Shape& shape) {
  Box b;
  b.offset.assign(shape.size(), 0);
  b.size = shape;
  return b;
}

absl::StatusOr<uint64_t> NumElements(absl::Span<const uint64_t> shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (d != 0 && n > kMaxI64 / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape ", ShapeToString(shape), ": element count overflows int64"));
    }
    n *= d;
  }
  // A zero dim makes the product 0 even if other dims are huge; the dims
  // themselves must still be representable.
  for (uint64_t d : shape) {
    if (d > kMaxI64) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape ", ShapeToString(shape), ": dim ", d, " exceeds int64"));
    }
  }
  return n;
}

absl::Status ValidateShape(const Shape& shape, int elem_size) {
  if (shape.size() > format::kMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape has ", shape.size(), " dims; the limit is ", format::kMaxDims));
  }
  auto n = NumElements(shape);
  if (!n.ok()) return n.status();
  if (elem_size > 0 && *n > kMaxI64 / static_cast<uint64_t>(elem_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", ShapeToString(shape), ": byte count overflows int64"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRegion(const Region& region, const Shape& shape) {
  if (const Box* b = std::get_if<Box>(&region)) {
    if (b->offset.size() != shape.size() || b->size.size() != shape.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("box has ", b->offset.size(), "/", b->size.size(),
                       " dims (offset/size), tensor has ", shape.size()));
    }
    for (size_t d = 0; d < shape.size(); ++d) {
      if (b->offset[d] > shape[d] || b->size[d] > shape[d] - b->offset[d]) {
        return absl::InvalidArgumentError(
            absl::StrCat("box ", RegionToString(region), " exceeds shape ",
                         ShapeToString(shape), " in dim ", d));
      }
    }
    return absl::OkStatus();
  }
  const FlatRange& f = std::get<FlatRange>(region);
  auto n = NumElements(shape);
  if (!n.ok()) return n.status();
  if (f.start > *n || f.length > *n - f.start) {
    return absl::InvalidArgumentError(
        absl::StrCat("flat range ", RegionToString(region), " exceeds the ", *n,
                     " elements of shape ", ShapeToString(shape)));
  }
  return absl::OkStatus();
}

uint64_t RegionElements(const Region& region) {
  if (const Box* b = std::get_if<Box>(&region)) return BoxElements(*b);
  return std::get<FlatRange>(region).length;
}

uint64_t ForEachRun(const Shape& shape, const Region& src, const Region& dst,
                    absl::FunctionRef<void(uint64_t, uint64_t, uint64_t)> fn) {
  RunEmitter out(fn);
  const FlatRange* sf = std::get_if<FlatRange>(&src);
  const FlatRange* df = std::get_if<FlatRange>(&dst);
  if (sf && df) {
    uint64_t lo = std::max(sf->start, df->start);
    uint64_t hi = std::min(sf->start + sf->length, df->start + df->length);
    if (lo < hi) out.Add(lo - sf->start, lo - df->start, hi - lo);
    return out.Finish();
  }
  const size_t n = shape.size();
  const Box* sb = std::get_if<Box>(&src);
  const Box* db = std::get_if<Box>(&dst);
  const FlatRange* flat = sf ? sf : df;
  Box inter;
  if (sb && db) {
    if (!IntersectBoxes(*sb, *db, &inter)) return 0;
  } else {
    inter = sb ? *sb : *db;
    if (flat->length == 0 || BoxElements(inter) == 0) return 0;
  }
  if (n == 0) {
    out.Add(0, 0, 1);
    return out.Finish();
  }
  for (uint64_t s : inter.size) {
    if (s == 0) return 0;
  }
  Dims stride = Strides(shape);
  uint64_t flat_end = 0;
  if (flat) {
    flat_end = flat->start + flat->length;
    uint64_t first0 = flat->start / stride[0];
    uint64_t last0 = (flat_end - 1) / stride[0];
    uint64_t lo = std::max(inter.offset[0], first0);
    uint64_t hi = std::min(inter.offset[0] + inter.size[0], last0 + 1);
    if (lo >= hi) return 0;
    inter.size[0] = hi - lo;
    inter.offset[0] = lo;
  }
  Dims sstride, dstride;
  if (sb) sstride = Strides(sb->size);
  if (db) dstride = Strides(db->size);
  auto local = [&](const Box* b, const Dims& bstride, const Dims& c,
                   uint64_t last) {
    uint64_t idx = 0;
    for (size_t d = 0; d + 1 < n; ++d)
      idx += (c[d] - b->offset[d]) * bstride[d];
    return idx + (last - b->offset[n - 1]);
  };
  const uint64_t row_len = inter.size[n - 1];
  Dims c(inter.offset.begin(), inter.offset.end());
  while (true) {
    uint64_t g = 0;
    for (size_t d = 0; d + 1 < n; ++d) g += c[d] * stride[d];
    g += inter.offset[n - 1];
    uint64_t lo = g, hi = g + row_len;
    if (flat) {
      if (lo >= flat_end) break;
      lo = std::max(lo, flat->start);
      hi = std::min(hi, flat_end);
    }
    if (lo < hi) {
      uint64_t last = inter.offset[n - 1] + (lo - g);
      uint64_t s = sb ? local(sb, sstride, c, last) : lo - sf->start;
      uint64_t d = db ? local(db, dstride, c, last) : lo - df->start;
      out.Add(s, d, hi - lo);
    }
    size_t d = n - 1;
    bool done = true;
    while (d-- > 0) {
      if (++c[d] < inter.offset[d] + inter.size[d]) {
        done = false;
        break;
      }
      c[d] = inter.offset[d];
    }
    if (done) break;
  }
  return out.Finish();
}

uint64_t IntersectionElements(const Shape& shape, const Region& a,
                              const Region& b) {
  const Box* ab = std::get_if<Box>(&a);
  const Box* bb = std::get_if<Box>(&b);
  if (ab && bb) {
    Box x;
    return IntersectBoxes(*ab, *bb, &x) ? BoxElements(x) : 0;
  }
  return ForEachRun(shape, a, b, [](uint64_t, uint64_t, uint64_t) {});
}

std::string ShapeToString(absl::Span<const uint64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string RegionToString(const Region& region) {
  if (const Box* b = std::get_if<Box>(&region)) {
    std::vector<std::string> parts;
    for (size_t d = 0; d < b->offset.size() && d < b->size.size(); ++d) {
      parts.push_back(
          absl::StrCat(b->offset[d], ":", b->offset[d] + b->size[d]));
    }
    return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
  }
  const FlatRange& f = std::get<FlatRange>(region);
  return absl::StrCat("flat[", f.start, ":", f.start + f.length, ")");
}

absl::Status CheckCover(const Shape& shape, absl::Span<const Region> regions,
                        bool allow_gaps) {
  uint64_t numel = 1;
  for (uint64_t s : shape) numel *= s;
  // Fast path: every region is one contiguous run of the flattening.
  std::vector<std::pair<FlatRange, size_t>> iv;
  iv.reserve(regions.size());
  bool all_flat = true;
  for (size_t i = 0; i < regions.size() && all_flat; ++i) {
    FlatRange f;
    if (const Box* b = std::get_if<Box>(&regions[i])) {
      if (!BoxAsFlat(shape, *b, &f)) all_flat = false;
    } else {
      f = std::get<FlatRange>(regions[i]);
    }
    iv.emplace_back(f, i);
  }
  if (all_flat) return CheckIntervals(shape, numel, std::move(iv), allow_gaps);

  std::vector<Box> boxes;
  std::vector<size_t> owner;
  boxes.reserve(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    if (const Box* b = std::get_if<Box>(&regions[i])) {
      boxes.push_back(*b);
      owner.push_back(i);
    } else {
      size_t before = boxes.size();
      FlatToBoxes(shape, std::get<FlatRange>(regions[i]), &boxes);
      owner.resize(boxes.size(), i);
      (void)before;
    }
  }
  absl::Status result;
  if (CheckGrid(shape, boxes, owner, allow_gaps, &result)) return result;
  return CheckSweep(shape, boxes, owner, regions.size(), allow_gaps);
}

}  // namespace ckpt

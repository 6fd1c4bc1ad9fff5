#include "ckpt/format/coverage.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "geometry_internal.h"

namespace ckpt {
namespace {

using geometry_internal::BoxElements;
using geometry_internal::IntersectBoxes;
using geometry_internal::Strides;

// Calls fn(coord, d, count) for each box that the flat range `f` is cut
// into, in increasing order, at most 2 * ndim - 1 of them: the box is
// coord[e] in each dim e < d, [coord[d], coord[d] + count) in dim d, and
// whole in the dims after d. Stops when fn returns false.
// REQUIRES: shape.size() >= 1, `f` valid for `shape`, `stride` its strides.
template <typename Fn>
void ForEachFlatPiece(const Shape& shape, const Dims& stride,
                      const FlatRange& f, Fn fn) {
  const size_t n = shape.size();
  uint64_t a = f.start;
  const uint64_t b = f.start + f.length;
  Dims coord(n);
  while (a < b) {
    uint64_t rem = a;
    for (size_t d = 0; d < n; ++d) {
      coord[d] = rem / stride[d];
      rem %= stride[d];
    }
    // Dim n - 1 (stride 1) always qualifies, so every pass advances.
    for (size_t d = 0; d < n; ++d) {
      if (a % stride[d] != 0 || a + stride[d] > b) continue;
      const uint64_t cnt = std::min((b - a) / stride[d], shape[d] - coord[d]);
      if (!fn(coord, d, cnt)) return;
      a += cnt * stride[d];
      break;
    }
  }
}

Box PieceBox(const Shape& shape, const Dims& coord, size_t d, uint64_t cnt) {
  Box box = FullBox(shape);
  for (size_t e = 0; e <= d; ++e) {
    box.offset[e] = coord[e];
    box.size[e] = e < d ? 1 : cnt;
  }
  return box;
}

// If `b` is one contiguous run of the global flattening, returns it.
bool BoxAsFlat(const Shape& shape, const Box& b, FlatRange* out) {
  const size_t n = shape.size();
  const uint64_t numel = BoxElements(b);
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
  const Dims stride = Strides(shape);
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

absl::Status TooComplex(size_t num_chunks, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("irregular chunk layout too complex to verify (", num_chunks,
                   " chunks): ", why));
}

// For messages: a flat range that is exactly one box is shown as that box.
Region Pretty(const Shape& shape, const FlatRange& f) {
  if (shape.empty()) return f.length != 0 ? Region(Box{}) : Region(f);
  int pieces = 0;
  Box one;
  ForEachFlatPiece(shape, Strides(shape), f,
                   [&](const Dims& coord, size_t d, uint64_t cnt) {
                     if (++pieces > 1) return false;
                     one = PieceBox(shape, coord, d, cnt);
                     return true;
                   });
  if (pieces == 1) return one;
  return f;
}

// A non-empty region that is one run of the flattening.
struct Run {
  uint64_t start, length;
  uint32_t chunk;
};

// Overlaps among `runs` (sorted here by start, then chunk) and, unless
// `allow_gaps`, the elements of [0, numel) that none covers.
absl::Status CheckRuns(const Shape& shape, uint64_t numel,
                       std::vector<Run>& runs, bool allow_gaps) {
  std::sort(runs.begin(), runs.end(), [](const Run& x, const Run& y) {
    return x.start != y.start ? x.start < y.start : x.chunk < y.chunk;
  });
  uint64_t covered_to = 0;
  size_t last = 0;
  uint64_t missing = 0;
  std::optional<FlatRange> first_gap;
  for (const Run& r : runs) {
    if (r.start < covered_to) {
      const uint64_t hi = std::min(covered_to, r.start + r.length);
      return OverlapError(last, r.chunk,
                          Pretty(shape, FlatRange{r.start, hi - r.start}));
    }
    if (r.start > covered_to) {
      missing += r.start - covered_to;
      if (!first_gap) first_gap = FlatRange{covered_to, r.start - covered_to};
    }
    covered_to = r.start + r.length;
    last = r.chunk;
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

// Non-empty boxes of one entry in one array, 2 * ndim coordinates each: box
// k spans [Lo(k, d), Hi(k, d)) in dim d and comes from chunk Chunk(k).
class BoxList {
 public:
  explicit BoxList(size_t ndim) : n_(ndim) {}

  void Reserve(size_t boxes) {
    v_.reserve(2 * n_ * boxes);
    chunk_.reserve(boxes);
  }
  void Add(const Box& b, uint32_t chunk) {
    for (size_t d = 0; d < n_; ++d) v_.push_back(b.offset[d]);
    for (size_t d = 0; d < n_; ++d) v_.push_back(b.offset[d] + b.size[d]);
    chunk_.push_back(chunk);
  }
  // The box of ForEachFlatPiece's (coord, d, cnt).
  void AddPiece(const Shape& shape, const Dims& coord, size_t d, uint64_t cnt,
                uint32_t chunk) {
    for (size_t e = 0; e < n_; ++e) v_.push_back(e <= d ? coord[e] : 0);
    for (size_t e = 0; e < n_; ++e) {
      v_.push_back(e < d ? coord[e] + 1 : e == d ? coord[e] + cnt : shape[e]);
    }
    chunk_.push_back(chunk);
  }

  size_t size() const { return chunk_.size(); }
  size_t ndim() const { return n_; }
  uint64_t Lo(size_t k, size_t d) const { return v_[2 * n_ * k + d]; }
  uint64_t Hi(size_t k, size_t d) const { return v_[2 * n_ * k + n_ + d]; }
  uint32_t Chunk(size_t k) const { return chunk_[k]; }

  uint64_t Elements(size_t k) const {
    uint64_t e = 1;
    for (size_t d = 0; d < n_; ++d) e *= Hi(k, d) - Lo(k, d);
    return e;
  }
  Box Get(size_t k) const {
    Box b;
    for (size_t d = 0; d < n_; ++d) {
      b.offset.push_back(Lo(k, d));
      b.size.push_back(Hi(k, d) - Lo(k, d));
    }
    return b;
  }
  // "chunks i and j overlap in <the intersection of boxes a and b>".
  // REQUIRES: the two boxes intersect.
  absl::Status Overlap(size_t a, size_t b) const {
    Box x;
    IntersectBoxes(Get(a), Get(b), &x);
    return OverlapError(Chunk(a), Chunk(b), x);
  }
  bool Intersect(size_t a, size_t b) const {
    for (size_t d = 0; d < n_; ++d) {
      if (std::max(Lo(a, d), Lo(b, d)) >= std::min(Hi(a, d), Hi(b, d))) {
        return false;
      }
    }
    return true;
  }

 private:
  size_t n_;
  std::vector<uint64_t> v_;
  std::vector<uint32_t> chunk_;
};

// The grid that every box boundary (and the tensor's) spans: along each
// dimension the sorted distinct boundaries; cell c covers
// [bounds[d][c[d]], bounds[d][c[d] + 1]) in every dimension d, and cells
// are numbered row-major.
struct Grid {
  std::vector<std::vector<uint64_t>> bounds;
  Dims stride;  // of the cell numbering
  uint64_t cells = 0;

  // The grid, or nullopt when it would have more cells than `limit` (or
  // an axis without cells). One dimension at a time, so that a grid too
  // large is given up after one scratch array of 2 * boxes + 2 values.
  static std::optional<Grid> Of(const Shape& shape, const BoxList& boxes,
                                uint64_t limit) {
    const size_t n = shape.size();
    Grid g;
    g.bounds.resize(n);
    g.cells = 1;
    Dims counts(n);
    std::vector<uint64_t> v;
    v.reserve(2 * boxes.size() + 2);
    for (size_t d = 0; d < n; ++d) {
      v.assign({0, shape[d]});
      for (size_t k = 0; k < boxes.size(); ++k) {
        v.push_back(boxes.Lo(k, d));
        v.push_back(boxes.Hi(k, d));
      }
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
      counts[d] = v.size() - 1;
      if (counts[d] == 0 || g.cells > limit / counts[d]) return std::nullopt;
      g.cells *= counts[d];
      g.bounds[d] = v;
    }
    g.stride = Strides(counts);
    return g;
  }

  // The cell range [lo, hi) of box k per dimension.
  void Span(const BoxList& boxes, size_t k, Dims* lo, Dims* hi) const {
    const size_t n = bounds.size();
    lo->assign(n, 0);
    hi->assign(n, 0);
    for (size_t d = 0; d < n; ++d) {
      const auto& v = bounds[d];
      (*lo)[d] =
          std::lower_bound(v.begin(), v.end(), boxes.Lo(k, d)) - v.begin();
      (*hi)[d] =
          std::lower_bound(v.begin(), v.end(), boxes.Hi(k, d)) - v.begin();
    }
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

// Marks the cells of box k with k; the first cell already marked is an
// overlap, returned as an error naming both chunks.
absl::Status MarkCells(const Grid& grid, const BoxList& boxes,
                       std::vector<int32_t>* mark) {
  const size_t n = grid.bounds.size();
  Dims lo, hi;
  for (size_t k = 0; k < boxes.size(); ++k) {
    grid.Span(boxes, k, &lo, &hi);
    Dims c = lo;
    for (;;) {
      uint64_t idx = 0;
      for (size_t d = 0; d < n; ++d) idx += c[d] * grid.stride[d];
      if ((*mark)[idx] >= 0) {
        return OverlapError(boxes.Chunk((*mark)[idx]), boxes.Chunk(k),
                            grid.CellBox(idx));
      }
      (*mark)[idx] = static_cast<int32_t>(k);
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
absl::Status CheckNoGap(uint64_t numel, const Grid& grid,
                        const std::vector<int32_t>& mark) {
  uint64_t missing = 0;
  std::optional<Box> example;
  for (uint64_t idx = 0; idx < grid.cells; ++idx) {
    if (mark[idx] >= 0) continue;
    Box cell = grid.CellBox(idx);
    missing += BoxElements(cell);
    if (!example) example = std::move(cell);
  }
  if (missing == 0) return absl::OkStatus();
  Region ex = *example;
  return GapError(missing, numel, &ex);
}

// Boxes on a grid: mark cells of the grid spanned by all box boundaries.
// Returns false (and does nothing) when the grid would be too large.
bool CheckGrid(const Shape& shape, uint64_t numel, const BoxList& boxes,
               bool allow_gaps, absl::Status* result) {
  if (boxes.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return false;
  }
  const uint64_t limit = std::max<uint64_t>(8 * boxes.size(), 1u << 16);
  std::optional<Grid> grid = Grid::Of(shape, boxes, limit);
  if (!grid) return false;
  std::vector<int32_t> mark(grid->cells, -1);
  *result = MarkCells(*grid, boxes, &mark);
  if (result->ok() && !allow_gaps) *result = CheckNoGap(numel, *grid, mark);
  return true;
}

// Number of pairs among the intervals [lo[i], hi[i]) that intersect: all
// pairs minus those where one ends before the other starts. Sorts both.
uint64_t IntersectingPairs(std::vector<uint64_t>& lo,
                           std::vector<uint64_t>& hi) {
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
absl::Status Sweep2D(const BoxList& boxes, size_t d0, size_t d1) {
  struct Rect {
    uint64_t lo0, hi0, lo1, hi1;
    uint32_t box;
  };
  std::vector<Rect> rects;
  rects.reserve(boxes.size());
  for (size_t k = 0; k < boxes.size(); ++k) {
    Rect r{boxes.Lo(k, d0), boxes.Hi(k, d0), 0, 1, static_cast<uint32_t>(k)};
    if (d1 != d0) {
      r.lo1 = boxes.Lo(k, d1);
      r.hi1 = boxes.Hi(k, d1);
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
    if (other != nullptr) return boxes.Overlap(other->box, r.box);
    active.emplace_hint(next, r.lo1, &r);
    ends.emplace(r.hi0, r.lo1);
  }
  return absl::OkStatus();
}

// The dims in which the boxes differ (in offset or size); the others cannot
// separate two boxes.
std::vector<size_t> SeparatingDims(const BoxList& boxes) {
  std::vector<size_t> dims;
  for (size_t d = 0; d < boxes.ndim() && boxes.size() != 0; ++d) {
    for (size_t k = 1; k < boxes.size(); ++k) {
      if (boxes.Lo(k, d) != boxes.Lo(0, d) ||
          boxes.Hi(k, d) != boxes.Hi(0, d)) {
        dims.push_back(d);
        break;
      }
    }
  }
  return dims;
}

// Sweeps the boxes along the dim of `dims` in which the fewest pairs
// overlap, comparing every pair that overlaps in it: the first overlap as
// an error, InvalidArgument when that count is above the budget.
absl::Status SweepFewestPairs(const BoxList& boxes,
                              const std::vector<size_t>& dims,
                              size_t num_chunks) {
  size_t best = dims[0];
  uint64_t best_pairs = std::numeric_limits<uint64_t>::max();
  std::vector<uint64_t> lo(boxes.size()), hi(boxes.size());
  for (size_t d : dims) {
    for (size_t k = 0; k < boxes.size(); ++k) {
      lo[k] = boxes.Lo(k, d);
      hi[k] = boxes.Hi(k, d);
    }
    const uint64_t pairs = IntersectingPairs(lo, hi);
    if (pairs < best_pairs) {
      best_pairs = pairs;
      best = d;
    }
  }
  const uint64_t budget = 64 * static_cast<uint64_t>(boxes.size()) + (1u << 22);
  if (best_pairs > budget) {
    return TooComplex(
        num_chunks,
        absl::StrCat(best_pairs, " pairs of boxes to compare, the limit is ",
                     budget));
  }
  std::vector<uint32_t> order(boxes.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<uint32_t>(k);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return boxes.Lo(a, best) < boxes.Lo(b, best);
  });
  std::vector<uint32_t> active;
  for (uint32_t k : order) {
    active.erase(std::remove_if(active.begin(), active.end(),
                                [&](uint32_t j) {
                                  return boxes.Hi(j, best) <= boxes.Lo(k, best);
                                }),
                 active.end());
    for (uint32_t j : active) {
      if (boxes.Intersect(k, j)) return boxes.Overlap(j, k);
    }
    active.push_back(k);
  }
  return absl::OkStatus();
}

// Irregular boxes (the grid would be too large). Dims in which every box
// has the same extent cannot separate two boxes, so they are ignored. With
// at most two dims left the check is exact and O(n log n) (Sweep2D).
// Otherwise boxes are swept along the dim in which the fewest pairs of
// boxes overlap, comparing every pair that overlaps in it; that count is
// known in advance, and above a budget the layout is refused rather than
// spending minutes on it.
absl::Status CheckSweep(uint64_t numel, const BoxList& boxes, size_t num_chunks,
                        bool allow_gaps) {
  uint64_t covered = 0;
  for (size_t k = 0; k < boxes.size(); ++k) covered += boxes.Elements(k);
  const std::vector<size_t> dims = SeparatingDims(boxes);
  absl::Status overlap;
  if (dims.empty()) {
    // All boxes are the same box.
    if (boxes.size() > 1) overlap = boxes.Overlap(0, 1);
  } else if (dims.size() <= 2) {
    overlap = Sweep2D(boxes, dims[0], dims.back());
  } else {
    overlap = SweepFewestPairs(boxes, dims, num_chunks);
  }
  if (!overlap.ok()) return overlap;
  if (!allow_gaps && covered != numel) {
    return GapError(numel - covered, numel, nullptr);
  }
  return absl::OkStatus();
}

// The boxes of all `n` regions, flat ranges cut into boxes, in the order
// of the regions; TooComplex, before anything is allocated, when the boxes
// cut from flat ranges would take more than kCoverFlatCoordinates + 8 per
// flat range with elements (a flat range's record takes at least 9 bytes
// on disk; a box of ndim dims 16 * ndim bytes in memory). Counting stops
// there too, so the work is bounded by the same.
// REQUIRES: shape.size() >= 2 (a layout of fewer dims is all runs).
absl::StatusOr<BoxList> ToBoxes(const Shape& shape, size_t n,
                                RegionAt region_at) {
  const size_t ndim = shape.size();
  const Dims stride = Strides(shape);
  uint64_t allowed = kCoverFlatCoordinates;
  for (size_t i = 0; i < n; ++i) {
    const FlatRange* f = std::get_if<FlatRange>(&region_at(i));
    if (f != nullptr && f->length != 0) allowed += 8;
  }
  uint64_t boxes = 0, coords = 0;
  for (size_t i = 0; i < n && coords <= allowed; ++i) {
    const FlatRange* f = std::get_if<FlatRange>(&region_at(i));
    if (f == nullptr) {
      ++boxes;
      continue;
    }
    ForEachFlatPiece(shape, stride, *f, [&](const Dims&, size_t, uint64_t) {
      ++boxes;
      coords += ndim;
      return coords <= allowed;
    });
  }
  if (coords > allowed) {
    return TooComplex(n, absl::StrCat("its flat ranges cut into boxes of ",
                                      ndim, " dims would take more than ",
                                      allowed, " coordinates, the limit"));
  }
  BoxList out(ndim);
  out.Reserve(boxes);
  for (size_t i = 0; i < n; ++i) {
    const Region& r = region_at(i);
    const uint32_t chunk = static_cast<uint32_t>(i);
    if (const Box* b = std::get_if<Box>(&r)) {
      if (BoxElements(*b) != 0) out.Add(*b, chunk);
      continue;
    }
    ForEachFlatPiece(shape, stride, std::get<FlatRange>(r),
                     [&](const Dims& coord, size_t d, uint64_t cnt) {
                       out.AddPiece(shape, coord, d, cnt, chunk);
                       return true;
                     });
  }
  return out;
}

}  // namespace

absl::Status CheckCoverOf(const Shape& shape, size_t n, RegionAt region_at,
                          bool allow_gaps) {
  uint64_t numel = 1;
  for (uint64_t s : shape) numel *= s;
  // Every region that is one run of the flattening is an interval; the
  // other boxes wait for the box check. Regions without elements take no
  // part (nor memory: counted first).
  auto run_of = [&](size_t i, FlatRange* f) {
    const Region& r = region_at(i);
    if (const Box* b = std::get_if<Box>(&r)) return BoxAsFlat(shape, *b, f);
    *f = std::get<FlatRange>(r);
    return true;
  };
  size_t with_elements = 0;
  bool irregular = false;
  for (size_t i = 0; i < n; ++i) {
    FlatRange f;
    if (!run_of(i, &f)) {
      irregular = true;
    } else if (f.length != 0) {
      ++with_elements;
    }
  }
  std::vector<Run> runs;
  runs.reserve(with_elements);
  for (size_t i = 0; i < n; ++i) {
    FlatRange f;
    if (run_of(i, &f) && f.length != 0) {
      runs.push_back(Run{f.start, f.length, static_cast<uint32_t>(i)});
    }
  }
  if (!irregular) return CheckRuns(shape, numel, runs, allow_gaps);
  // Overlaps among the runs need no boxes: found first, in O(n log n).
  absl::Status s = CheckRuns(shape, numel, runs, /*allow_gaps=*/true);
  if (!s.ok()) return s;
  runs = {};
  absl::StatusOr<BoxList> boxes = ToBoxes(shape, n, region_at);
  if (!boxes.ok()) return boxes.status();
  absl::Status result;
  if (CheckGrid(shape, numel, *boxes, allow_gaps, &result)) return result;
  return CheckSweep(numel, *boxes, n, allow_gaps);
}

absl::Status CheckCover(const Shape& shape, absl::Span<const Region> regions,
                        bool allow_gaps) {
  return CheckCoverOf(
      shape, regions.size(),
      [&](size_t i) -> const Region& { return regions[i]; }, allow_gaps);
}

namespace format {

absl::Status CheckEntryCover(const EntryRecord& e) {
  return CheckCoverOf(
      e.shape, e.chunks.size(),
      [&](size_t i) -> const Region& { return e.chunks[i].region; },
      (e.flags & kEntryFlagPartial) != 0);
}

}  // namespace format
}  // namespace ckpt

#include "ckpt/format/geometry.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/format/format_constants.h"
#include "geometry_internal.h"

namespace ckpt {
namespace {

using geometry_internal::BoxElements;
using geometry_internal::IntersectBoxes;
using geometry_internal::Strides;

constexpr uint64_t kMaxI64 =
    static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

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

namespace {

// The one run of two flat ranges: their overlap, if any.
void FlatRuns(const FlatRange& sf, const FlatRange& df, RunEmitter* out) {
  uint64_t lo = std::max(sf.start, df.start);
  uint64_t hi = std::min(sf.start + sf.length, df.start + df.length);
  if (lo < hi) out->Add(lo - sf.start, lo - df.start, hi - lo);
}

// The box of elements that two regions, not both flat ranges, may share:
// the intersection of two boxes, or the box of a box and a flat range.
// False when they share nothing.
bool SharedBox(const Box* sb, const Box* db, const FlatRange* flat,
               Box* inter) {
  if (sb && db) return IntersectBoxes(*sb, *db, inter);
  *inter = sb ? *sb : *db;
  return flat->length != 0 && BoxElements(*inter) != 0;
}

// Cuts off the rows of dim 0 of `inter` that `flat` (if not null) cannot
// touch. False when nothing is left.
bool ClipToFlat(const Dims& stride, const FlatRange* flat, Box* inter) {
  for (uint64_t s : inter->size) {
    if (s == 0) return false;
  }
  if (flat == nullptr) return true;
  const uint64_t flat_end = flat->start + flat->length;
  uint64_t first0 = flat->start / stride[0];
  uint64_t last0 = (flat_end - 1) / stride[0];
  uint64_t lo = std::max(inter->offset[0], first0);
  uint64_t hi = std::min(inter->offset[0] + inter->size[0], last0 + 1);
  if (lo >= hi) return false;
  inter->size[0] = hi - lo;
  inter->offset[0] = lo;
  return true;
}

// The index, in box `b` (row-major, strides `bstride`), of the element at
// global coordinates c.
uint64_t LocalIndex(const Box& b, const Dims& bstride, const Dims& c) {
  uint64_t idx = 0;
  for (size_t d = 0; d < c.size(); ++d)
    idx += (c[d] - b.offset[d]) * bstride[d];
  return idx;
}

// The first dim of the rows RowRuns walks: every dim after it is whole,
// in `inter`, in both layouts (a box's own extent, or the tensor's for a
// flat range), which makes a row through them one run in both. A shard of
// whole rows (Shard(0) of a matrix) is then one row, not one per matrix
// row, and so is a column band loaded into the layout it was saved in.
size_t RowDim(const Shape& shape, const Box& inter, const Box* sb,
              const Box* db) {
  auto whole = [&](size_t d) {
    return inter.size[d] == (sb ? sb->size[d] : shape[d]) &&
           inter.size[d] == (db ? db->size[d] : shape[d]);
  };
  size_t m = inter.size.size() - 1;
  while (m > 0 && whole(m)) --m;
  return m;
}

// The runs of every row of `inter` (dims RowDim.., in row-major order),
// clipped to the flat range of sf or df if there is one; the other side's
// positions are local to its box (sb or db).
void RowRuns(const Shape& shape, const Dims& stride, const Box& inter,
             const Box* sb, const Box* db, const FlatRange* sf,
             const FlatRange* df, RunEmitter* out) {
  const size_t n = inter.offset.size();
  const size_t m = RowDim(shape, inter, sb, db);
  const FlatRange* flat = sf ? sf : df;
  const uint64_t flat_end = flat ? flat->start + flat->length : 0;
  Dims sstride, dstride;
  if (sb) sstride = Strides(sb->size);
  if (db) dstride = Strides(db->size);
  uint64_t row_len = 1;
  for (size_t d = m; d < n; ++d) row_len *= inter.size[d];
  Dims c(inter.offset.begin(), inter.offset.end());
  while (true) {
    uint64_t g = 0;
    for (size_t d = 0; d < n; ++d) g += c[d] * stride[d];
    uint64_t lo = g, hi = g + row_len;
    if (flat) {
      if (lo >= flat_end) break;
      lo = std::max(lo, flat->start);
      hi = std::min(hi, flat_end);
    }
    if (lo < hi) {
      uint64_t s = sb ? LocalIndex(*sb, sstride, c) + (lo - g) : lo - sf->start;
      uint64_t d = db ? LocalIndex(*db, dstride, c) + (lo - g) : lo - df->start;
      out->Add(s, d, hi - lo);
    }
    size_t d = m;
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
}

}  // namespace

uint64_t ForEachRun(const Shape& shape, const Region& src, const Region& dst,
                    absl::FunctionRef<void(uint64_t, uint64_t, uint64_t)> fn) {
  RunEmitter out(fn);
  const FlatRange* sf = std::get_if<FlatRange>(&src);
  const FlatRange* df = std::get_if<FlatRange>(&dst);
  if (sf && df) {
    FlatRuns(*sf, *df, &out);
    return out.Finish();
  }
  const Box* sb = std::get_if<Box>(&src);
  const Box* db = std::get_if<Box>(&dst);
  Box inter;
  if (!SharedBox(sb, db, sf ? sf : df, &inter)) return 0;
  if (shape.empty()) {
    out.Add(0, 0, 1);
    return out.Finish();
  }
  const Dims stride = Strides(shape);
  if (!ClipToFlat(stride, sf ? sf : df, &inter)) return 0;
  RowRuns(shape, stride, inter, sb, db, sf, df, &out);
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

}  // namespace ckpt

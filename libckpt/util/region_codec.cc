#include "util/region_codec.h"

#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::internal {

void PutRegion(std::string* out, const Region& region) {
  if (const Box* b = std::get_if<Box>(&region)) {
    format::PutFixed8(out, kRegionBox);
    for (uint64_t o : b->offset) format::PutVarint(out, o);
    for (uint64_t s : b->size) format::PutVarint(out, s);
  } else {
    const FlatRange& f = std::get<FlatRange>(region);
    format::PutFixed8(out, kRegionFlat);
    format::PutVarint(out, f.start);
    format::PutVarint(out, f.length);
  }
}

absl::StatusOr<Region> ReadRegion(format::ByteReader* r, size_t ndim) {
  CKPT_ASSIGN_OR_RETURN(uint8_t geometry, r->Read8("geometry"));
  if (geometry == kRegionFlat) {
    FlatRange f;
    CKPT_ASSIGN_OR_RETURN(f.start, r->ReadVarint("start"));
    CKPT_ASSIGN_OR_RETURN(f.length, r->ReadVarint("length"));
    return Region(f);
  }
  if (geometry != kRegionBox) {
    return absl::DataLossError(absl::StrCat("unknown geometry ", geometry));
  }
  Box b;
  b.offset.resize(ndim);
  b.size.resize(ndim);
  for (uint64_t& v : b.offset) {
    CKPT_ASSIGN_OR_RETURN(v, r->ReadVarint("offset"));
  }
  for (uint64_t& v : b.size) {
    CKPT_ASSIGN_OR_RETURN(v, r->ReadVarint("size"));
  }
  return Region(std::move(b));
}

}  // namespace ckpt::internal

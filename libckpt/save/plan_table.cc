#include "save/plan_table.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "util/region_codec.h"

namespace ckpt::internal {
namespace {

constexpr size_t kBlockBytes = 64 * 1024;

// Interned shapes are their dimensions and interned regions their geometry
// (util/region_codec.h's kRegionBox, kRegionFlat) followed by their
// coordinates, as host-order uint64 values (the keys never leave the
// process).

uint64_t LoadU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

absl::string_view Interner::Store(absl::string_view key) {
  if (blocks_.empty() || key.size() > block_size_ - block_used_) {
    block_size_ = std::max(kBlockBytes, key.size());
    blocks_.push_back(std::make_unique<char[]>(block_size_));
    block_used_ = 0;
  }
  char* p = blocks_.back().get() + block_used_;
  if (!key.empty()) std::memcpy(p, key.data(), key.size());
  block_used_ += key.size();
  return absl::string_view(p, key.size());
}

uint32_t Interner::Intern(absl::string_view key, uint32_t hint) {
  if (hint < views_.size() && views_[hint] == key) return hint;
  auto it = ids_.find(key);
  if (it != ids_.end()) return it->second;
  const uint32_t id = static_cast<uint32_t>(views_.size());
  views_.push_back(Store(key));
  ids_.emplace(views_.back(), id);
  return id;
}

Shape PlanTable::shape(uint32_t id) const {
  absl::string_view k = shapes_.Get(id);
  Shape s(k.size() / 8);
  for (size_t d = 0; d < s.size(); ++d) s[d] = LoadU64(k.data() + 8 * d);
  return s;
}

Region PlanTable::region(uint32_t id) const {
  absl::string_view k = regions_.Get(id);
  const char* v = k.data() + 1;
  if (k[0] == kRegionFlat) return FlatRange{LoadU64(v), LoadU64(v + 8)};
  const size_t ndim = (k.size() - 1) / 16;
  Box b;
  b.offset.resize(ndim);
  b.size.resize(ndim);
  for (size_t d = 0; d < ndim; ++d) {
    b.offset[d] = LoadU64(v + 8 * d);
    b.size[d] = LoadU64(v + 8 * (ndim + d));
  }
  return b;
}

uint64_t PlanTable::RegionElements(uint32_t region_id) const {
  absl::string_view k = regions_.Get(region_id);
  const char* v = k.data() + 1;
  if (k[0] == kRegionFlat) return LoadU64(v + 8);
  const size_t ndim = (k.size() - 1) / 16;
  uint64_t n = 1;
  for (size_t d = 0; d < ndim; ++d) n *= LoadU64(v + 8 * (ndim + d));
  return n;
}

uint64_t PlanTable::FirstDim(uint32_t shape_id) const {
  absl::string_view k = shapes_.Get(shape_id);
  return k.size() < 8 ? 0 : LoadU64(k.data());
}

bool PlanTable::RegionLess(uint32_t a, uint32_t b) const {
  absl::string_view x = regions_.Get(a), y = regions_.Get(b);
  if (x[0] != y[0]) return x[0] < y[0];
  const size_t n = std::min(x.size(), y.size()) / 8;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t u = LoadU64(x.data() + 1 + 8 * i);
    const uint64_t v = LoadU64(y.data() + 1 + 8 * i);
    if (u != v) return u < v;
  }
  return x.size() < y.size();
}

absl::Status PlanTable::AppendEncoded(absl::string_view bytes) {
  const size_t before = items_.size();
  absl::Status s = DecodeItems(bytes);
  if (!s.ok()) {
    items_.resize(before);
    return s;
  }
  begin_.push_back(items_.size());
  return absl::OkStatus();
}

absl::Status PlanTable::DecodeItems(absl::string_view bytes) {
  format::ByteReader r(bytes);
  CKPT_ASSIGN_OR_RETURN(uint64_t n, r.ReadVarint("item count"));
  // Geometric growth: reserving exactly per rank would copy the table once
  // per rank.
  const size_t need = items_.size() + std::min<uint64_t>(n, bytes.size() / 4);
  if (need > items_.capacity())
    items_.reserve(std::max(need, 2 * items_.capacity()));
  // Hints: the previous rank's item at the same position.
  const size_t prev = begin_.size() >= 2 ? begin_[begin_.size() - 2] : 0;
  const size_t prev_n = items_.size() - prev;
  for (uint64_t i = 0; i < n; ++i) {
    const bool hinted = i < prev_n;
    const PlanItem hint = hinted ? items_[prev + i] : PlanItem{};
    PlanItem it;
    CKPT_RETURN_IF_ERROR(DecodeItem(&r, hinted, hint, &it));
    items_.push_back(it);
  }
  if (!r.empty()) {
    return absl::DataLossError(absl::StrCat(
        "local plan: ", r.remaining(), " trailing bytes after ", n, " items"));
  }
  return absl::OkStatus();
}

absl::Status PlanTable::DecodeItem(format::ByteReader* r, bool hinted,
                                   const PlanItem& hint, PlanItem* it) {
  auto h = [&](uint32_t id) { return hinted ? id : Interner::kNoHint; };
  CKPT_ASSIGN_OR_RETURN(absl::string_view name,
                        r->ReadString("name", format::kMaxNameLength));
  it->name = names_.Intern(name, h(hint.name));
  CKPT_ASSIGN_OR_RETURN(uint8_t kind, r->Read8("kind"));
  if (kind != static_cast<uint8_t>(format::EntryKind::kTensor) &&
      kind != static_cast<uint8_t>(format::EntryKind::kObject)) {
    return absl::DataLossError(absl::StrCat("entry '", format::EscapeText(name),
                                            "': unknown kind ", kind));
  }
  it->kind = static_cast<format::EntryKind>(kind);
  CKPT_ASSIGN_OR_RETURN(uint8_t dtype, r->Read8("dtype"));
  CKPT_ASSIGN_OR_RETURN(it->dtype, DTypeFromCode(dtype));
  CKPT_ASSIGN_OR_RETURN(uint8_t flags, r->Read8("flags"));
  it->replica = flags & 1;
  it->partial = flags & 2;
  uint64_t dims[format::kMaxDims];
  CKPT_ASSIGN_OR_RETURN(uint64_t ndim,
                        r->ReadVarintAtMost("ndim", format::kMaxDims));
  for (uint64_t d = 0; d < ndim; ++d) {
    CKPT_ASSIGN_OR_RETURN(dims[d], r->ReadVarint("dim"));
  }
  it->shape = shapes_.Intern(
      absl::string_view(reinterpret_cast<const char*>(dims), 8 * ndim),
      h(hint.shape));
  char key[1 + 16 * format::kMaxDims];
  CKPT_ASSIGN_OR_RETURN(uint8_t geom, r->Read8("geometry"));
  const uint64_t coords = RegionCoordinates(geom, ndim);
  if (geom != kRegionBox && geom != kRegionFlat) {
    return absl::DataLossError(absl::StrCat("entry '", format::EscapeText(name),
                                            "': unknown geometry ", geom));
  }
  key[0] = static_cast<char>(geom);
  for (uint64_t c = 0; c < coords; ++c) {
    CKPT_ASSIGN_OR_RETURN(uint64_t v, r->ReadVarint("region"));
    std::memcpy(key + 1 + 8 * c, &v, 8);
  }
  it->region =
      regions_.Intern(absl::string_view(key, 1 + 8 * coords), h(hint.region));
  return absl::OkStatus();
}

}  // namespace ckpt::internal

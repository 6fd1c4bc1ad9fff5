#include "save_plan.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::internal {
namespace {

using format::ByteReader;
using format::PutFixed8;
using format::PutString;
using format::PutVarint;

void PutRegion(std::string* out, const Region& r) {
  if (const Box* b = std::get_if<Box>(&r)) {
    PutFixed8(out, 1);
    for (uint64_t o : b->offset) PutVarint(out, o);
    for (uint64_t s : b->size) PutVarint(out, s);
  } else {
    const FlatRange& f = std::get<FlatRange>(r);
    PutFixed8(out, 2);
    PutVarint(out, f.start);
    PutVarint(out, f.length);
  }
}

void PutItem(std::string* out, const LocalItem& it, bool with_object_size) {
  PutString(out, it.name);
  PutFixed8(out, static_cast<uint8_t>(it.kind));
  PutFixed8(out, static_cast<uint8_t>(it.dtype));
  PutFixed8(out, (it.replica ? 1 : 0) | (it.partial ? 2 : 0));
  if (it.kind == format::EntryKind::kObject && !with_object_size) return;
  PutVarint(out, it.shape.size());
  for (uint64_t d : it.shape) PutVarint(out, d);
  PutRegion(out, it.region);
}

// Orders regions so that identical ones are adjacent.
bool RegionLess(const Region& a, const Region& b) {
  if (a.index() != b.index()) return a.index() < b.index();
  if (const Box* x = std::get_if<Box>(&a)) {
    const Box& y = std::get<Box>(b);
    if (x->offset != y.offset)
      return std::lexicographical_compare(x->offset.begin(), x->offset.end(),
                                          y.offset.begin(), y.offset.end());
    return std::lexicographical_compare(x->size.begin(), x->size.end(),
                                        y.size.begin(), y.size.end());
  }
  const FlatRange& x = std::get<FlatRange>(a);
  const FlatRange& y = std::get<FlatRange>(b);
  return std::tie(x.start, x.length) < std::tie(y.start, y.length);
}

struct Ref {
  uint32_t rank;
  uint32_t index;
  const LocalItem* item;
  uint64_t key = 0;  // hash of the region (SortByRegion)
};

uint64_t Mix(uint64_t h, uint64_t v) {
  // splitmix64 finaliser over the running value.
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

uint64_t RegionKey(const Region& r) {
  if (const Box* b = std::get_if<Box>(&r)) {
    uint64_t h = Mix(1, b->offset.size());
    for (uint64_t o : b->offset) h = Mix(h, o);
    for (uint64_t s : b->size) h = Mix(h, s);
    return h;
  }
  const FlatRange& f = std::get<FlatRange>(r);
  return Mix(Mix(2, f.start), f.length);
}

bool SameRegion(const Region& a, const Region& b) {
  if (a.index() != b.index()) return false;
  if (const Box* x = std::get_if<Box>(&a)) {
    const Box& y = std::get<Box>(b);
    return x->offset == y.offset && x->size == y.size;
  }
  const FlatRange& x = std::get<FlatRange>(a);
  const FlatRange& y = std::get<FlatRange>(b);
  return x.start == y.start && x.length == y.length;
}

// Orders refs so that identical regions are adjacent (ties by rank).
void SortByRegion(std::vector<Ref>* refs) {
  for (Ref& r : *refs) r.key = RegionKey(r.item->region);
  std::sort(refs->begin(), refs->end(), [](const Ref& a, const Ref& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  for (size_t i = 1; i < refs->size(); ++i) {
    const Ref& a = (*refs)[i - 1];
    const Ref& b = (*refs)[i];
    if (a.key == b.key && !SameRegion(a.item->region, b.item->region)) {
      std::sort(refs->begin(), refs->end(), [](const Ref& x, const Ref& y) {
        if (RegionLess(x.item->region, y.item->region)) return true;
        if (RegionLess(y.item->region, x.item->region)) return false;
        return x.rank < y.rank;
      });
      return;
    }
  }
}

}  // namespace

std::string EncodeLocalPlan(const LocalPlan& plan) {
  std::string out;
  PutVarint(&out, plan.size());
  for (const LocalItem& it : plan) PutItem(&out, it, true);
  return out;
}

absl::StatusOr<LocalPlan> DecodeLocalPlan(absl::string_view bytes) {
  ByteReader r(bytes);
  CKPT_ASSIGN_OR_RETURN(uint64_t n, r.ReadVarint("item count"));
  LocalPlan plan;
  plan.reserve(std::min<uint64_t>(n, bytes.size() / 4));
  for (uint64_t i = 0; i < n; ++i) {
    LocalItem it;
    CKPT_ASSIGN_OR_RETURN(auto name,
                          r.ReadString("name", format::kMaxNameLength));
    it.name = std::string(name);
    CKPT_ASSIGN_OR_RETURN(uint8_t kind, r.Read8("kind"));
    it.kind = static_cast<format::EntryKind>(kind);
    CKPT_ASSIGN_OR_RETURN(uint8_t dtype, r.Read8("dtype"));
    CKPT_ASSIGN_OR_RETURN(it.dtype, DTypeFromCode(dtype));
    CKPT_ASSIGN_OR_RETURN(uint8_t flags, r.Read8("flags"));
    it.replica = flags & 1;
    it.partial = flags & 2;
    CKPT_ASSIGN_OR_RETURN(uint64_t ndim,
                          r.ReadVarintAtMost("ndim", format::kMaxDims));
    it.shape.resize(ndim);
    for (auto& d : it.shape) {
      CKPT_ASSIGN_OR_RETURN(d, r.ReadVarint("dim"));
    }
    CKPT_ASSIGN_OR_RETURN(uint8_t geom, r.Read8("geometry"));
    if (geom == 1) {
      Box b;
      b.offset.resize(ndim);
      b.size.resize(ndim);
      for (auto& o : b.offset) {
        CKPT_ASSIGN_OR_RETURN(o, r.ReadVarint("offset"));
      }
      for (auto& s : b.size) {
        CKPT_ASSIGN_OR_RETURN(s, r.ReadVarint("size"));
      }
      it.region = std::move(b);
    } else {
      FlatRange f;
      CKPT_ASSIGN_OR_RETURN(f.start, r.ReadVarint("start"));
      CKPT_ASSIGN_OR_RETURN(f.length, r.ReadVarint("length"));
      it.region = f;
    }
    plan.push_back(std::move(it));
  }
  return plan;
}

namespace {
format::Fingerprint ToFingerprint(XXH128_hash_t h) {
  format::Fingerprint fp;
  for (int i = 0; i < 8; ++i) {
    fp[i] = static_cast<uint8_t>(h.low64 >> (8 * i));
    fp[8 + i] = static_cast<uint8_t>(h.high64 >> (8 * i));
  }
  return fp;
}
}  // namespace

format::Fingerprint ItemFingerprint(const LocalItem& item) {
  std::string buf;
  PutItem(&buf, item, false);
  return ToFingerprint(XXH3_128bits(buf.data(), buf.size()));
}

format::Fingerprint CombineFingerprints(
    size_t n, absl::FunctionRef<const format::Fingerprint&(size_t)> item) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  std::string count;
  PutVarint(&count, n);
  XXH3_128bits_update(st, count.data(), count.size());
  // Batches of item fingerprints, so the hash runs over large spans.
  char batch[16 * 256];
  size_t used = 0;
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(batch + used, item(i).data(), 16);
    used += 16;
    if (used == sizeof(batch)) {
      XXH3_128bits_update(st, batch, used);
      used = 0;
    }
  }
  XXH3_128bits_update(st, batch, used);
  format::Fingerprint fp = ToFingerprint(XXH3_128bits_digest(st));
  XXH3_freeState(st);
  return fp;
}

namespace {

// One chunk of the checkpoint and every rank that holds it (identical
// regions); the writer is chosen among `holders`.
struct Unique {
  uint64_t bytes;
  std::vector<Ref> holders;
};

using RefsByName = absl::flat_hash_map<absl::string_view, std::vector<Ref>>;

// Groups every item of every rank by entry name. Returns the names sorted,
// so that the plan does not depend on the hash map's order.
std::vector<absl::string_view> GroupByName(const std::vector<LocalPlan>& ranks,
                                           RefsByName* by_name) {
  for (uint32_t r = 0; r < ranks.size(); ++r) {
    for (uint32_t i = 0; i < ranks[r].size(); ++i) {
      const LocalItem& it = ranks[r][i];
      (*by_name)[it.name].push_back(Ref{r, i, &it});
    }
  }
  std::vector<absl::string_view> names;
  names.reserve(by_name->size());
  for (const auto& [name, refs] : *by_name) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

// InvalidArgument naming the entry and both ranks where a piece's kind,
// dtype, global shape (tensors) or partial flag differs from refs[0]'s.
absl::Status CheckRanksAgree(absl::string_view name,
                             const std::vector<Ref>& refs) {
  const LocalItem& first = *refs[0].item;
  auto kind = [](const LocalItem& i) {
    return i.kind == format::EntryKind::kObject ? "object" : "tensor";
  };
  auto flag = [](bool b) { return b ? "true" : "false"; };
  for (const Ref& ref : refs) {
    const LocalItem& it = *ref.item;
    auto mismatch = [&](absl::string_view what, absl::string_view a,
                        absl::string_view b) {
      return absl::InvalidArgumentError(absl::StrCat(
          "entry '", name, "': ", what, " differs between ranks: rank ",
          refs[0].rank, " has ", a, ", rank ", ref.rank, " has ", b));
    };
    if (it.kind != first.kind) return mismatch("kind", kind(first), kind(it));
    if (it.dtype != first.dtype) {
      return mismatch("dtype", DTypeName(first.dtype), DTypeName(it.dtype));
    }
    if (it.kind == format::EntryKind::kTensor && it.shape != first.shape) {
      return mismatch("global shape", ShapeToString(first.shape),
                      ShapeToString(it.shape));
    }
    if (it.partial != first.partial) {
      return mismatch("partial flag", flag(first.partial), flag(it.partial));
    }
  }
  return absl::OkStatus();
}

// An object is one chunk, held (and written) by exactly one rank.
absl::Status PlanObject(absl::string_view name, const std::vector<Ref>& refs,
                        std::vector<Unique>* uniques) {
  if (refs.size() > 1) {
    std::vector<uint32_t> rs;
    for (const Ref& ref : refs) rs.push_back(ref.rank);
    return absl::InvalidArgumentError(absl::StrCat(
        "object '", name, "' is registered on ranks ", absl::StrJoin(rs, ", "),
        "; an object is saved by exactly one rank (give each rank its own "
        "name)"));
  }
  uniques->push_back(Unique{refs[0].item->shape[0], {refs[0]}});
  return absl::OkStatus();
}

// Empty pieces (a rank holding nothing of this tensor) carry no data. The
// lowest rank's is kept when all are empty, so the entry still gets a
// record.
void DropEmptyPieces(std::vector<Ref>* refs) {
  std::vector<Ref> nonempty;
  for (const Ref& ref : *refs) {
    if (RegionElements(ref.item->region) != 0) nonempty.push_back(ref);
  }
  if (nonempty.empty()) {
    nonempty.push_back(*std::min_element(
        refs->begin(), refs->end(),
        [](const Ref& a, const Ref& b) { return a.rank < b.rank; }));
  }
  refs->swap(nonempty);
}

using Groups = std::vector<std::pair<size_t, size_t>>;  // [begin, end) in refs

// Sorts `refs` and returns the runs of identical regions. Sorting is by a
// 64-bit hash of the region (cheap integer compares); each run is checked
// to be really identical (SortByRegion falls back to ordering the regions
// themselves on a collision). InvalidArgument if two ranks hold one region
// and more than one of them is not marked as a replica.
absl::StatusOr<Groups> GroupIdenticalRegions(absl::string_view name,
                                             std::vector<Ref>* refs) {
  SortByRegion(refs);
  const std::vector<Ref>& v = *refs;
  Groups groups;
  for (size_t i = 0; i < v.size();) {
    size_t j = i + 1;
    while (j < v.size() && v[j].key == v[i].key &&
           SameRegion(v[i].item->region, v[j].item->region)) {
      ++j;
    }
    std::vector<uint32_t> owners;  // ranks holding it as a non-replica
    for (size_t k = i; k < j; ++k) {
      if (!v[k].item->replica) owners.push_back(v[k].rank);
    }
    if (owners.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "entry '", name, "': ranks ", absl::StrJoin(owners, ", "),
          " all hold ", RegionToString(v[i].item->region),
          " and none of them is marked as a replica"));
    }
    groups.emplace_back(i, j);
    i = j;
  }
  return groups;
}

// CheckCover over one region per group; the error names the rank of each
// chunk where there are few enough to list.
absl::Status CheckTensorCover(absl::string_view name,
                              const std::vector<Ref>& refs,
                              const Groups& groups) {
  const LocalItem& first = *refs[0].item;
  std::vector<Region> regions;
  regions.reserve(groups.size());
  for (const auto& g : groups) regions.push_back(refs[g.first].item->region);
  absl::Status cover = CheckCover(first.shape, regions, first.partial);
  if (cover.ok()) return cover;
  std::string ranks_note;
  if (groups.size() <= 16) {
    std::vector<std::string> parts;
    for (size_t g = 0; g < groups.size(); ++g) {
      parts.push_back(absl::StrCat("chunk ", g, " = ",
                                   RegionToString(regions[g]), " on rank ",
                                   refs[groups[g].first].rank));
    }
    ranks_note = absl::StrCat(" (", absl::StrJoin(parts, "; "), ")");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("entry '", name, "': ", cover.message(), ranks_note));
}

// A tensor: one chunk per distinct non-empty region, which together must
// cover the tensor (unless partial) without overlapping.
absl::Status PlanTensor(absl::string_view name, std::vector<Ref> refs,
                        std::vector<Unique>* uniques) {
  DropEmptyPieces(&refs);
  CKPT_ASSIGN_OR_RETURN(Groups groups, GroupIdenticalRegions(name, &refs));
  CKPT_RETURN_IF_ERROR(CheckTensorCover(name, refs, groups));
  const uint64_t es = DTypeSize(refs[0].item->dtype);
  for (const auto& [b, e] : groups) {
    Unique u;
    u.bytes = RegionElements(refs[b].item->region) * es;
    u.holders.assign(refs.begin() + b, refs.begin() + e);
    uniques->push_back(std::move(u));
  }
  return absl::OkStatus();
}

// Chooses the writer of every chunk. Chunks with one holder are fixed; the
// rest go, largest first, to the holder with the fewest bytes so far (ties:
// lowest rank). Returns writes[r], sorted.
std::vector<std::vector<uint32_t>> AssignWriters(
    const std::vector<Unique>& uniques, size_t world) {
  std::vector<std::vector<uint32_t>> writes(world);
  std::vector<uint64_t> load(world, 0);
  std::vector<size_t> flexible;
  for (size_t u = 0; u < uniques.size(); ++u) {
    if (uniques[u].holders.size() == 1) {
      const Ref& h = uniques[u].holders[0];
      load[h.rank] += uniques[u].bytes;
      writes[h.rank].push_back(h.index);
    } else {
      flexible.push_back(u);
    }
  }
  std::stable_sort(flexible.begin(), flexible.end(), [&](size_t a, size_t b) {
    return uniques[a].bytes > uniques[b].bytes;
  });
  for (size_t u : flexible) {
    const Ref* best = nullptr;
    for (const Ref& h : uniques[u].holders) {
      if (!best || load[h.rank] < load[best->rank]) best = &h;
    }
    load[best->rank] += uniques[u].bytes;
    writes[best->rank].push_back(best->index);
  }
  for (auto& w : writes) std::sort(w.begin(), w.end());
  return writes;
}

}  // namespace

absl::StatusOr<GlobalPlan> PlanSave(const std::vector<LocalPlan>& ranks) {
  RefsByName by_name;
  const std::vector<absl::string_view> names = GroupByName(ranks, &by_name);
  std::vector<Unique> uniques;
  for (absl::string_view name : names) {
    std::vector<Ref>& refs = by_name[name];
    CKPT_RETURN_IF_ERROR(CheckRanksAgree(name, refs));
    if (refs[0].item->kind == format::EntryKind::kObject) {
      CKPT_RETURN_IF_ERROR(PlanObject(name, refs, &uniques));
    } else {
      CKPT_RETURN_IF_ERROR(PlanTensor(name, std::move(refs), &uniques));
    }
  }
  GlobalPlan plan;
  for (const Unique& u : uniques) plan.unique_bytes += u.bytes;
  plan.writes = AssignWriters(uniques, ranks.size());
  return plan;
}

}  // namespace ckpt::internal

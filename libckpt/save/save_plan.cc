#include "save/save_plan.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/geometry.h"
#include "ckpt/format/names.h"
#include "ckpt/format/plan_record.h"
#include "ckpt/format/status_macros.h"
#include "save/save_messages.h"
#include "util/region_codec.h"

namespace ckpt::internal {
namespace {

using format::PutFixed8;
using format::PutString;
using format::PutVarint;

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

}  // namespace

std::string EncodeLocalPlan(const LocalPlan& plan) {
  std::string out;
  PutVarint(&out, plan.size());
  for (const LocalItem& it : plan) PutItem(&out, it, true);
  return out;
}

namespace {
LocalItem ItemOf(const PlanTable& t, const PlanItem& p) {
  LocalItem it;
  it.name = std::string(t.name(p.name));
  it.kind = p.kind;
  it.dtype = p.dtype;
  it.shape = t.shape(p.shape);
  it.region = t.region(p.region);
  it.replica = p.replica;
  it.partial = p.partial;
  return it;
}
}  // namespace

absl::StatusOr<LocalPlan> DecodeLocalPlan(absl::string_view bytes) {
  PlanTable table;
  CKPT_RETURN_IF_ERROR(table.AppendEncoded(bytes));
  LocalPlan plan;
  plan.reserve(table.total_items());
  for (const PlanItem& p : table.rank(0)) plan.push_back(ItemOf(table, p));
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

absl::Status CheckTensorArguments(const std::string& name, DType dtype,
                                  const Shape& shape, const Region& local,
                                  const void* data) {
  CKPT_RETURN_IF_ERROR(format::ValidateEntryName(name));
  CKPT_RETURN_IF_ERROR(Annotate(ValidateShape(shape, DTypeSize(dtype)),
                                absl::StrCat("entry '", name, "'")));
  CKPT_RETURN_IF_ERROR(Annotate(ValidateRegion(local, shape),
                                absl::StrCat("entry '", name, "'")));
  if (data == nullptr && RegionElements(local) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("entry '", name, "': data is null"));
  }
  return absl::OkStatus();
}

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

// Item `index` of rank `rank`, with what grouping it needs (so that the
// planner reads refs in order rather than items in random order).
struct Ref {
  uint32_t rank;
  uint32_t index : 31;
  uint32_t replica : 1;
  uint32_t region;
};

// One chunk of the checkpoint, held by refs [begin, end) of the planner
// (identical regions, in rank order); the writer is chosen among them.
struct Unique {
  uint64_t bytes;
  size_t begin, end;
};

using Groups = std::vector<std::pair<size_t, size_t>>;  // [begin, end) in refs

// PlanSave over a PlanTable. Every item is referred to by an 8-byte Ref,
// grouped by entry name with a counting sort; identical regions of a
// tensor are grouped by their interned id. No per-item allocation.
class Planner {
 public:
  explicit Planner(const PlanTable& t)
      : t_(t), elements_(t.regions()), group_of_(t.regions(), kNone) {
    for (uint32_t g = 0; g < t.regions(); ++g)
      elements_[g] = t.RegionElements(g);
  }

  // Plans; keeps the writers of `recorded` (if not null) where they fit
  // (RecordFits), and says so in *reused.
  absl::StatusOr<GlobalPlan> Run(const format::PlanRecord* recorded = nullptr,
                                 bool* reused = nullptr) {
    CKPT_RETURN_IF_ERROR(GroupByName());
    for (uint32_t name : SortedNames()) {
      const size_t b = name_begin_[name], e = name_begin_[name + 1];
      if (b == e) continue;  // interned by a rank whose decoding failed
      if (disagree_[name]) CKPT_RETURN_IF_ERROR(CheckRanksAgree(name, b, e));
      if (Item(refs_[b]).kind == format::EntryKind::kObject) {
        CKPT_RETURN_IF_ERROR(PlanObject(name, b, e));
      } else {
        CKPT_RETURN_IF_ERROR(PlanTensor(name, b, e));
      }
    }
    GlobalPlan plan;
    for (const Unique& u : uniques_) plan.unique_bytes += u.bytes;
    const bool fits = recorded != nullptr && RecordFits(*recorded);
    if (reused != nullptr) *reused = fits;
    if (fits) {
      for (const auto& r : recorded->ranks) plan.writes.push_back(r.writes);
    } else {
      plan.writes = AssignWriters();
    }
    return plan;
  }

 private:
  static constexpr uint32_t kNone = ~uint32_t{0};

  const PlanItem& Item(const Ref& r) const { return t_.rank(r.rank)[r.index]; }

  // refs_ of name n: [name_begin_[n], name_begin_[n + 1]), in rank order.
  // Marks in disagree_ the names whose items differ in what
  // CheckRanksAgree compares (checked there, in name order, for the
  // message).
  absl::Status GroupByName() {
    name_begin_.assign(t_.names() + 1, 0);
    disagree_.assign(t_.names(), 0);
    std::vector<const PlanItem*> first(t_.names(), nullptr);
    for (uint32_t r = 0; r < t_.ranks(); ++r) {
      if (t_.rank(r).size() > (uint32_t{1} << 31)) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " registers ", t_.rank(r).size(),
                         " pieces, more than 2^31"));
      }
      for (const PlanItem& it : t_.rank(r)) {
        ++name_begin_[it.name + 1];
        const PlanItem*& f = first[it.name];
        if (f == nullptr) f = &it;
        if (!Agree(*f, it)) disagree_[it.name] = 1;
      }
    }
    for (size_t n = 0; n < t_.names(); ++n)
      name_begin_[n + 1] += name_begin_[n];
    std::vector<size_t> next(name_begin_.begin(), name_begin_.end() - 1);
    refs_.resize(t_.total_items());
    for (uint32_t r = 0; r < t_.ranks(); ++r) {
      absl::Span<const PlanItem> items = t_.rank(r);
      for (uint32_t i = 0; i < items.size(); ++i) {
        refs_[next[items[i].name]++] =
            Ref{r, i, items[i].replica, items[i].region};
      }
    }
    return absl::OkStatus();
  }

  static bool Agree(const PlanItem& a, const PlanItem& b) {
    return a.kind == b.kind && a.dtype == b.dtype && a.partial == b.partial &&
           (a.kind != format::EntryKind::kTensor || a.shape == b.shape);
  }

  // Names in byte order, so that the plan does not depend on the order in
  // which ranks introduced them.
  std::vector<uint32_t> SortedNames() const {
    std::vector<uint32_t> names(t_.names());
    std::iota(names.begin(), names.end(), 0);
    std::sort(names.begin(), names.end(),
              [&](uint32_t a, uint32_t b) { return t_.name(a) < t_.name(b); });
    return names;
  }

  // InvalidArgument naming the entry and both ranks where a piece's kind,
  // dtype, global shape (tensors) or partial flag differs from the first's.
  absl::Status CheckRanksAgree(uint32_t name, size_t b, size_t e) const {
    const PlanItem& first = Item(refs_[b]);
    auto kind = [](const PlanItem& i) {
      return i.kind == format::EntryKind::kObject ? "object" : "tensor";
    };
    auto flag = [](bool f) { return f ? "true" : "false"; };
    for (size_t k = b; k < e; ++k) {
      const PlanItem& it = Item(refs_[k]);
      auto mismatch = [&](absl::string_view what, absl::string_view x,
                          absl::string_view y) {
        return absl::InvalidArgumentError(
            absl::StrCat("entry '", t_.name(name), "': ", what,
                         " differs between ranks: rank ", refs_[b].rank,
                         " has ", x, ", rank ", refs_[k].rank, " has ", y));
      };
      if (it.kind != first.kind) return mismatch("kind", kind(first), kind(it));
      if (it.dtype != first.dtype) {
        return mismatch("dtype", DTypeName(first.dtype), DTypeName(it.dtype));
      }
      if (it.kind == format::EntryKind::kTensor && it.shape != first.shape) {
        return mismatch("global shape", ShapeToString(t_.shape(first.shape)),
                        ShapeToString(t_.shape(it.shape)));
      }
      if (it.partial != first.partial) {
        return mismatch("partial flag", flag(first.partial), flag(it.partial));
      }
    }
    return absl::OkStatus();
  }

  // An object is one chunk, held (and written) by exactly one rank.
  absl::Status PlanObject(uint32_t name, size_t b, size_t e) {
    if (e - b > 1) {
      std::vector<uint32_t> rs;
      for (size_t k = b; k < e; ++k) rs.push_back(refs_[k].rank);
      return absl::InvalidArgumentError(absl::StrCat(
          "object '", t_.name(name), "' is registered on ranks ",
          absl::StrJoin(rs, ", "),
          "; an object is saved by exactly one rank (give each rank its own "
          "name)"));
    }
    uniques_.push_back(Unique{t_.FirstDim(Item(refs_[b]).shape), b, b + 1});
    return absl::OkStatus();
  }

  // Empty pieces (a rank holding nothing of this tensor) carry no data:
  // moves the non-empty refs to the front of [b, e), in order, and returns
  // their end. The lowest rank's is kept when all are empty, so the entry
  // still gets a record.
  size_t DropEmptyPieces(size_t b, size_t e) {
    size_t out = b;
    for (size_t k = b; k < e; ++k) {
      if (elements_[refs_[k].region] != 0) refs_[out++] = refs_[k];
    }
    return out == b ? b + 1 : out;  // refs_[b] is then still the lowest rank
  }

  // Reorders refs [b, e) into runs of identical regions, the runs in
  // region order (offsets, then sizes), each in rank order, and returns
  // the runs. InvalidArgument if two ranks hold one region and more than
  // one of them is not marked as a replica.
  absl::StatusOr<Groups> GroupIdenticalRegions(uint32_t name, size_t b,
                                               size_t e) {
    std::vector<uint32_t> regions;  // group g's region id
    std::vector<size_t> count;
    for (size_t k = b; k < e; ++k) {
      uint32_t& g = group_of_[refs_[k].region];
      if (g == kNone) {
        g = static_cast<uint32_t>(regions.size());
        regions.push_back(refs_[k].region);
        count.push_back(0);
      }
      ++count[g];
    }
    std::vector<uint32_t> order(regions.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) {
      return t_.RegionLess(regions[x], regions[y]);
    });
    Groups groups(regions.size());
    std::vector<size_t> next(regions.size());
    size_t pos = b;
    for (uint32_t g : order) {
      groups[g] = {pos, pos + count[g]};
      next[g] = pos - b;
      pos += count[g];
    }
    scratch_.resize(e - b);
    for (size_t k = b; k < e; ++k)
      scratch_[next[group_of_[refs_[k].region]]++] = refs_[k];
    std::copy(scratch_.begin(), scratch_.end(), refs_.begin() + b);
    for (uint32_t region : regions) group_of_[region] = kNone;
    Groups sorted;
    sorted.reserve(groups.size());
    for (uint32_t g : order) sorted.push_back(groups[g]);
    CKPT_RETURN_IF_ERROR(CheckOneOwner(name, sorted));
    return sorted;
  }

  absl::Status CheckOneOwner(uint32_t name, const Groups& groups) const {
    for (const auto& [gb, ge] : groups) {
      std::vector<uint32_t> owners;  // ranks holding it as a non-replica
      for (size_t k = gb; k < ge; ++k) {
        if (!refs_[k].replica) owners.push_back(refs_[k].rank);
      }
      if (owners.size() > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "entry '", t_.name(name), "': ranks ", absl::StrJoin(owners, ", "),
            " all hold ", RegionToString(t_.region(refs_[gb].region)),
            " and none of them is marked as a replica"));
      }
    }
    return absl::OkStatus();
  }

  // CheckCover over one region per group; the error names the rank of each
  // chunk where there are few enough to list.
  absl::Status CheckTensorCover(uint32_t name, const Groups& groups) const {
    const PlanItem& first = Item(refs_[groups[0].first]);
    std::vector<Region> regions;
    regions.reserve(groups.size());
    for (const auto& g : groups)
      regions.push_back(t_.region(refs_[g.first].region));
    absl::Status cover =
        CheckCover(t_.shape(first.shape), regions, first.partial);
    if (cover.ok()) return cover;
    std::string ranks_note;
    if (groups.size() <= 16) {
      std::vector<std::string> parts;
      for (size_t g = 0; g < groups.size(); ++g) {
        parts.push_back(absl::StrCat("chunk ", g, " = ",
                                     RegionToString(regions[g]), " on rank ",
                                     refs_[groups[g].first].rank));
      }
      ranks_note = absl::StrCat(" (", absl::StrJoin(parts, "; "), ")");
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "entry '", t_.name(name), "': ", cover.message(), ranks_note));
  }

  // A tensor: one chunk per distinct non-empty region, which together must
  // cover the tensor (unless partial) without overlapping.
  absl::Status PlanTensor(uint32_t name, size_t b, size_t e) {
    e = DropEmptyPieces(b, e);
    CKPT_ASSIGN_OR_RETURN(Groups groups, GroupIdenticalRegions(name, b, e));
    CKPT_RETURN_IF_ERROR(CheckTensorCover(name, groups));
    const uint64_t es = DTypeSize(Item(refs_[b]).dtype);
    for (const auto& [gb, ge] : groups) {
      uniques_.push_back(Unique{elements_[refs_[gb].region] * es, gb, ge});
    }
    return absl::OkStatus();
  }

  // Whether `record` has one rank per rank of the table and writes every
  // chunk (uniques_) through exactly one of its holders and nothing else:
  // write positions are distinct within a rank (strictly increasing), so
  // as many positions as chunks, each chunk written once, leave no
  // position outside a chunk. REQUIRES: the planning of Run done.
  bool RecordFits(const format::PlanRecord& record) const {
    if (record.ranks.size() != t_.ranks()) return false;
    std::vector<size_t> first(t_.ranks() + 1, 0);  // rank r's first item
    for (uint32_t r = 0; r < t_.ranks(); ++r)
      first[r + 1] = first[r] + t_.rank(r).size();
    std::vector<char> written(t_.total_items(), 0);
    size_t count = 0;
    for (uint32_t r = 0; r < t_.ranks(); ++r) {
      for (uint32_t i : record.ranks[r].writes) {
        if (i >= t_.rank(r).size()) return false;
        written[first[r] + i] = 1;
        ++count;
      }
    }
    if (count != uniques_.size()) return false;
    for (const Unique& u : uniques_) {
      size_t writers = 0;
      for (size_t k = u.begin; k < u.end; ++k)
        writers += written[first[refs_[k].rank] + refs_[k].index];
      if (writers != 1) return false;
    }
    return true;
  }

  // Chooses the writer of every chunk. Chunks with one holder are fixed;
  // the rest go, largest first, to the holder with the fewest bytes so far
  // (ties: lowest rank). Returns writes[r], sorted.
  std::vector<std::vector<uint32_t>> AssignWriters() const {
    std::vector<std::vector<uint32_t>> writes(t_.ranks());
    std::vector<uint64_t> load(t_.ranks(), 0);
    std::vector<size_t> flexible;
    for (size_t u = 0; u < uniques_.size(); ++u) {
      if (uniques_[u].end - uniques_[u].begin == 1) {
        const Ref& h = refs_[uniques_[u].begin];
        load[h.rank] += uniques_[u].bytes;
        writes[h.rank].push_back(h.index);
      } else {
        flexible.push_back(u);
      }
    }
    std::stable_sort(flexible.begin(), flexible.end(), [&](size_t a, size_t b) {
      return uniques_[a].bytes > uniques_[b].bytes;
    });
    for (size_t u : flexible) {
      const Ref* best = nullptr;
      for (size_t k = uniques_[u].begin; k < uniques_[u].end; ++k) {
        if (!best || load[refs_[k].rank] < load[best->rank]) best = &refs_[k];
      }
      load[best->rank] += uniques_[u].bytes;
      writes[best->rank].push_back(best->index);
    }
    for (auto& w : writes) std::sort(w.begin(), w.end());
    return writes;
  }

  const PlanTable& t_;
  std::vector<uint64_t> elements_;  // by region id
  std::vector<uint32_t> group_of_;  // by region id; kNone between tensors
  std::vector<Ref> refs_;
  std::vector<size_t> name_begin_;
  std::vector<char> disagree_;  // by name id
  std::vector<Unique> uniques_;
  std::vector<Ref> scratch_;
};

}  // namespace

absl::StatusOr<GlobalPlan> PlanSave(const PlanTable& table) {
  return Planner(table).Run();
}

absl::StatusOr<GlobalPlan> PlanSave(const PlanTable& table,
                                    const format::PlanRecord& recorded,
                                    bool* reused) {
  return Planner(table).Run(&recorded, reused);
}

absl::StatusOr<GlobalPlan> PlanSave(const std::vector<LocalPlan>& ranks) {
  PlanTable table;
  for (const LocalPlan& plan : ranks) {
    CKPT_RETURN_IF_ERROR(table.AppendEncoded(EncodeLocalPlan(plan)));
  }
  return PlanSave(table);
}

format::Fingerprint GlobalFingerprint(const format::PlanRecord& record) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  for (const auto& r : record.ranks)
    XXH3_128bits_update(st, r.fingerprint.data(), r.fingerprint.size());
  format::Fingerprint fp = ToFingerprint(XXH3_128bits_digest(st));
  XXH3_freeState(st);
  return fp;
}

namespace {
// The item counts that RankPlan messages announce (a malformed one counts
// 0: AppendRankPlan reports it).
size_t CountItems(const std::vector<std::string>& rank_plans) {
  size_t n = 0;
  for (const std::string& m : rank_plans) {
    format::ByteReader r(m);
    if (!r.ReadBytes("fingerprint", sizeof(format::Fingerprint)).ok()) continue;
    auto count = r.ReadVarint("item count");
    if (count.ok()) n += std::min<uint64_t>(*count, m.size() / 4);
  }
  return n;
}
}  // namespace

namespace {
// `recorded` decoded, if it decodes and records exactly the fingerprints of
// `current` (one per rank).
std::optional<format::PlanRecord> RecordedFor(
    absl::string_view recorded, const format::PlanRecord& current) {
  if (recorded.empty()) return std::nullopt;
  absl::StatusOr<format::PlanRecord> rec = format::DecodePlanRecord(recorded);
  if (!rec.ok() || rec->ranks.size() != current.ranks.size())
    return std::nullopt;
  for (size_t r = 0; r < current.ranks.size(); ++r) {
    if (rec->ranks[r].fingerprint != current.ranks[r].fingerprint)
      return std::nullopt;
  }
  return std::move(*rec);
}
}  // namespace

absl::StatusOr<CoordinatorPlan> PlanOnCoordinator(
    std::vector<std::string> rank_plans, absl::string_view recorded) {
  PlanTable table;
  table.Reserve(CountItems(rank_plans));
  format::PlanRecord record;
  record.ranks.resize(rank_plans.size());
  for (size_t r = 0; r < rank_plans.size(); ++r) {
    CKPT_RETURN_IF_ERROR(
        AppendRankPlan(rank_plans[r], &record.ranks[r].fingerprint, &table));
    std::string().swap(rank_plans[r]);
  }
  CoordinatorPlan out;
  std::optional<format::PlanRecord> rec = RecordedFor(recorded, record);
  CKPT_ASSIGN_OR_RETURN(GlobalPlan gp, rec ? PlanSave(table, *rec, &out.reused)
                                           : PlanSave(table));
  for (size_t r = 0; r < rank_plans.size(); ++r)
    record.ranks[r].writes = std::move(gp.writes[r]);
  out.body = format::EncodePlanRecord(record);
  return out;
}

}  // namespace ckpt::internal

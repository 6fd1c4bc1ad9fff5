#include "ckpt/ops/diff.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ckpt/format/geometry.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/ops/local_range.h"
#include "ckpt/reader.h"
#include "progress_reporter.h"

namespace ckpt::ops {
namespace {

constexpr char kAbsent[] = "(absent)";

std::string KindName(const EntryView& e) {
  return e.is_object() ? "object" : "tensor";
}

uint64_t EntryBytes(const EntryView& e) {
  uint64_t n = 1;
  for (uint64_t d : e.shape()) n *= d;
  return n * DTypeSize(e.dtype());
}

DiffSide Summarize(const Reader& r) {
  DiffSide s;
  s.path = r.path();
  s.step = r.description().step;
  s.world_size = r.description().world_size;
  s.entries = r.entries().size();
  return s;
}

std::vector<DiffNote> Notes(const CheckpointDescription& a,
                            const CheckpointDescription& b) {
  std::vector<DiffNote> notes;
  if (a.step != b.step) {
    notes.push_back({"step", absl::StrCat(a.step), absl::StrCat(b.step)});
  }
  if (a.world_size != b.world_size) {
    notes.push_back(
        {"world size", absl::StrCat(a.world_size), absl::StrCat(b.world_size)});
  }
  std::map<std::string, std::pair<std::string, std::string>> meta;
  for (const auto& [k, v] : a.metadata) meta[k] = {v, kAbsent};
  for (const auto& [k, v] : b.metadata) {
    auto it = meta.find(k);
    if (it == meta.end()) {
      meta[k] = {kAbsent, v};
    } else {
      it->second.second = v;
    }
  }
  for (const auto& [k, v] : meta) {
    if (v.first != v.second)
      notes.push_back({absl::StrCat("metadata '", k, "'"), v.first, v.second});
  }
  return notes;
}

// Elements of the partial entry `a` that `b` stores too, and in total.
uint64_t CoveredByBoth(const EntryView& a, const EntryView& b) {
  uint64_t n = 0;
  for (size_t i = 0; i < a.num_chunks(); ++i) {
    for (size_t j = 0; j < b.num_chunks(); ++j) {
      n +=
          IntersectionElements(a.shape(), a.chunk_region(i), b.chunk_region(j));
    }
  }
  return n;
}
uint64_t Stored(const EntryView& e) {
  uint64_t n = 0;
  for (size_t i = 0; i < e.num_chunks(); ++i)
    n += RegionElements(e.chunk_region(i));
  return n;
}

// The regions of `e` whose values are compared, in order: the chunks of a
// partial entry, else the whole tensor.
std::vector<Region> ValueRegions(const EntryView& e) {
  std::vector<Region> regions;
  if (e.partial()) {
    for (size_t i = 0; i < e.num_chunks(); ++i)
      regions.push_back(e.chunk_region(i));
  } else {
    regions.push_back(FullBox(e.shape()));
  }
  return regions;
}

// Bytes compared per side for `e`: an object's bytes, a tensor's elements
// (of a partial tensor, those stored).
uint64_t ValueBytes(const EntryView& e) {
  if (e.is_object()) return e.shape()[0];
  return e.partial() ? Stored(e) * DTypeSize(e.dtype()) : EntryBytes(e);
}

// The most requests in one batch (Differ::CompareBatch): a request takes a
// few hundred bytes in the Reader while it is planned and served, so a
// batch of scalars takes a few MiB, whatever the number of entries.
constexpr size_t kBatchRequests = size_t{1} << 14;

class Differ {
 public:
  Differ(const DiffOptions& o, Reader* a, Reader* b,
         internal::ProgressReporter* progress)
      : o_(o), a_(a), b_(b), progress_(progress) {}

  // Whether `e` is compared in a batch with its neighbours: its values fit
  // in one window. Larger entries are compared window by window
  // (CompareTensor) or read whole (CompareObject).
  bool Batched(const EntryView& e) const {
    return ValueBytes(e) <= o_.window_bytes;
  }

  // Compares the entries from `begin` on that make one batch: consecutive
  // Batched entries of at most window_bytes per side together and at most
  // kBatchRequests requests (at least one entry), loaded with one
  // Reader::Load per side. Entry by entry, each entry cost two Loads (each
  // planning and starting its threads): 53 s for 2^20 scalar entries.
  // Appends each entry's difference (or nullopt) to `out`, one per entry
  // of the batch, as CompareTensor and CompareObject find it.
  absl::Status CompareBatch(const std::vector<EntryView>& entries, size_t begin,
                            std::vector<std::optional<ValueDiff>>* out) {
    Batch batch = PlanBatch(entries, begin);
    if (buf_a_.size() < batch.buffered) {
      buf_a_.resize(batch.buffered);
      buf_b_.resize(batch.buffered);
    }
    std::vector<std::string> objs_a(batch.objects), objs_b(batch.objects);
    CKPT_RETURN_IF_ERROR(
        LoadBatch(a_, buf_a_.data(), &objs_a, batch.dst, &batch.reqs));
    CKPT_RETURN_IF_ERROR(
        LoadBatch(b_, buf_b_.data(), &objs_b, batch.dst, &batch.reqs));
    uint64_t at = 0;
    size_t object = 0;
    for (size_t i = begin; i < batch.end; ++i) {
      const EntryView& e = entries[i];
      if (e.is_object()) {
        out->push_back(CompareBytes(e, objs_a[object], objs_b[object]));
        ++object;
      } else {
        out->push_back(CompareBuffered(e, &at));
      }
    }
    progress_->Add(batch.bytes);
    return absl::OkStatus();
  }

  // Compares the values of a tensor entry whose structure is equal in A and
  // B (and, if partial, whose chunks cover the same elements).
  absl::StatusOr<std::optional<ValueDiff>> CompareTensor(const EntryView& e) {
    const uint64_t es = DTypeSize(e.dtype());
    const uint64_t window = std::max<uint64_t>(1, o_.window_bytes / es);
    CompareStats stats;
    ValueDiff vd;
    vd.entry = e.name();
    for (const Region& region : ValueRegions(e)) {
      const uint64_t n = RegionElements(region);
      for (uint64_t begin = 0; begin < n; begin += window) {
        const uint64_t end = std::min(n, begin + window);
        const uint64_t bytes = (end - begin) * es;
        if (buf_a_.size() < bytes) {
          buf_a_.resize(bytes);
          buf_b_.resize(bytes);
        }
        std::vector<Region> subs = LocalRangeToRegions(region, begin, end);
        CKPT_RETURN_IF_ERROR(LoadWindow(a_, e, subs, buf_a_.data()));
        CKPT_RETURN_IF_ERROR(LoadWindow(b_, e, subs, buf_b_.data()));
        const bool had_first = stats.has_first;
        CompareElements(e.dtype(), buf_a_.data(), buf_b_.data(), end - begin,
                        begin, o_.tolerance, &stats);
        if (!had_first && stats.has_first) {
          vd.first_at = GlobalCoordinates(e.shape(), region, stats.first_index);
        }
        vd.total += end - begin;
        progress_->Add(bytes);
      }
    }
    return Finish(stats, std::move(vd));
  }

  absl::StatusOr<std::optional<ValueDiff>> CompareObject(const EntryView& e) {
    ++loads_;
    CKPT_ASSIGN_OR_RETURN(std::string x, a_->ReadObject(e.name()));
    CKPT_ASSIGN_OR_RETURN(std::string y, b_->ReadObject(e.name()));
    progress_->Add(x.size());
    return CompareBytes(e, x, y);
  }

  // Reader::Load calls made per side.
  uint64_t loads() const { return loads_; }

 private:
  // Where the bytes of a request of a batch go: an offset in the buffers,
  // or the index of an object.
  struct Dst {
    bool object;
    uint64_t at;
  };

  // One batch of CompareBatch: its requests, where each one's bytes go,
  // and the entries [begin, end) it covers.
  struct Batch {
    std::vector<LoadRequest> reqs;
    std::vector<Dst> dst;
    uint64_t bytes = 0;     // of the batch, the window's budget
    uint64_t buffered = 0;  // of its tensors, in the buffers
    size_t objects = 0;
    size_t end = 0;
  };

  // The entries from `begin` on that make one batch (CompareBatch's
  // contract) and their requests.
  Batch PlanBatch(const std::vector<EntryView>& entries, size_t begin) const {
    Batch batch;
    for (batch.end = begin;
         batch.end < entries.size() && Batched(entries[batch.end]);
         ++batch.end) {
      const EntryView& e = entries[batch.end];
      const uint64_t vb = ValueBytes(e);
      const bool first_entry = batch.end == begin;
      if (!first_entry && vb > o_.window_bytes - batch.bytes) break;
      const size_t first_request = batch.reqs.size();
      AddRequests(e, &batch);
      if (!first_entry && batch.reqs.size() > kBatchRequests) {
        batch.reqs.resize(first_request);
        batch.dst.resize(first_request);
        break;
      }
      if (e.is_object()) {
        ++batch.objects;
      } else {
        batch.buffered += vb;
      }
      batch.bytes += vb;
    }
    return batch;
  }

  // Appends the requests of `e` to `batch`: an object's whole value, or
  // each stored region of a tensor into the buffers after what is there.
  static void AddRequests(const EntryView& e, Batch* batch) {
    if (e.is_object()) {
      LoadRequest q;
      q.name = e.name();
      batch->reqs.push_back(std::move(q));
      batch->dst.push_back({true, batch->objects});
      return;
    }
    const uint64_t es = DTypeSize(e.dtype());
    uint64_t at = batch->buffered;
    for (const Region& region : ValueRegions(e)) {
      const uint64_t n = RegionElements(region);
      if (n == 0) continue;
      for (Region& sub : LocalRangeToRegions(region, 0, n)) {
        LoadRequest q;
        q.name = e.name();
        q.dtype = e.dtype();
        q.shape = e.shape();
        batch->dst.push_back({false, at});
        at += RegionElements(sub) * es;
        q.region = std::move(sub);
        batch->reqs.push_back(std::move(q));
      }
    }
  }

  // Compares tensor `e`'s values, loaded into both buffers at *at (which
  // advances past them), region by region as AddRequests laid them out.
  std::optional<ValueDiff> CompareBuffered(const EntryView& e, uint64_t* at) {
    const uint64_t es = DTypeSize(e.dtype());
    CompareStats stats;
    ValueDiff vd;
    vd.entry = e.name();
    for (const Region& region : ValueRegions(e)) {
      const uint64_t n = RegionElements(region);
      if (n == 0) continue;
      const bool had_first = stats.has_first;
      CompareElements(e.dtype(), buf_a_.data() + *at, buf_b_.data() + *at, n, 0,
                      o_.tolerance, &stats);
      if (!had_first && stats.has_first) {
        vd.first_at = GlobalCoordinates(e.shape(), region, stats.first_index);
      }
      vd.total += n;
      *at += n * es;
    }
    return Finish(stats, std::move(vd));
  }

  static std::optional<ValueDiff> Finish(const CompareStats& stats,
                                         ValueDiff vd) {
    if (stats.differing == 0) return std::nullopt;
    vd.differing = stats.differing;
    vd.max_abs_diff = stats.max_abs_diff;
    vd.first_a = stats.first_a;
    vd.first_b = stats.first_b;
    return vd;
  }

  static std::optional<ValueDiff> CompareBytes(const EntryView& e,
                                               const std::string& x,
                                               const std::string& y) {
    ValueDiff vd;
    vd.entry = e.name();
    vd.object = true;
    vd.size_a = x.size();
    vd.size_b = y.size();
    const size_t common = std::min(x.size(), y.size());
    vd.total = std::max(x.size(), y.size());
    vd.differing = vd.total - common;
    for (size_t i = 0; i < common; ++i) vd.differing += x[i] != y[i];
    if (vd.differing == 0) return std::nullopt;
    return vd;
  }

  LoadOptions Options() const {
    LoadOptions lo;
    lo.allow_unrequested = true;
    lo.report_not_loaded = false;  // loaded batch by batch, window by window
    lo.io_threads = o_.io_threads;
    return lo;
  }

  // Loads the requests of a batch from `r`, pointed at `buf` and `objs`
  // as `dst` says.
  absl::Status LoadBatch(Reader* r, char* buf, std::vector<std::string>* objs,
                         const std::vector<Dst>& dst,
                         std::vector<LoadRequest>* reqs) {
    for (size_t i = 0; i < reqs->size(); ++i) {
      LoadRequest& q = (*reqs)[i];
      if (dst[i].object) {
        q.object = &(*objs)[dst[i].at];
      } else {
        q.data = buf + dst[i].at;
      }
    }
    if (reqs->empty()) return absl::OkStatus();  // no elements
    if (r == a_) ++loads_;
    return r->Load(*reqs, Options()).status();
  }

  absl::Status LoadWindow(Reader* r, const EntryView& e,
                          const std::vector<Region>& subs, char* dst) {
    std::vector<LoadRequest> reqs;
    reqs.reserve(subs.size());
    for (const Region& sub : subs) {
      LoadRequest q;
      q.name = e.name();
      q.dtype = e.dtype();
      q.shape = e.shape();
      q.region = sub;
      q.data = dst;
      dst += RegionElements(sub) * DTypeSize(e.dtype());
      reqs.push_back(std::move(q));
    }
    if (r == a_) ++loads_;
    return r->Load(reqs, Options()).status();
  }

  const DiffOptions& o_;
  Reader* a_;
  Reader* b_;
  internal::ProgressReporter* progress_;
  std::string buf_a_, buf_b_;
  uint64_t loads_ = 0;
};

absl::Status CheckDiffOptions(const DiffOptions& o) {
  const Tolerance& tol = o.tolerance;
  if (!(tol.atol >= 0) || !(tol.rtol >= 0) || std::isinf(tol.atol) ||
      std::isinf(tol.rtol)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tolerances must be finite and >= 0, got atol ", tol.atol,
                     " and rtol ", tol.rtol));
  }
  if (o.io_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("io_threads must be >= 1, got ", o.io_threads));
  }
  return absl::OkStatus();
}

// The structural differences of entry `name` (present on both sides or
// not), appended to `out`.
void CompareStructure(const std::string& name,
                      const std::optional<EntryView>& ea,
                      const std::optional<EntryView>& eb,
                      std::vector<StructuralDiff>* out) {
  auto add = [&](const char* change, std::string x, std::string y) {
    out->push_back({name, change, std::move(x), std::move(y)});
  };
  if (!eb || !ea) {
    add(!eb ? "removed" : "added", "", "");
    return;
  }
  if (ea->is_object() != eb->is_object()) {
    add("kind", KindName(*ea), KindName(*eb));
    return;
  }
  if (ea->is_object()) return;
  const size_t before = out->size();
  if (ea->dtype() != eb->dtype()) {
    add("dtype", std::string(DTypeName(ea->dtype())),
        std::string(DTypeName(eb->dtype())));
  }
  if (ea->shape() != eb->shape())
    add("shape", ShapeToString(ea->shape()), ShapeToString(eb->shape()));
  if (ea->partial() != eb->partial()) {
    add("partial", ea->partial() ? "true" : "false",
        eb->partial() ? "true" : "false");
  }
  if (out->size() == before && ea->partial()) {
    const uint64_t sa = Stored(*ea), sb = Stored(*eb);
    uint64_t total = 1;
    for (uint64_t d : ea->shape()) total *= d;
    if (sa != sb || CoveredByBoth(*ea, *eb) != sa) {
      add("coverage", absl::StrCat(sa, " of ", total, " elements"),
          absl::StrCat(sb, " of ", total, " elements"));
    }
  }
}

// Compares the values of `entries` (equal in structure on both sides).
absl::Status CompareValues(const DiffOptions& o, Reader* a, Reader* b,
                           const std::vector<EntryView>& entries,
                           DiffReport* report) {
  uint64_t total_bytes = 0;
  for (const EntryView& e : entries) total_bytes += EntryBytes(e);
  internal::ProgressReporter progress(o.on_progress, kPhaseComparing,
                                      total_bytes);
  Differ differ(o, a, b, &progress);
  std::vector<std::optional<ValueDiff>> found;
  for (size_t i = 0; i < entries.size();) {
    found.clear();
    if (differ.Batched(entries[i])) {
      CKPT_RETURN_IF_ERROR(differ.CompareBatch(entries, i, &found));
    } else {
      std::optional<ValueDiff> vd;
      if (entries[i].is_object()) {
        CKPT_ASSIGN_OR_RETURN(vd, differ.CompareObject(entries[i]));
      } else {
        CKPT_ASSIGN_OR_RETURN(vd, differ.CompareTensor(entries[i]));
      }
      found.push_back(std::move(vd));
    }
    for (std::optional<ValueDiff>& vd : found) {
      report->bytes_compared += ValueBytes(entries[i++]);
      ++report->entries_compared;
      if (vd) report->values.push_back(*std::move(vd));
    }
  }
  report->loads = differ.loads();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DiffReport> Diff(const DiffOptions& o) {
  CKPT_RETURN_IF_ERROR(CheckDiffOptions(o));
  ReaderOptions ro;
  ro.storage = o.storage;
  ro.io_threads = o.io_threads;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Reader> a, Reader::Open(o.a, ro));
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Reader> b, Reader::Open(o.b, ro));

  DiffReport report;
  report.a = Summarize(*a);
  report.b = Summarize(*b);
  report.tolerance = o.tolerance;
  report.notes = Notes(a->description(), b->description());

  std::set<std::string> names;
  for (const EntryView& e : a->entries()) names.insert(e.name());
  for (const EntryView& e : b->entries()) names.insert(e.name());
  // Entries to compare by value: those without structural differences.
  std::vector<EntryView> to_compare;
  for (const std::string& name : names) {
    const std::optional<EntryView> ea = a->FindEntry(name);
    const size_t before = report.structural.size();
    CompareStructure(name, ea, b->FindEntry(name), &report.structural);
    if (report.structural.size() == before) to_compare.push_back(*ea);
  }
  CKPT_RETURN_IF_ERROR(CompareValues(o, a.get(), b.get(), to_compare, &report));
  return report;
}

}  // namespace ckpt::ops

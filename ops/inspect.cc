#include "ckpt/ops/inspect.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/format/geometry.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/ops/validate.h"
#include "storage/checkpoint_dir.h"
#include "util/mutex.h"

namespace ckpt::ops {

using format::ChunkRecord;
using format::EntryRecord;

namespace {

bool IsObject(const EntryRecord& e) {
  return e.kind == format::EntryKind::kObject;
}

uint64_t RawBytes(const EntryRecord& e, const ChunkRecord& c) {
  return RegionElements(c.region) * DTypeSize(e.dtype);
}

// "1 tensor", "2 tensors".
std::string Count(uint64_t n, absl::string_view noun) {
  return absl::StrCat(n, " ", noun, n == 1 ? "" : "s");
}

// Per dimension, the distinct (offset, size) intervals of the boxes of
// `live` (all boxes), sorted.
using Intervals = std::vector<std::vector<std::pair<uint64_t, uint64_t>>>;
Intervals BoxIntervals(size_t nd, const std::vector<const ChunkRecord*>& live) {
  Intervals iv(nd);
  for (size_t d = 0; d < nd; ++d) {
    iv[d].reserve(live.size());
    for (const ChunkRecord* c : live) {
      const Box& b = std::get<Box>(c->region);
      iv[d].emplace_back(b.offset[d], b.size[d]);
    }
    if (!std::is_sorted(iv[d].begin(), iv[d].end()))
      std::sort(iv[d].begin(), iv[d].end());
    iv[d].erase(std::unique(iv[d].begin(), iv[d].end()), iv[d].end());
  }
  return iv;
}

// True if the boxes of `live` form a grid: exactly one box per combination
// of the per-dimension intervals `iv`.
bool IsGrid(const Intervals& iv, const std::vector<const ChunkRecord*>& live) {
  const uint64_t k = live.size();
  uint64_t product = 1;
  for (const auto& d : iv) {
    if (d.size() > k / product) return false;
    product *= d.size();
  }
  if (product != k) return false;
  std::vector<bool> used(k, false);
  for (const ChunkRecord* c : live) {
    const Box& b = std::get<Box>(c->region);
    uint64_t cell = 0;
    for (size_t d = 0; d < iv.size(); ++d) {
      if (iv[d].size() == 1) continue;
      auto it = std::lower_bound(iv[d].begin(), iv[d].end(),
                                 std::make_pair(b.offset[d], b.size[d]));
      cell = cell * iv[d].size() + static_cast<uint64_t>(it - iv[d].begin());
    }
    if (used[cell]) return false;
    used[cell] = true;
  }
  return true;
}

// "dim0 x4 dim1 x2 [uneven]" for a grid with intervals `iv`.
std::string GridSummary(const Intervals& iv) {
  std::vector<std::string> parts;
  bool uneven = false;
  for (size_t d = 0; d < iv.size(); ++d) {
    if (iv[d].size() < 2) continue;
    parts.push_back(absl::StrCat("dim", d, " x", iv[d].size()));
    for (const auto& x : iv[d]) uneven |= x.second != iv[d][0].second;
  }
  if (parts.empty()) return "box x1";
  return absl::StrCat(absl::StrJoin(parts, " "), uneven ? " uneven" : "");
}

}  // namespace

std::string ShardingSummary(const EntryRecord& e) {
  const std::string suffix =
      (e.flags & format::kEntryFlagPartial) ? " partial" : "";
  if (e.chunks.empty()) return "none" + suffix;
  std::vector<const ChunkRecord*> live;
  live.reserve(e.chunks.size());
  for (const ChunkRecord& c : e.chunks) {
    if (RegionElements(c.region) > 0) live.push_back(&c);
  }
  if (live.empty()) return "empty" + suffix;
  const uint64_t k = live.size();
  uint64_t numel = 1;
  for (uint64_t d : e.shape) numel *= d;  // fits: the decoder checked the shape
  if (k == 1 && RegionElements(live[0]->region) == numel)
    return "whole" + suffix;

  size_t boxes = 0;
  for (const ChunkRecord* c : live)
    boxes += std::holds_alternative<Box>(c->region);
  if (boxes == 0) {
    const uint64_t len = std::get<FlatRange>(live[0]->region).length;
    bool even =
        std::all_of(live.begin(), live.end(), [&](const ChunkRecord* c) {
          return std::get<FlatRange>(c->region).length == len;
        });
    return absl::StrCat("flat x", k, even ? " even" : " uneven", suffix);
  }
  if (boxes == k) {
    const Intervals iv = BoxIntervals(e.shape.size(), live);
    if (IsGrid(iv, live)) return GridSummary(iv) + suffix;
  }
  return absl::StrCat("irregular x", k, suffix);
}

double CheckpointSummary::compression_ratio() const {
  return stored_bytes == 0 ? 1.0
                           : static_cast<double>(raw_bytes) / stored_bytes;
}

absl::StatusOr<size_t> CheckpointSummary::FindEntry(
    const std::string& name) const {
  for (size_t i = 0; i < manifest.entries.size(); ++i) {
    if (manifest.entries[i].name == name) return i;
  }
  return ::ckpt::internal::EntryNotInCheckpoint(name, dir);
}

CheckpointSummary Summarize(std::string dir, format::Manifest manifest) {
  CheckpointSummary s;
  s.dir = std::move(dir);
  s.manifest = std::move(manifest);
  s.entries.resize(s.manifest.entries.size());
  for (size_t i = 0; i < s.manifest.entries.size(); ++i) {
    const EntryRecord& e = s.manifest.entries[i];
    EntrySummary& row = s.entries[i];
    row.index = i;
    uint64_t numel = 1;
    for (uint64_t d : e.shape) numel *= d;
    row.logical_bytes = numel * DTypeSize(e.dtype);
    for (const ChunkRecord& c : e.chunks) {
      row.raw_bytes += RawBytes(e, c);
      row.stored_bytes += c.stored_length;
    }
    row.sharding = ShardingSummary(e);
    (IsObject(e) ? s.objects : s.tensors) += 1;
    s.chunks += e.chunks.size();
    s.logical_bytes += row.logical_bytes;
    s.raw_bytes += row.raw_bytes;
    s.stored_bytes += row.stored_bytes;
  }
  return s;
}

absl::StatusOr<CheckpointSummary> LoadSummary(const std::string& path,
                                              Storage* storage) {
  if (storage == nullptr) storage = DefaultStorage();
  CKPT_ASSIGN_OR_RETURN(std::string dir,
                        ::ckpt::internal::ResolveCheckpointDir(storage, path));
  CKPT_ASSIGN_OR_RETURN(format::Manifest m,
                        ::ckpt::internal::ReadManifest(storage, dir));
  return Summarize(std::move(dir), std::move(m));
}

absl::Status AddStats(CheckpointSummary* summary, const std::string& only,
                      int threads, Storage* storage, ProgressFn on_progress) {
  constexpr size_t kStripes = 64;
  std::array<Mutex, kStripes> mu;
  std::vector<ValueStats> stats(summary->entries.size());
  ValidateOptions o;
  o.path = summary->dir;
  o.threads = threads;
  o.storage = storage;
  o.on_progress = std::move(on_progress);
  o.entry_filter = [&](const std::string& name) {
    return only.empty() || name == only;
  };
  o.on_data = [&](size_t index, const EntryRecord& e, size_t, uint64_t,
                  absl::string_view raw) {
    if (IsObject(e) || index >= stats.size()) return;
    ValueStats local;
    AccumulateValues(e.dtype, raw.data(), raw.size() / DTypeSize(e.dtype),
                     &local);
    MutexLock l(&mu[index % kStripes]);
    stats[index].Merge(local);
  };
  CKPT_ASSIGN_OR_RETURN(ValidateReport report, Validate(o));
  const Finding* first = nullptr;
  size_t errors = 0;
  for (const Finding& f : report.findings) {
    if (f.severity != Severity::kError) continue;
    if (first == nullptr) first = &f;
    ++errors;
  }
  errors += report.findings_dropped;
  if (first != nullptr) {
    return absl::DataLossError(absl::StrCat(
        FindingText(*first),
        errors > 1 ? absl::StrCat(" (and ", Count(errors - 1, "more problem"),
                                  "; ckpt-validate lists them all)")
                   : ""));
  }
  for (EntrySummary& row : summary->entries) {
    const EntryRecord& e = summary->manifest.entries[row.index];
    if (IsObject(e) || !(only.empty() || e.name == only)) continue;
    row.has_stats = true;
    row.stats = stats[row.index];
  }
  return absl::OkStatus();
}

}  // namespace ckpt::ops

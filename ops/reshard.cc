#include "ckpt/ops/reshard.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/ops/local_range.h"
#include "ckpt/ops/reshard_layout.h"
#include "ckpt/ops/source_shards.h"
#include "ckpt/reader.h"
#include "ckpt/writer.h"
#include "progress_reporter.h"
#include "save/world_save.h"
#include "util/mutex.h"

namespace ckpt::ops {
namespace {

using format::EntryRecord;

// Shared by the tensor sources of all ranks; called from I/O threads.
class SourceContext {
 public:
  SourceContext(Reader* reader, internal::ProgressReporter* progress)
      : reader_(reader), progress_(progress) {}

  // The source of piece `piece` of entry `e`: serves byte ranges of the
  // piece's layout by loading the matching sub-regions of SRC.
  TensorSource Make(const EntryRecord* e, Region piece) {
    return [this, e, piece](uint64_t offset, void* dst,
                            uint64_t n) -> absl::Status {
      const uint64_t es = DTypeSize(e->dtype);
      if (offset % es != 0 || n % es != 0) {
        return absl::InternalError(absl::StrCat(
            "entry '", format::EscapeText(e->name), "': byte range [", offset,
            ", ", offset + n, ") is not a whole number of elements"));
      }
      std::vector<LoadRequest> reqs;
      char* out = static_cast<char*>(dst);
      for (const Region& sub :
           LocalRangeToRegions(piece, offset / es, (offset + n) / es)) {
        LoadRequest q;
        q.name = e->name;
        q.dtype = e->dtype;
        q.shape = e->shape;
        q.region = sub;
        q.data = out;
        out += RegionElements(sub) * es;
        reqs.push_back(std::move(q));
      }
      LoadOptions lo;
      lo.allow_unrequested = true;
      lo.report_not_loaded = false;  // a few of many entries, many times
      lo.io_threads = 1;  // parallelism comes from the writers' I/O threads
      CKPT_RETURN_IF_ERROR(reader_->Load(reqs, lo).status());
      uint64_t seen = largest_.load();
      while (n > seen && !largest_.compare_exchange_weak(seen, n)) {
      }
      progress_->Add(n);
      return absl::OkStatus();
    };
  }

  uint64_t largest() const { return largest_.load(); }

 private:
  Reader* reader_;
  internal::ProgressReporter* const progress_;  // thread-safe
  std::atomic<uint64_t> largest_{0};
};

absl::Status CheckOptions(const ReshardOptions& o) {
  if (o.to < 1 || o.to > kMaxReshardRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--to must be in [1, ", kMaxReshardRanks, "], got ", o.to));
  }
  if (o.from < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from must be >= 1, got ", o.from));
  }
  if (o.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads must be >= 1, got ", o.threads));
  }
  if (o.src.empty() || o.dst.empty()) {
    return absl::InvalidArgumentError("SRC and DST must not be empty");
  }
  return absl::OkStatus();
}

// Plans every entry; reports all entries that cannot be planned at once.
absl::StatusOr<std::vector<EntryLayout>> PlanAll(const format::Manifest& m,
                                                 int n,
                                                 const Overrides& overrides,
                                                 const std::string& source) {
  std::vector<EntryLayout> plans;
  std::vector<std::string> errors;
  std::vector<bool> used(overrides.rules.size(), false);
  for (const EntryRecord& e : m.entries) {
    auto rule = overrides.Find(e.name);
    if (!rule.ok()) {
      errors.push_back(absl::StrCat(source, ": ", rule.status().message()));
      continue;
    }
    if (*rule != nullptr) used[*rule - overrides.rules.data()] = true;
    auto plan = PlanEntry(e, n, *rule);
    if (!plan.ok()) {
      errors.push_back(std::string(plan.status().message()));
      continue;
    }
    plans.push_back(*std::move(plan));
  }
  for (size_t i = 0; i < used.size(); ++i) {
    if (!used[i]) {
      errors.push_back(absl::StrCat(source, ": \"", overrides.rules[i].pattern,
                                    "\" matches no entry of the checkpoint"));
    }
  }
  if (errors.empty()) return plans;
  if (errors.size() == 1) return absl::InvalidArgumentError(errors[0]);
  const size_t shown = std::min<size_t>(errors.size(), 5);
  return absl::InvalidArgumentError(
      absl::StrCat(errors.size(), " problems with entry layouts: ",
                   absl::StrJoin(errors.begin(), errors.begin() + shown, "; "),
                   errors.size() > shown ? "; ..." : ""));
}

std::string CodecName(format::Codec c) {
  return c == format::Codec::kZstd ? "zstd" : "none";
}

// Opens SRC and checks it against the options: InvalidArgument when it was
// not saved on --from ranks, or when DST is a checkpoint directory. Every
// shard of SRC is checked against the manifest before anything is planned
// from it (CheckSourceShards), so that the output's layout and block tables
// are sized by what SRC's files hold, not by what its manifest declares.
absl::StatusOr<std::unique_ptr<Reader>> OpenSource(const ReshardOptions& o,
                                                   Storage* storage) {
  ReaderOptions ro;
  ro.storage = storage;
  ro.io_threads = 1;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader,
                        Reader::Open(o.src, ro));
  const format::Manifest& m = reader->manifest();
  if (o.from > 0 && m.info.world_size != static_cast<uint32_t>(o.from)) {
    return absl::InvalidArgumentError(
        absl::StrCat(reader->path(), ": saved on ", m.info.world_size,
                     " ranks, --from ", o.from, " given"));
  }
  if (storage->Stat(JoinPath(o.dst, format::kManifestFileName)).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.dst,
                     ": is a checkpoint directory; DST must be a checkpoint "
                     "root (the output goes "
                     "to DST/step-NNNNNNNN)"));
  }
  CKPT_RETURN_IF_ERROR(CheckSourceShards(storage, reader->path(), m));
  return reader;
}

// The override rules of read_overrides; none without it.
absl::StatusOr<Overrides> ReadOverrides(const ReshardOptions& o,
                                        Storage* storage) {
  if (!o.read_overrides) return Overrides();
  return o.read_overrides(storage);
}

// How DST is saved: SRC's codec (zstd if any chunk uses it) and block size
// (the largest of its stored chunks', so that DST's block tables are no
// larger than SRC's) unless --codec says otherwise, its metadata, and the
// I/O threads shared by the ranks.
SaveOptions SaveOptionsFor(const format::Manifest& m, const ReshardOptions& o) {
  SaveOptions so;
  so.codec = format::Codec::kNone;
  bool have_block_size = false;
  for (const EntryRecord& e : m.entries) {
    for (const auto& c : e.chunks) {
      if (c.codec == format::Codec::kZstd) so.codec = format::Codec::kZstd;
      if (c.stored_length > 0 &&
          (!have_block_size || c.block_size > so.block_size)) {
        so.block_size = c.block_size;
        have_block_size = true;
      }
    }
  }
  if (o.codec) so.codec = *o.codec;
  so.metadata = m.metadata;
  return so;
}

using EntriesByName = std::map<std::string, const EntryRecord*>;
using Objects = std::vector<std::pair<std::string, std::string>>;

// Describes every planned entry in `report` (entries, tensor and object
// bytes) and reads the objects, verified, into `objects`: they are held
// during the save.
absl::Status DescribeAndReadObjects(const std::vector<EntryLayout>& plans,
                                    const EntriesByName& by_name,
                                    Reader& reader, ReshardReport& report,
                                    Objects& objects) {
  for (const EntryLayout& p : plans) {
    const EntryRecord& e = *by_name.at(p.name);
    ReshardedEntry re;
    re.name = p.name;
    re.object = p.object;
    re.dtype = e.dtype;
    re.shape = e.shape;
    re.source = p.source;
    re.layout = p.LayoutName();
    re.from_override = p.from_override;
    report.entries.push_back(std::move(re));
    if (p.object) {
      CKPT_ASSIGN_OR_RETURN(std::string bytes, reader.ReadObject(p.name));
      report.object_bytes += bytes.size();
      objects.emplace_back(p.name, std::move(bytes));
    } else {
      uint64_t n = 0;
      for (const auto& c : e.chunks) n += RegionElements(c.region);
      report.tensor_bytes += n * DTypeSize(e.dtype);
    }
  }
  return absl::OkStatus();
}

// Registers what rank `rank` of DST holds: its piece of every tensor (read
// from SRC through `sources` while its shard is written) and, on rank 0,
// a copy of every object.
absl::Status RegisterRank(::ckpt::internal::RankContents& contents, int rank,
                          const std::vector<EntryLayout>& plans,
                          const EntriesByName& by_name, SourceContext& sources,
                          const Objects& objects) {
  for (const EntryLayout& p : plans) {
    if (p.object) continue;
    std::optional<Region> piece = p.Piece(rank);
    if (!piece) continue;
    TensorOptions to;
    to.replica = p.replica;
    to.partial = p.partial;
    const EntryRecord* e = by_name.at(p.name);
    CKPT_RETURN_IF_ERROR(contents.AddTensorSource(
        p.name, e->dtype, e->shape, *piece, sources.Make(e, *piece), to));
  }
  if (rank != 0) return absl::OkStatus();
  for (const auto& [name, bytes] : objects) {
    CKPT_RETURN_IF_ERROR(contents.SetObject(name, bytes));
  }
  return absl::OkStatus();
}

// Saves DST as `o.to` ranks, min(--threads, N) of them written at a time
// (::ckpt::internal::SaveWorld: no thread per output rank, memory bounded
// by the ranks in flight). Returns the save's result.
absl::StatusOr<SaveResult> WriteRanks(const ReshardOptions& o, Storage* storage,
                                      const std::vector<EntryLayout>& plans,
                                      const EntriesByName& by_name,
                                      SourceContext& sources,
                                      const Objects& objects, SaveOptions so,
                                      uint64_t step) {
  ::ckpt::internal::WorldSaveOptions bo;
  bo.parallel_ranks = std::min(o.threads, o.to);
  so.io_threads = std::max(1, o.threads / bo.parallel_ranks);
  bo.save = std::move(so);
  bo.storage = storage;
  return ::ckpt::internal::SaveWorld(
      o.dst, step, o.to,
      [&](int rank, ::ckpt::internal::RankContents& contents,
          std::shared_ptr<void>&) {
        return RegisterRank(contents, rank, plans, by_name, sources, objects);
      },
      bo);
}

// --verify: ckpt-diff of SRC against the output, into `report.verify`.
absl::Status VerifyOutput(const ReshardOptions& o, Storage* storage,
                          ReshardReport& report) {
  DiffOptions d;
  d.a = report.src_dir;
  d.b = report.dst_dir;
  d.storage = storage;
  d.io_threads = o.threads;
  d.on_progress = o.on_progress;
  CKPT_ASSIGN_OR_RETURN(DiffReport dr, Diff(d));
  report.verify = std::move(dr);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ReshardReport> Reshard(const ReshardOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  CKPT_RETURN_IF_ERROR(CheckOptions(o));
  Storage* storage = o.storage != nullptr ? o.storage : DefaultStorage();
  // Plan: open and check SRC, the layout of every entry on the new ranks.
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader, OpenSource(o, storage));
  const format::Manifest& m = reader->manifest();
  CKPT_ASSIGN_OR_RETURN(Overrides overrides, ReadOverrides(o, storage));
  CKPT_ASSIGN_OR_RETURN(std::vector<EntryLayout> plans,
                        PlanAll(m, o.to, overrides, o.overrides_source));
  ReshardReport report;
  report.src_dir = reader->path();
  report.src_step = m.info.step;
  report.step = o.step.value_or(m.info.step);
  report.from = m.info.world_size;
  report.to = static_cast<uint32_t>(o.to);
  const SaveOptions so = SaveOptionsFor(m, o);
  report.codec = CodecName(so.codec);
  EntriesByName by_name;
  for (const EntryRecord& e : m.entries) by_name[e.name] = &e;
  Objects objects;
  CKPT_RETURN_IF_ERROR(
      DescribeAndReadObjects(plans, by_name, *reader, report, objects));

  // Write: the new ranks save DST, reading SRC as they go.
  internal::ProgressReporter progress(o.on_progress, kPhaseWriting,
                                      report.tensor_bytes);
  SourceContext sources(reader.get(), &progress);
  CKPT_ASSIGN_OR_RETURN(SaveResult saved,
                        WriteRanks(o, storage, plans, by_name, sources, objects,
                                   so, report.step));
  progress.Finish();
  report.dst_dir = saved.path;
  report.stored_bytes = saved.stored_bytes;
  report.largest_read = sources.largest();
  std::sort(report.entries.begin(), report.entries.end(),
            [](const ReshardedEntry& a, const ReshardedEntry& b) {
              return a.name < b.name;
            });
  if (o.verify) CKPT_RETURN_IF_ERROR(VerifyOutput(o, storage, report));
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return report;
}

}  // namespace ckpt::ops

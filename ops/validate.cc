#include "ckpt/ops/validate.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/format/coverage.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/geometry.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "read/index_check.h"
#include "read/shard_file.h"
#include "storage/checkpoint_dir.h"
#include "util/mutex.h"
#include "util/parallel_for.h"
#include "validate_internal.h"

namespace ckpt::ops {

using format::ChunkRecord;
using format::EntryRecord;
using internal::FindingList;
using internal::OpenedShard;

namespace internal {

void FindingList::Add(Finding f) {
  MutexLock l(&mu_);
  if (findings_.size() >= max_) {
    ++dropped_;
    return;
  }
  findings_.push_back(std::move(f));
}

void FindingList::MoveTo(ValidateReport* report) {
  MutexLock l(&mu_);
  auto key = [](const Finding& f) {
    return std::tie(f.file, f.entry, f.chunk, f.block, f.message);
  };
  std::sort(
      findings_.begin(), findings_.end(),
      [&](const Finding& a, const Finding& b) { return key(a) < key(b); });
  report->findings = std::move(findings_);
  report->findings_dropped = dropped_;
  findings_.clear();
}

}  // namespace internal

namespace {

namespace core = ::ckpt::internal;

class Validator {
 public:
  Validator(const ValidateOptions& o, ValidateReport* r)
      : options_(o),
        report_(r),
        storage_(o.storage != nullptr ? o.storage : DefaultStorage()),
        findings_(o.max_findings) {
    int hw = static_cast<int>(std::thread::hardware_concurrency());
    threads_ = o.threads > 0 ? o.threads : std::max(1, hw);
  }

  absl::Status Run() {
    CKPT_ASSIGN_OR_RETURN(std::string dir, Resolve());
    absl::Status s = dir.empty() ? absl::OkStatus() : CheckCheckpoint(dir);
    findings_.MoveTo(report_);
    return s;
  }

 private:
  void Add(Severity sev, std::string file, std::string message) {
    Finding f;
    f.severity = sev;
    f.file = std::move(file);
    f.message = std::move(message);
    findings_.Add(std::move(f));
  }
  void AddIfError(const std::string& file, const absl::Status& s) {
    if (!s.ok()) Add(Severity::kError, file, std::string(s.message()));
  }
  // A finding about entry `entry` (manifest or index name) and, when
  // chunk >= 0, chunk `chunk` of the manifest's entry of that name.
  void AddEntry(const std::string& file, const std::string& entry,
                int64_t chunk, std::string message) {
    Finding f;
    f.file = file;
    f.entry = entry;
    f.chunk = chunk;
    const int64_t e = index_ ? index_->Find(entry) : -1;
    if (chunk >= 0 && e >= 0) {
      f.region = RegionToString(manifest_.entries[e].chunks[chunk].region);
    }
    f.message = std::move(message);
    findings_.Add(std::move(f));
  }

  absl::StatusOr<std::string> Resolve();
  std::string ResolveLatest(const core::RootListing& root);
  absl::Status CheckCheckpoint(const std::string& dir);
  absl::StatusOr<bool> ReadManifest(const std::string& mpath);
  void CheckCoverage(const std::string& mpath);
  void OpenShard(size_t i);
  void MatchChunks(OpenedShard& s, uint32_t shard_id);
  void CheckChunklessEntries(const std::vector<OpenedShard*>& opened);

  const ValidateOptions& options_;
  ValidateReport* report_;
  Storage* storage_;
  int threads_;
  FindingList findings_;
  format::Manifest manifest_;
  std::unique_ptr<core::ManifestIndex> index_;        // over manifest_
  std::vector<std::unique_ptr<OpenedShard>> shards_;  // null: failed to open
};

// A checkpoint directory is returned as is. A root is checked (latest,
// stray temporary entries) and resolved by ResolveLatest ("" if there is
// nothing to validate under it).
absl::StatusOr<std::string> Validator::Resolve() {
  const std::string& path = options_.path;
  CKPT_ASSIGN_OR_RETURN(bool is_checkpoint,
                        core::IsCheckpointDir(storage_, path));
  if (is_checkpoint) return path;
  CKPT_ASSIGN_OR_RETURN(core::RootListing root, core::ListRoot(storage_, path));
  if (!root.has_latest && root.committed.empty() && root.temps.empty()) {
    return core::NotACheckpoint(path);
  }
  report_->root = path;
  for (const std::string& t : root.temps) {
    auto info = storage_->Stat(JoinPath(path, t));
    bool dir = info.ok() && info->is_dir;
    Add(Severity::kWarning, JoinPath(path, t),
        absl::StrCat("stray temporary ", dir ? "directory" : "file",
                     " left by an interrupted save; delete it if no save is "
                     "running"));
  }
  return ResolveLatest(root);
}

// The checkpoint `latest` names or, when it is broken (an error finding),
// the newest committed one; "" if none.
std::string Validator::ResolveLatest(const core::RootListing& root) {
  const std::string& path = options_.path;
  std::string problem = "missing";
  if (root.has_latest) {
    auto dir = core::FollowLatest(storage_, path);
    if (dir.ok() && dir->has_value()) return JoinPath(path, **dir);
    if (!dir.ok()) problem = std::string(dir.status().message());
  }
  std::string target;
  if (!root.committed.empty()) {
    const std::string& newest =
        std::max_element(root.committed.begin(), root.committed.end())->second;
    target = JoinPath(path, newest);
    absl::StrAppend(&problem, "; validating ", newest,
                    ", the newest committed checkpoint, instead");
  } else {
    absl::StrAppend(&problem, "; there is no committed checkpoint to validate");
  }
  Add(Severity::kError, JoinPath(path, format::kLatestFileName), problem);
  return target;
}

// Reads and decodes the manifest into manifest_ and the report. Returns
// false when it does not read or decode (a finding, and the checkpoint is
// not checked further); a newer format version is the error returned.
absl::StatusOr<bool> Validator::ReadManifest(const std::string& mpath) {
  auto bytes = storage_->ReadFile(mpath);
  if (!bytes.ok()) {
    Add(Severity::kError, mpath, std::string(bytes.status().message()));
    return false;
  }
  auto m = format::DecodeManifest(*bytes);
  if (!m.ok()) {
    if (absl::IsFailedPrecondition(m.status()))
      return Annotate(m.status(), mpath);
    Add(Severity::kError, mpath, std::string(m.status().message()));
    return false;
  }
  *bytes = std::string();  // decoded: the records are all that is needed
  manifest_ = *std::move(m);
  index_ = std::make_unique<core::ManifestIndex>(manifest_);
  report_->manifest_ok = true;
  report_->format_minor = manifest_.minor_version;
  report_->info = manifest_.info;
  report_->shards = manifest_.shards.size();
  report_->entries = manifest_.entries.size();
  for (const EntryRecord& entry : manifest_.entries) {
    report_->chunks += entry.chunks.size();
    for (const ChunkRecord& c : entry.chunks) {
      report_->payload_bytes += c.stored_length;
    }
  }
  return true;
}

// The manifest, then every shard on its own, then (unless quick) the
// payload of the shards that opened.
absl::Status Validator::CheckCheckpoint(const std::string& dir) {
  report_->checkpoint_dir = dir;
  const std::string mpath = JoinPath(dir, format::kManifestFileName);
  CKPT_ASSIGN_OR_RETURN(bool manifest_ok, ReadManifest(mpath));
  if (!manifest_ok) return absl::OkStatus();
  CheckCoverage(mpath);
  shards_.resize(manifest_.shards.size());
  (void)::ckpt::internal::ParallelFor(threads_, shards_.size(),
                                      [&](int, size_t i) {
                                        OpenShard(i);
                                        return absl::OkStatus();
                                      });
  std::vector<OpenedShard*> opened;
  for (auto& s : shards_) {
    if (s != nullptr) opened.push_back(s.get());
  }
  report_->shards_ok = opened.size();
  CheckChunklessEntries(opened);
  if (!options_.quick) {
    internal::PayloadResult r = internal::ScanPayload(
        options_, manifest_, opened, threads_, &findings_);
    report_->blocks_verified = r.blocks_verified;
    report_->bytes_verified = r.bytes_verified;
  }
  return absl::OkStatus();
}

// Every entry on its own, so that each bad entry is reported.
void Validator::CheckCoverage(const std::string& mpath) {
  (void)::ckpt::internal::ParallelFor(
      threads_, manifest_.entries.size(), [&](int, size_t e) {
        const EntryRecord& entry = manifest_.entries[e];
        absl::Status s = format::CheckEntryCover(entry);
        if (!s.ok()) AddEntry(mpath, entry.name, -1, std::string(s.message()));
        return absl::OkStatus();
      });
}

// Opens shard i on its own (§5.6): a problem that leaves the file unusable
// is reported once and the shard is left out of the payload scan.
void Validator::OpenShard(size_t i) {
  const format::ShardInfo& info = manifest_.shards[i];
  auto s = std::make_unique<OpenedShard>();
  s->path = JoinPath(report_->checkpoint_dir, info.file_name);
  auto file = core::OpenShardFile(storage_, s->path, info, manifest_.info.id);
  if (!file.ok()) return AddIfError(s->path, file.status());
  s->file = *std::move(file);
  s->file.meta = {};  // decoded; only a cooperative load shares the bytes
  AddIfError(s->path, core::CheckIndexInfo(s->file.index, manifest_));
  AddIfError(s->path, core::CheckIndexMetadata(s->file.index, manifest_));
  MatchChunks(*s, info.shard_id);
  shards_[i] = std::move(s);
}

// §8.6 and §5.2: the chunks of the index against the manifest's, each
// disagreement a finding; the matched chunks go to the payload scan.
void Validator::MatchChunks(OpenedShard& s, uint32_t shard_id) {
  std::vector<core::IndexProblem> problems;
  s.chunks = core::MatchIndexChunks(*index_, shard_id, s.file.index, &problems);
  core::FindPayloadOverlaps(manifest_, s.chunks, &problems);
  for (core::IndexProblem& p : problems) {
    AddEntry(s.path, p.entry, p.chunk, std::move(p.message));
  }
}

// §5.7, judged only when every shard opened (a shard that did not may be
// the one listing the entry, and it is already reported).
void Validator::CheckChunklessEntries(const std::vector<OpenedShard*>& opened) {
  if (opened.size() != manifest_.shards.size()) return;
  std::vector<const format::ShardIndex*> indexes;
  for (const OpenedShard* s : opened) indexes.push_back(&s->file.index);
  for (uint32_t e : core::UnindexedChunklessEntries(manifest_, indexes)) {
    AddEntry(report_->checkpoint_dir, manifest_.entries[e].name, -1,
             std::string(core::ChunklessEntryNotIndexed().message()));
  }
}

}  // namespace

absl::string_view SeverityName(Severity s) {
  return s == Severity::kWarning ? "warning" : "error";
}

std::string FindingText(const Finding& f) {
  std::string where =
      core::LocationText(f.file, f.entry, f.chunk, f.region, f.block);
  return format::EscapeText(
      where.empty() ? f.message : absl::StrCat(where, ": ", f.message));
}

size_t ValidateReport::errors() const {
  return std::count_if(findings.begin(), findings.end(), [](const Finding& f) {
    return f.severity == Severity::kError;
  });
}

size_t ValidateReport::warnings() const { return findings.size() - errors(); }

absl::StatusOr<ValidateReport> Validate(const ValidateOptions& options) {
  if (options.quick && options.check_finite) {
    return absl::InvalidArgumentError(
        "--quick reads no payload, so it cannot be combined with "
        "--check-finite");
  }
  auto start = std::chrono::steady_clock::now();
  ValidateReport report;
  report.quick = options.quick;
  report.check_finite = options.check_finite;
  report.strict = options.strict;
  Validator v(options, &report);
  CKPT_RETURN_IF_ERROR(v.Run());
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return report;
}

}  // namespace ckpt::ops

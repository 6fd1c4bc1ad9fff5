#include "tools/validate/validate.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "format/format_constants.h"
#include "format/geometry.h"
#include "format/latest.h"
#include "format/manifest.h"
#include "format/shard.h"
#include "format/status_macros.h"
#include "libckpt/thread_pool.h"
#include "nlohmann/json.hpp"
#include "tools/common/tool_util.h"
#include "tools/validate/validate_internal.h"

namespace ckpt::tools {

using format::ChunkRecord;
using format::EntryRecord;
using internal::ChunkRef;
using internal::FindingList;
using internal::OpenedShard;

namespace internal {

void FindingList::Add(Finding f) {
  absl::MutexLock l(&mu_);
  if (findings_.size() >= max_) {
    ++dropped_;
    return;
  }
  findings_.push_back(std::move(f));
}

void FindingList::MoveTo(ValidateReport* report) {
  absl::MutexLock l(&mu_);
  auto key = [](const Finding& f) {
    return std::tie(f.file, f.entry, f.chunk, f.block, f.message);
  };
  std::sort(findings_.begin(), findings_.end(),
            [&](const Finding& a, const Finding& b) { return key(a) < key(b); });
  report->findings = std::move(findings_);
  report->findings_dropped = dropped_;
  findings_.clear();
}

}  // namespace internal

namespace {

// Region order for matching manifest chunks with index chunks.
bool RegionLess(const Region& a, const Region& b) {
  if (a.index() != b.index()) return a.index() < b.index();
  if (const Box* x = std::get_if<Box>(&a)) {
    const Box& y = std::get<Box>(b);
    return std::tie(x->offset, x->size) < std::tie(y.offset, y.size);
  }
  const FlatRange& x = std::get<FlatRange>(a);
  const FlatRange& y = std::get<FlatRange>(b);
  return std::tie(x.start, x.length) < std::tie(y.start, y.length);
}

// data_offset has no meaning for a chunk without stored bytes (§5.2).
uint64_t MatchOffset(const ChunkRecord& c) { return c.stored_length > 0 ? c.data_offset : 0; }

bool ChunkKeyLess(const ChunkRecord& a, const ChunkRecord& b) {
  if (MatchOffset(a) != MatchOffset(b)) return MatchOffset(a) < MatchOffset(b);
  return RegionLess(a.region, b.region);
}

std::string EntryDescription(const EntryRecord& e) {
  return absl::StrCat(e.kind == format::EntryKind::kObject ? "object " : "tensor ",
                      DTypeName(e.dtype), " ", ShapeToString(e.shape),
                      (e.flags & format::kEntryFlagPartial) ? " partial" : "");
}

std::string CodecName(format::Codec c) { return c == format::Codec::kZstd ? "zstd" : "none"; }

// Fields of CHECKPOINT_INFO that differ, as "step 5 != 7, ..." (index value
// first).
std::string InfoDiff(const format::CheckpointInfo& index, const format::CheckpointInfo& m) {
  std::vector<std::string> d;
  if (index.id != m.id) {
    d.push_back(absl::StrCat("id ", format::IdToHex(index.id), " != ", format::IdToHex(m.id)));
  }
  if (index.step != m.step) d.push_back(absl::StrCat("step ", index.step, " != ", m.step));
  if (index.world_size != m.world_size) {
    d.push_back(absl::StrCat("world_size ", index.world_size, " != ", m.world_size));
  }
  if (index.created_unix_ns != m.created_unix_ns) {
    d.push_back(absl::StrCat("created_unix_ns ", index.created_unix_ns, " != ",
                             m.created_unix_ns));
  }
  if (index.fingerprint != m.fingerprint) d.push_back("fingerprint");
  if (index.writer != m.writer) {
    d.push_back(absl::StrCat("writer '", index.writer, "' != '", m.writer, "'"));
  }
  return absl::StrJoin(d, ", ");
}

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
  void AddChunk(const std::string& file, uint32_t e, int64_t chunk, std::string message) {
    Finding f;
    f.file = file;
    f.entry = manifest_.entries[e].name;
    f.chunk = chunk;
    if (chunk >= 0) f.region = RegionToString(manifest_.entries[e].chunks[chunk].region);
    f.message = std::move(message);
    findings_.Add(std::move(f));
  }

  absl::StatusOr<std::string> Resolve();
  absl::Status CheckCheckpoint(const std::string& dir);
  void CheckCoverage(const std::string& mpath);
  void OpenShard(size_t i, const std::vector<std::vector<ChunkRef>>& by_shard);
  void MatchChunks(OpenedShard& s, const std::vector<ChunkRef>& listed);

  const ValidateOptions& options_;
  ValidateReport* report_;
  Storage* storage_;
  int threads_;
  FindingList findings_;
  format::Manifest manifest_;
  absl::flat_hash_map<absl::string_view, uint32_t> entry_index_;
  std::vector<std::unique_ptr<OpenedShard>> shards_;  // null: failed to open
};

// A checkpoint directory is returned as is. A root is checked (latest,
// stray temporary entries) and resolved to the checkpoint that `latest`
// names or, when it is broken, to the newest committed one ("" if none).
absl::StatusOr<std::string> Validator::Resolve() {
  const std::string& path = options_.path;
  auto st = storage_->Stat(path);
  if (!st.ok()) {
    if (absl::IsNotFound(st.status())) {
      return absl::NotFoundError(absl::StrCat(path, ": no such checkpoint or checkpoint root"));
    }
    return st.status();
  }
  if (!st->is_dir) return absl::NotFoundError(absl::StrCat(path, ": not a directory"));
  if (storage_->Stat(JoinPath(path, format::kManifestFileName)).ok()) return path;

  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, storage_->List(path));
  bool has_latest = false;
  std::vector<std::pair<uint64_t, std::string>> committed;
  std::vector<std::string> temps;
  for (const std::string& n : names) {
    uint64_t step;
    if (n == format::kLatestFileName) {
      has_latest = true;
    } else if (absl::StartsWith(n, format::kTempDirPrefix)) {
      temps.push_back(n);
    } else if (format::ParseStepDirName(n, &step) &&
               storage_->Stat(JoinPath(JoinPath(path, n), format::kManifestFileName)).ok()) {
      committed.emplace_back(step, n);
    }
  }
  if (!has_latest && committed.empty() && temps.empty()) {
    return absl::NotFoundError(absl::StrCat(
        path, ": not a checkpoint (no MANIFEST) nor a checkpoint root (no 'latest')"));
  }
  report_->root = path;
  for (const std::string& t : temps) {
    auto info = storage_->Stat(JoinPath(path, t));
    bool dir = info.ok() && info->is_dir;
    Add(Severity::kWarning, JoinPath(path, t),
        absl::StrCat("stray temporary ", dir ? "directory" : "file",
                     " left by an interrupted save; delete it if no save is running"));
  }
  const std::string latest_path = JoinPath(path, format::kLatestFileName);
  std::string problem, target;
  if (has_latest) {
    auto bytes = storage_->ReadFile(latest_path);
    if (!bytes.ok()) {
      problem = std::string(bytes.status().message());
    } else {
      auto dir = format::DecodeLatest(*bytes);
      if (!dir.ok()) {
        absl::string_view msg = dir.status().message();
        absl::ConsumePrefix(&msg, "latest: ");
        problem = absl::StrCat("broken pointer: ", msg);
      } else if (!storage_->Stat(JoinPath(JoinPath(path, *dir), format::kManifestFileName)).ok()) {
        problem = absl::StrCat("points to '", *dir, "', which is not a committed checkpoint");
      } else {
        target = JoinPath(path, *dir);
      }
    }
  } else {
    problem = "missing";
  }
  if (!problem.empty()) {
    if (!committed.empty()) {
      const std::string& newest = std::max_element(committed.begin(), committed.end())->second;
      target = JoinPath(path, newest);
      absl::StrAppend(&problem, "; validating ", newest,
                      ", the newest committed checkpoint, instead");
    } else {
      absl::StrAppend(&problem, "; there is no committed checkpoint to validate");
    }
    Add(Severity::kError, latest_path, problem);
  }
  return target;
}

absl::Status Validator::CheckCheckpoint(const std::string& dir) {
  report_->checkpoint_dir = dir;
  const std::string mpath = JoinPath(dir, format::kManifestFileName);
  auto bytes = storage_->ReadFile(mpath);
  if (!bytes.ok()) {
    Add(Severity::kError, mpath, std::string(bytes.status().message()));
    return absl::OkStatus();
  }
  auto m = format::DecodeManifest(*bytes);
  if (!m.ok()) {
    if (absl::IsFailedPrecondition(m.status())) return Annotate(m.status(), mpath);
    Add(Severity::kError, mpath, std::string(m.status().message()));
    return absl::OkStatus();
  }
  manifest_ = *std::move(m);
  bytes->clear();
  bytes->shrink_to_fit();
  report_->manifest_ok = true;
  report_->format_minor = manifest_.minor_version;
  report_->info = manifest_.info;
  report_->shards = manifest_.shards.size();
  report_->entries = manifest_.entries.size();
  std::vector<std::vector<ChunkRef>> by_shard(manifest_.info.world_size);
  for (size_t e = 0; e < manifest_.entries.size(); ++e) {
    const EntryRecord& entry = manifest_.entries[e];
    entry_index_[entry.name] = static_cast<uint32_t>(e);
    report_->chunks += entry.chunks.size();
    for (size_t c = 0; c < entry.chunks.size(); ++c) {
      report_->payload_bytes += entry.chunks[c].stored_length;
      // DecodeManifest guarantees shard < world_size.
      by_shard[entry.chunks[c].shard].push_back(
          ChunkRef{static_cast<uint32_t>(e), static_cast<uint32_t>(c), nullptr});
    }
  }

  CheckCoverage(mpath);

  shards_.resize(manifest_.shards.size());
  (void)::ckpt::internal::ParallelFor(threads_, shards_.size(), [&](int, size_t i) {
    OpenShard(i, by_shard);
    return absl::OkStatus();
  });
  std::vector<OpenedShard*> opened;
  for (auto& s : shards_) {
    if (s != nullptr) opened.push_back(s.get());
  }
  report_->shards_ok = opened.size();
  if (!options_.quick) {
    internal::PayloadResult r =
        internal::ScanPayload(options_, manifest_, opened, threads_, &findings_);
    report_->blocks_verified = r.blocks_verified;
    report_->bytes_verified = r.bytes_verified;
  }
  return absl::OkStatus();
}

// Every entry on its own, so that each bad entry is reported.
void Validator::CheckCoverage(const std::string& mpath) {
  (void)::ckpt::internal::ParallelFor(threads_, manifest_.entries.size(), [&](int, size_t e) {
    const EntryRecord& entry = manifest_.entries[e];
    std::vector<Region> regions;
    regions.reserve(entry.chunks.size());
    for (const ChunkRecord& c : entry.chunks) regions.push_back(c.region);
    absl::Status s =
        CheckCover(entry.shape, regions, (entry.flags & format::kEntryFlagPartial) != 0);
    if (!s.ok()) AddChunk(mpath, static_cast<uint32_t>(e), -1, std::string(s.message()));
    return absl::OkStatus();
  });
}

// Opens shard i on its own (§5.6): a problem is reported once and the shard
// is left out of the payload scan.
void Validator::OpenShard(size_t i, const std::vector<std::vector<ChunkRef>>& by_shard) {
  const format::ShardInfo& info = manifest_.shards[i];
  auto s = std::make_unique<OpenedShard>();
  s->path = JoinPath(report_->checkpoint_dir, info.file_name);
  auto fail = [&](absl::string_view msg) { Add(Severity::kError, s->path, std::string(msg)); };
  auto file = storage_->Open(s->path, OpenMode::kRead);
  if (!file.ok()) {
    if (absl::IsNotFound(file.status())) {
      return fail(absl::StrCat("shard file is missing (shard ", info.shard_id,
                               " in the manifest)"));
    }
    return fail(file.status().message());
  }
  s->file = *std::move(file);
  auto size = s->file->Size();
  if (!size.ok()) return fail(size.status().message());
  auto read = [&](uint64_t offset, uint64_t n) -> absl::StatusOr<std::string> {
    std::string buf(n, '\0');
    CKPT_ASSIGN_OR_RETURN(size_t got, s->file->PRead(offset, n, buf.data()));
    buf.resize(got);
    return buf;
  };
  auto head = read(0, std::min<uint64_t>(*size, format::kShardHeaderSize));
  if (!head.ok()) return fail(head.status().message());
  auto header = format::DecodeShardHeader(*head);
  if (!header.ok()) return fail(header.status().message());
  if (header->checkpoint_id != manifest_.info.id) {
    return fail(absl::StrCat("checkpoint id ", format::IdToHex(header->checkpoint_id),
                             " != manifest's ", format::IdToHex(manifest_.info.id),
                             ": this shard belongs to another checkpoint"));
  }
  if (header->shard_id != info.shard_id) {
    return fail(absl::StrCat("shard id ", header->shard_id, " != ", info.shard_id,
                             " in the manifest"));
  }
  if (*size != info.file_size) {
    return fail(absl::StrCat("file is ", *size, " bytes, the manifest says ", info.file_size,
                             *size < info.file_size ? " (truncated)" : " (extended)"));
  }
  // file_size >= 96 (DecodeManifest checks it), so the tail is in the file.
  auto tail_bytes = read(*size - format::kShardTailSize, format::kShardTailSize);
  if (!tail_bytes.ok()) return fail(tail_bytes.status().message());
  auto tail = format::DecodeShardTail(*tail_bytes, *size);
  if (!tail.ok()) return fail(tail.status().message());
  auto index_bytes = read(tail->index_offset, tail->index_length);
  if (!index_bytes.ok()) return fail(index_bytes.status().message());
  auto index = format::DecodeShardIndex(*index_bytes, *header, *tail);
  if (!index.ok()) return fail(index.status().message());
  s->index = *std::move(index);
  if (!(s->index.info == manifest_.info)) {
    fail(absl::StrCat("CHECKPOINT_INFO differs from the manifest's: ",
                      InfoDiff(s->index.info, manifest_.info), " (index != manifest)"));
  }
  if (!s->index.metadata.empty() && s->index.metadata != manifest_.metadata) {
    fail(absl::StrCat("METADATA differs from the manifest's (", s->index.metadata.size(),
                      " pairs in the index, ", manifest_.metadata.size(), " in the manifest)"));
  }
  MatchChunks(*s, by_shard[info.shard_id]);
  shards_[i] = std::move(s);
}

// §8.6: every manifest chunk of this shard is in the index, with the same
// fields, and every index chunk is in the manifest. Also §5.2: payloads do
// not overlap.
void Validator::MatchChunks(OpenedShard& s, const std::vector<ChunkRef>& listed) {
  // Index entries by manifest entry index.
  absl::flat_hash_map<uint32_t, const EntryRecord*> index_of;
  absl::flat_hash_map<uint32_t, bool> bad_entry;
  for (const EntryRecord& ie : s.index.entries) {
    auto it = entry_index_.find(ie.name);
    if (it == entry_index_.end()) {
      Finding f;
      f.file = s.path;
      f.entry = ie.name;
      f.message = absl::StrCat("entry is in the shard index (", ie.chunks.size(),
                               " chunks) but not in the manifest");
      findings_.Add(std::move(f));
      continue;
    }
    const EntryRecord& me = manifest_.entries[it->second];
    if (ie.kind != me.kind || ie.dtype != me.dtype || ie.flags != me.flags ||
        ie.shape != me.shape) {
      AddChunk(s.path, it->second, -1,
               absl::StrCat("the shard index has ", EntryDescription(ie),
                            ", the manifest has ", EntryDescription(me)));
      bad_entry[it->second] = true;
      continue;
    }
    index_of[it->second] = &ie;
  }
  absl::flat_hash_map<uint32_t, bool> seen;
  std::vector<ChunkRef> mine;
  std::vector<const ChunkRecord*> theirs;
  for (size_t a = 0; a < listed.size();) {
    const uint32_t e = listed[a].entry;
    size_t b = a;
    while (b < listed.size() && listed[b].entry == e) ++b;
    seen[e] = true;
    const EntryRecord& me = manifest_.entries[e];
    auto it = index_of.find(e);
    if (it == index_of.end()) {
      if (!bad_entry.contains(e)) {
        AddChunk(s.path, e, listed[a].chunk,
                 absl::StrCat("the manifest stores ", b - a, " chunk(s) of this entry in ",
                              "this shard, but the shard index does not list the entry"));
      }
      a = b;
      continue;
    }
    const EntryRecord& ie = *it->second;
    mine.assign(listed.begin() + a, listed.begin() + b);
    theirs.clear();
    for (const ChunkRecord& c : ie.chunks) theirs.push_back(&c);
    // Writers list a shard's chunks in the same order in both places; sort
    // only when they do not.
    bool same_order = mine.size() == theirs.size();
    for (size_t k = 0; same_order && k < mine.size(); ++k) {
      const ChunkRecord& mc = me.chunks[mine[k].chunk];
      same_order = MatchOffset(mc) == MatchOffset(*theirs[k]) && mc.region == theirs[k]->region;
    }
    if (!same_order) {
      std::sort(mine.begin(), mine.end(), [&](const ChunkRef& x, const ChunkRef& y) {
        return ChunkKeyLess(me.chunks[x.chunk], me.chunks[y.chunk]);
      });
      std::sort(theirs.begin(), theirs.end(), [](const ChunkRecord* x, const ChunkRecord* y) {
        return ChunkKeyLess(*x, *y);
      });
    }
    size_t i = 0, j = 0;
    auto unlisted = [&](const ChunkRecord& c) {
      AddChunk(s.path, e, -1,
               absl::StrCat("the shard index has a chunk ", RegionToString(c.region),
                            " at offset ", c.data_offset, " that the manifest does not list"));
    };
    while (i < mine.size() || j < theirs.size()) {
      if (!same_order && (j == theirs.size() || (i < mine.size() &&
                                                 ChunkKeyLess(me.chunks[mine[i].chunk],
                                                              *theirs[j])))) {
        const ChunkRecord& mc = me.chunks[mine[i].chunk];
        AddChunk(s.path, e, mine[i].chunk,
                 absl::StrCat("not in the shard index (the manifest puts it at offset ",
                              mc.data_offset, ", ", mc.stored_length, " bytes)"));
        ++i;
        continue;
      }
      if (!same_order &&
          (i == mine.size() || ChunkKeyLess(*theirs[j], me.chunks[mine[i].chunk]))) {
        unlisted(*theirs[j]);
        ++j;
        continue;
      }
      // Same key: the other fields must agree too.
      const ChunkRecord& mc = me.chunks[mine[i].chunk];
      const ChunkRecord& ic = *theirs[j];
      if (mc.stored_length == ic.stored_length && mc.codec == ic.codec &&
          mc.block_size == ic.block_size) {
        s.chunks.push_back(ChunkRef{e, mine[i].chunk, &ic});
      } else {
        std::vector<std::string> d;
        if (mc.stored_length != ic.stored_length) {
          d.push_back(absl::StrCat("stored_length ", ic.stored_length, " != ",
                                   mc.stored_length));
        }
        if (mc.codec != ic.codec) {
          d.push_back(absl::StrCat("codec ", CodecName(ic.codec), " != ", CodecName(mc.codec)));
        }
        if (mc.block_size != ic.block_size) {
          d.push_back(absl::StrCat("block_size ", ic.block_size, " != ", mc.block_size));
        }
        AddChunk(s.path, e, mine[i].chunk,
                 absl::StrCat("the shard index differs from the manifest: ",
                              absl::StrJoin(d, ", "), " (index != manifest)"));
      }
      ++i;
      ++j;
    }
    a = b;
  }
  // Index entries of which the manifest puts no chunk in this shard.
  for (const auto& [e, ie] : index_of) {
    if (seen.contains(e)) continue;
    for (const ChunkRecord& c : ie->chunks) {
      AddChunk(s.path, e, -1,
               absl::StrCat("the shard index has a chunk ", RegionToString(c.region),
                            " at offset ", c.data_offset, " that the manifest does not list"));
    }
  }
  // Payload ranges must not overlap (§5.2).
  std::sort(s.chunks.begin(), s.chunks.end(), [](const ChunkRef& x, const ChunkRef& y) {
    return x.indexed->data_offset < y.indexed->data_offset;
  });
  const ChunkRef* prev = nullptr;
  for (const ChunkRef& r : s.chunks) {
    if (r.indexed->stored_length == 0) continue;
    if (prev != nullptr &&
        prev->indexed->data_offset + prev->indexed->stored_length > r.indexed->data_offset) {
      AddChunk(s.path, r.entry, r.chunk,
               absl::StrCat("payload at offset ", r.indexed->data_offset,
                            " overlaps that of chunk ", prev->chunk, " of '",
                            manifest_.entries[prev->entry].name, "' (offset ",
                            prev->indexed->data_offset, ", ", prev->indexed->stored_length,
                            " bytes)"));
    }
    if (prev == nullptr || r.indexed->data_offset + r.indexed->stored_length >
                               prev->indexed->data_offset + prev->indexed->stored_length) {
      prev = &r;
    }
  }
}

}  // namespace

absl::string_view SeverityName(Severity s) {
  return s == Severity::kWarning ? "warning" : "error";
}

std::string FindingText(const Finding& f) {
  std::string out = f.file;
  std::string where;
  if (f.block >= 0) absl::StrAppend(&where, "block ", f.block, " of ");
  if (f.chunk >= 0) {
    absl::StrAppend(&where, "chunk ", f.chunk, f.region.empty() ? "" : " ", f.region, " of ");
  }
  if (!f.entry.empty()) {
    absl::StrAppend(&where, where.empty() ? "entry '" : "'", EscapeName(f.entry), "'");
  }
  if (!where.empty()) absl::StrAppend(&out, out.empty() ? "" : ": ", where);
  absl::StrAppend(&out, out.empty() ? "" : ": ", f.message);
  return out;
}

std::string EscapeName(absl::string_view name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f) {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", c));
    } else if (c == 0xc2 && i + 1 < name.size() &&
               static_cast<unsigned char>(name[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(name[i + 1]) <= 0x9f) {
      // A C1 control character (U+0080..U+009F), valid in names (§11).
      absl::StrAppend(&out, absl::StrFormat("\\u%04x", static_cast<unsigned char>(name[++i])));
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

size_t ValidateReport::errors() const {
  return std::count_if(findings.begin(), findings.end(),
                       [](const Finding& f) { return f.severity == Severity::kError; });
}

size_t ValidateReport::warnings() const { return findings.size() - errors(); }

absl::StatusOr<ValidateReport> Validate(const ValidateOptions& options) {
  if (options.quick && options.check_finite) {
    return absl::InvalidArgumentError(
        "--quick reads no payload, so it cannot be combined with --check-finite");
  }
  auto start = std::chrono::steady_clock::now();
  ValidateReport report;
  report.quick = options.quick;
  report.check_finite = options.check_finite;
  Validator v(options, &report);
  CKPT_RETURN_IF_ERROR(v.Run());
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

void PrintValidateText(const ValidateReport& r, std::ostream& out) {
  if (!r.root.empty()) out << "Root        " << r.root << "\n";
  out << "Checkpoint  " << (r.checkpoint_dir.empty() ? "(none)" : r.checkpoint_dir) << "\n";
  if (r.manifest_ok) {
    out << "Step        " << r.info.step << "\n";
    out << "World size  " << r.info.world_size << "\n";
    out << "Entries     " << r.entries << " (" << r.chunks << " chunks, "
        << HumanBytes(r.payload_bytes) << " stored)\n";
    std::string checked = absl::StrCat("manifest, coverage of ", r.entries, " entries, ",
                                       r.shards_ok, " of ", r.shards, " shard files");
    if (r.quick) {
      absl::StrAppend(&checked, "; payload not read (--quick)");
    } else {
      absl::StrAppend(&checked, ", ", r.blocks_verified, " blocks (",
                      HumanBytes(r.bytes_verified), ") read and verified");
      if (r.check_finite) absl::StrAppend(&checked, ", values checked for NaN/Inf");
    }
    out << "Checked     " << checked << "\n";
  }
  for (const Finding& f : r.findings) {
    out << SeverityName(f.severity) << ": " << FindingText(f) << "\n";
  }
  if (r.findings_dropped > 0) {
    out << "... and " << r.findings_dropped << " more problems not listed\n";
  }
  if (r.valid()) {
    out << "VALID: no problems found\n";
  } else {
    const uint64_t total = r.findings.size() + r.findings_dropped;
    out << "INVALID: " << total << (total == 1 ? " problem" : " problems") << " ("
        << r.errors() << (r.errors() == 1 ? " error, " : " errors, ") << r.warnings()
        << (r.warnings() == 1 ? " warning" : " warnings")
        << (r.findings_dropped > 0 ? " listed" : "") << ")\n";
  }
}

void PrintValidateJson(const ValidateReport& r, std::ostream& out) {
  using json = nlohmann::ordered_json;
  json j;
  j["valid"] = r.valid();
  j["root"] = r.root.empty() ? json(nullptr) : json(r.root);
  j["checkpoint"] = r.checkpoint_dir.empty() ? json(nullptr) : json(r.checkpoint_dir);
  if (r.manifest_ok) {
    j["format_version"] = absl::StrCat(format::kFormatMajor, ".", r.format_minor);
    j["step"] = r.info.step;
    j["world_size"] = r.info.world_size;
    j["checkpoint_id"] = format::IdToHex(r.info.id);
  } else {
    j["format_version"] = j["step"] = j["world_size"] = j["checkpoint_id"] = nullptr;
  }
  j["quick"] = r.quick;
  j["check_finite"] = r.check_finite;
  j["shards"] = r.shards;
  j["shards_ok"] = r.shards_ok;
  j["entries"] = r.entries;
  j["chunks"] = r.chunks;
  j["payload_bytes"] = r.payload_bytes;
  j["blocks_verified"] = r.blocks_verified;
  j["bytes_verified"] = r.bytes_verified;
  j["seconds"] = r.seconds;
  j["errors"] = r.errors();
  j["warnings"] = r.warnings();
  j["findings_dropped"] = r.findings_dropped;
  json list = json::array();
  for (const Finding& f : r.findings) {
    json x;
    x["severity"] = std::string(SeverityName(f.severity));
    x["file"] = f.file.empty() ? json(nullptr) : json(f.file);
    x["entry"] = f.entry.empty() ? json(nullptr) : json(f.entry);
    x["chunk"] = f.chunk < 0 ? json(nullptr) : json(f.chunk);
    x["region"] = f.region.empty() ? json(nullptr) : json(f.region);
    x["block"] = f.block < 0 ? json(nullptr) : json(f.block);
    x["message"] = f.message;
    x["text"] = FindingText(f);
    list.push_back(std::move(x));
  }
  j["findings"] = std::move(list);
  out << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
}

absl::StatusOr<int> RunValidate(const ValidateOptions& options, bool json, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(ValidateReport report, Validate(options));
  if (json) {
    PrintValidateJson(report, out);
  } else {
    PrintValidateText(report, out);
  }
  return report.valid() ? kExitOk : kExitFindings;
}

}  // namespace ckpt::tools

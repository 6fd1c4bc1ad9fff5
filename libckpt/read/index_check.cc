#include "read/index_check.h"

#include <algorithm>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "read/shard_file.h"

namespace ckpt::internal {
namespace {

using format::ChunkRecord;
using format::EntryRecord;

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

// data_offset has no meaning for a chunk without stored bytes (§8.6).
uint64_t MatchOffset(const ChunkRecord& c) {
  return c.stored_length > 0 ? c.data_offset : 0;
}

bool ChunkKeyLess(const ChunkRecord& a, const ChunkRecord& b) {
  if (MatchOffset(a) != MatchOffset(b)) return MatchOffset(a) < MatchOffset(b);
  return RegionLess(a.region, b.region);
}

bool SameKey(const ChunkRecord& a, const ChunkRecord& b) {
  return MatchOffset(a) == MatchOffset(b) && a.region == b.region;
}

std::string EntryDescription(const EntryRecord& e) {
  return absl::StrCat(
      e.kind == format::EntryKind::kObject ? "object " : "tensor ",
      DTypeName(e.dtype), " ", ShapeToString(e.shape),
      (e.flags & format::kEntryFlagPartial) ? " partial" : "");
}

std::string CodecName(format::Codec c) {
  return c == format::Codec::kZstd ? "zstd" : "none";
}

// The problems of one call, listed up to kMaxListedProblems and counted
// beyond, in one last problem: a hostile index must not make the list grow
// with the manifest's chunks (2^24 chunks missing from an index were 2^24
// messages, over 3 GB).
constexpr size_t kMaxListedProblems = 100;

class Problems {
 public:
  explicit Problems(std::vector<IndexProblem>* out)
      : out_(out), listed_(out->size()) {}
  ~Problems() {
    if (unlisted_ == 0) return;
    out_->push_back(IndexProblem{
        "", -1,
        absl::StrCat(unlisted_,
                     " more disagreements between the shard index and the "
                     "manifest are not listed")});
  }
  Problems(const Problems&) = delete;
  Problems& operator=(const Problems&) = delete;

  void Add(const std::string& entry, int64_t chunk, std::string message) {
    if (out_->size() - listed_ >= kMaxListedProblems) {
      ++unlisted_;
      return;
    }
    out_->push_back(IndexProblem{entry, chunk, std::move(message)});
  }

 private:
  std::vector<IndexProblem>* out_;
  size_t listed_;  // problems already there before this call
  uint64_t unlisted_ = 0;
};

void Add(Problems* problems, const std::string& entry, int64_t chunk,
         std::string message) {
  problems->Add(entry, chunk, std::move(message));
}

std::string UnlistedChunk(const ChunkRecord& c) {
  return absl::StrCat("the shard index has a chunk ", RegionToString(c.region),
                      " at offset ", c.data_offset,
                      " that the manifest does not list");
}

// The index entries that the manifest knows and describes alike, by
// manifest entry index; a problem for each of the others. `bad` receives
// the entries described differently (their chunks are not compared).
absl::flat_hash_map<uint32_t, const EntryRecord*> MapIndexEntries(
    const ManifestIndex& m, const format::ShardIndex& index,
    absl::flat_hash_set<uint32_t>* bad, Problems* problems) {
  absl::flat_hash_map<uint32_t, const EntryRecord*> out;
  for (const EntryRecord& ie : index.entries) {
    const int64_t e = m.Find(ie.name);
    if (e < 0) {
      Add(problems, ie.name, -1,
          absl::StrCat("entry is in the shard index (", ie.chunks.size(),
                       " chunks) but not in the manifest"));
      continue;
    }
    const EntryRecord& me = m.manifest().entries[e];
    if (ie.kind != me.kind || ie.dtype != me.dtype || ie.flags != me.flags ||
        ie.shape != me.shape) {
      Add(problems, me.name, -1,
          absl::StrCat("the shard index has ", EntryDescription(ie),
                       ", the manifest has ", EntryDescription(me)));
      bad->insert(static_cast<uint32_t>(e));
      continue;
    }
    out[static_cast<uint32_t>(e)] = &ie;
  }
  return out;
}

// Two chunks with the same key: the other fields must agree. Returns the
// differences, "" when none ("stored_length 5 != 7, ...", index first).
std::string ChunkFieldDiff(const ChunkRecord& ic, const ChunkRecord& mc) {
  std::vector<std::string> d;
  if (mc.stored_length != ic.stored_length) {
    d.push_back(absl::StrCat("stored_length ", ic.stored_length,
                             " != ", mc.stored_length));
  }
  if (mc.codec != ic.codec) {
    d.push_back(absl::StrCat("codec ", CodecName(ic.codec),
                             " != ", CodecName(mc.codec)));
  }
  if (mc.block_size != ic.block_size) {
    d.push_back(
        absl::StrCat("block_size ", ic.block_size, " != ", mc.block_size));
  }
  return absl::StrJoin(d, ", ");
}

// Merges the manifest chunks `mine` of entry `me` (index `e`) with the
// index chunks theirs(0 .. n_theirs - 1), both sorted by key (or in the
// same order): appends matches to `matched`, a problem for each chunk
// without a match or whose other fields differ.
void MergeEntryChunks(const EntryRecord& me, uint32_t e,
                      absl::FunctionRef<uint32_t(size_t)> mine, size_t n_mine,
                      absl::FunctionRef<const ChunkRecord*(size_t)> theirs,
                      size_t n_theirs, std::vector<ChunkRef>* matched,
                      Problems* problems) {
  auto mc = [&](size_t i) -> const ChunkRecord& { return me.chunks[mine(i)]; };
  size_t i = 0, j = 0;
  while (i < n_mine || j < n_theirs) {
    if (j == n_theirs || (i < n_mine && ChunkKeyLess(mc(i), *theirs(j)))) {
      Add(problems, me.name, mine(i),
          absl::StrCat(
              "not in the shard index (the manifest puts it at offset ",
              mc(i).data_offset, ", ", mc(i).stored_length, " bytes)"));
      ++i;
    } else if (i == n_mine || ChunkKeyLess(*theirs(j), mc(i))) {
      Add(problems, me.name, -1, UnlistedChunk(*theirs(j)));
      ++j;
    } else {
      std::string diff = ChunkFieldDiff(*theirs(j), mc(i));
      if (diff.empty()) {
        matched->push_back(ChunkRef{e, mine(i), theirs(j)});
      } else {
        Add(problems, me.name, mine(i),
            absl::StrCat("the shard index differs from the manifest: ", diff,
                         " (index != manifest)"));
      }
      ++i;
      ++j;
    }
  }
}

// Matches the manifest chunks `listed` of entry `me` (index `e`) with the
// chunks of its index entry `ie`: a merge by key, after sorting copies of
// both sides unless they are already in the same order (writers list a
// shard's chunks in the same order in both places; no copy is made then).
void MatchEntryChunks(const EntryRecord& me, uint32_t e,
                      absl::Span<const ChunkRef> listed, const EntryRecord& ie,
                      std::vector<ChunkRef>* matched, Problems* problems) {
  bool same_order = listed.size() == ie.chunks.size();
  for (size_t k = 0; same_order && k < listed.size(); ++k) {
    same_order = SameKey(me.chunks[listed[k].chunk], ie.chunks[k]);
  }
  if (same_order) {
    MergeEntryChunks(
        me, e, [&](size_t i) { return listed[i].chunk; }, listed.size(),
        [&](size_t j) { return &ie.chunks[j]; }, ie.chunks.size(), matched,
        problems);
    return;
  }
  // Chunk numbers (4 bytes each) rather than ChunkRefs (16).
  std::vector<uint32_t> mine(listed.size());
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = listed[i].chunk;
  std::sort(mine.begin(), mine.end(), [&](uint32_t x, uint32_t y) {
    return ChunkKeyLess(me.chunks[x], me.chunks[y]);
  });
  std::vector<const ChunkRecord*> theirs;
  theirs.reserve(ie.chunks.size());
  for (const ChunkRecord& c : ie.chunks) theirs.push_back(&c);
  std::sort(theirs.begin(), theirs.end(),
            [](const ChunkRecord* x, const ChunkRecord* y) {
              return ChunkKeyLess(*x, *y);
            });
  MergeEntryChunks(
      me, e, [&](size_t i) { return mine[i]; }, mine.size(),
      [&](size_t j) { return theirs[j]; }, theirs.size(), matched, problems);
}

}  // namespace

std::vector<ChunkRef> MatchIndexChunks(const ManifestIndex& m, uint32_t shard,
                                       const format::ShardIndex& shard_index,
                                       std::vector<IndexProblem>* out) {
  Problems problems(out);
  absl::flat_hash_set<uint32_t> bad;
  auto index_of = MapIndexEntries(m, shard_index, &bad, &problems);
  const std::vector<ChunkRef>& listed = m.ChunksOf(shard);
  absl::flat_hash_set<uint32_t> seen;
  std::vector<ChunkRef> matched;
  for (size_t a = 0, b = 0; a < listed.size(); a = b) {
    const uint32_t e = listed[a].entry;
    while (b < listed.size() && listed[b].entry == e) ++b;
    seen.insert(e);
    const EntryRecord& me = m.manifest().entries[e];
    auto it = index_of.find(e);
    if (it != index_of.end()) {
      MatchEntryChunks(me, e, absl::MakeConstSpan(listed).subspan(a, b - a),
                       *it->second, &matched, &problems);
    } else if (!bad.contains(e)) {
      Add(&problems, me.name, listed[a].chunk,
          absl::StrCat("the manifest stores ", b - a,
                       " chunk(s) of this entry in this shard, but the shard "
                       "index does not list the entry"));
    }
  }
  // Index entries of which the manifest puts no chunk in this shard.
  for (const EntryRecord& ie : shard_index.entries) {
    const int64_t e = m.Find(ie.name);
    if (e < 0 || seen.contains(e) || bad.contains(e)) continue;
    for (const ChunkRecord& c : ie.chunks) {
      Add(&problems, ie.name, -1, UnlistedChunk(c));
    }
  }
  std::sort(matched.begin(), matched.end(),
            [](const ChunkRef& x, const ChunkRef& y) {
              return x.indexed->data_offset < y.indexed->data_offset;
            });
  return matched;
}

void FindPayloadOverlaps(const format::Manifest& manifest,
                         const std::vector<ChunkRef>& matched,
                         std::vector<IndexProblem>* out) {
  Problems problems(out);
  const ChunkRef* prev = nullptr;  // the one reaching furthest so far
  auto end = [](const ChunkRef& r) {
    return r.indexed->data_offset + r.indexed->stored_length;
  };
  for (const ChunkRef& r : matched) {
    if (r.indexed->stored_length == 0) continue;
    if (prev != nullptr && end(*prev) > r.indexed->data_offset) {
      Add(&problems, manifest.entries[r.entry].name, r.chunk,
          absl::StrCat("payload at offset ", r.indexed->data_offset,
                       " overlaps that of chunk ", prev->chunk, " of '",
                       format::EscapeText(manifest.entries[prev->entry].name),
                       "' (offset ", prev->indexed->data_offset, ", ",
                       prev->indexed->stored_length, " bytes)"));
    }
    if (prev == nullptr || end(r) > end(*prev)) prev = &r;
  }
}

ManifestIndex::ManifestIndex(const format::Manifest& manifest)
    : manifest_(&manifest), by_shard_(manifest.info.world_size) {
  // Exact sizes first: no growth slack on top of 16 bytes a chunk.
  std::vector<uint64_t> count(by_shard_.size(), 0);
  for (const EntryRecord& entry : manifest.entries) {
    for (const format::ChunkRecord& c : entry.chunks) ++count[c.shard];
  }
  for (size_t s = 0; s < by_shard_.size(); ++s) by_shard_[s].reserve(count[s]);
  by_name_.reserve(manifest.entries.size());
  for (size_t e = 0; e < manifest.entries.size(); ++e) {
    const EntryRecord& entry = manifest.entries[e];
    by_name_[entry.name] = static_cast<uint32_t>(e);
    for (size_t c = 0; c < entry.chunks.size(); ++c) {
      // DecodeManifest guarantees shard < world_size.
      by_shard_[entry.chunks[c].shard].push_back(ChunkRef{
          static_cast<uint32_t>(e), static_cast<uint32_t>(c), nullptr});
    }
  }
}

int64_t ManifestIndex::Find(absl::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : static_cast<int64_t>(it->second);
}

const std::vector<ChunkRef>& ManifestIndex::ChunksOf(uint32_t shard) const {
  static const std::vector<ChunkRef> kNone;
  return shard < by_shard_.size() ? by_shard_[shard] : kNone;
}

absl::Status CheckIndexInfo(const format::ShardIndex& index,
                            const format::Manifest& manifest) {
  const format::CheckpointInfo& i = index.info;
  const format::CheckpointInfo& m = manifest.info;
  if (i == m) return absl::OkStatus();
  std::vector<std::string> d;
  if (i.id != m.id) {
    d.push_back(absl::StrCat("id ", format::IdToHex(i.id),
                             " != ", format::IdToHex(m.id)));
  }
  if (i.step != m.step)
    d.push_back(absl::StrCat("step ", i.step, " != ", m.step));
  if (i.world_size != m.world_size) {
    d.push_back(
        absl::StrCat("world_size ", i.world_size, " != ", m.world_size));
  }
  if (i.created_unix_ns != m.created_unix_ns) {
    d.push_back(absl::StrCat("created_unix_ns ", i.created_unix_ns,
                             " != ", m.created_unix_ns));
  }
  if (i.fingerprint != m.fingerprint) d.push_back("fingerprint");
  if (i.writer != m.writer) {
    d.push_back(absl::StrCat("writer '", format::EscapeText(i.writer), "' != '",
                             format::EscapeText(m.writer), "'"));
  }
  return absl::DataLossError(absl::StrCat(
      "CHECKPOINT_INFO differs from the manifest's: ", absl::StrJoin(d, ", "),
      " (index != manifest)"));
}

absl::Status CheckIndexMetadata(const format::ShardIndex& index,
                                const format::Manifest& manifest) {
  if (!index.metadata_present || index.metadata == manifest.metadata) {
    return absl::OkStatus();
  }
  return absl::DataLossError(absl::StrCat(
      "METADATA differs from the manifest's (", index.metadata.size(),
      " pairs in the index, ", manifest.metadata.size(), " in the manifest)"));
}

absl::StatusOr<std::vector<ChunkRef>> CheckShardIndex(
    const ManifestIndex& index, uint32_t shard, const std::string& path,
    const format::ShardIndex& shard_index) {
  const format::Manifest& m = index.manifest();
  CKPT_RETURN_IF_ERROR(Annotate(CheckIndexInfo(shard_index, m), path));
  CKPT_RETURN_IF_ERROR(Annotate(CheckIndexMetadata(shard_index, m), path));
  std::vector<IndexProblem> problems;
  std::vector<ChunkRef> matched =
      MatchIndexChunks(index, shard, shard_index, &problems);
  if (problems.empty()) return matched;
  const IndexProblem& p = problems[0];
  const int64_t e = index.Find(p.entry);
  const std::string region =
      e >= 0 && p.chunk >= 0
          ? RegionToString(m.entries[e].chunks[p.chunk].region)
          : "";
  return absl::DataLossError(absl::StrCat(
      LocationText(path, p.entry, p.chunk, region, -1), ": ", p.message));
}

absl::Status ChunklessEntryNotIndexed() {
  return absl::DataLossError(
      "has no chunk in any shard, and no shard index lists it with zero "
      "chunks (spec/FORMAT.md §5.7)");
}

std::vector<uint32_t> UnindexedChunklessEntries(
    const format::Manifest& manifest,
    const std::vector<const format::ShardIndex*>& indexes) {
  absl::flat_hash_set<absl::string_view> listed;
  for (const format::ShardIndex* index : indexes) {
    for (const EntryRecord& e : index->entries) listed.insert(e.name);
  }
  std::vector<uint32_t> out;
  for (size_t e = 0; e < manifest.entries.size(); ++e) {
    const EntryRecord& entry = manifest.entries[e];
    if (entry.chunks.empty() && !listed.contains(entry.name)) {
      out.push_back(static_cast<uint32_t>(e));
    }
  }
  return out;
}

}  // namespace ckpt::internal

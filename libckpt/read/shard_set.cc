#include "read/shard_set.h"

#include <algorithm>
#include <utility>

#include "ckpt/format/status_macros.h"
#include "util/parallel_for.h"

namespace ckpt::internal {

ShardSet::ShardSet(Storage* storage, std::string dir,
                   const ManifestIndex& index, bool direct_io,
                   int max_open_files)
    : storage_(storage),
      dir_(std::move(dir)),
      index_(index),
      direct_io_(direct_io),
      handles_(max_open_files) {
  for (const auto& s : index_.manifest().shards) shard_info_[s.shard_id] = &s;
}

OpenOptions ShardSet::FileOptions() const {
  OpenOptions oo;
  oo.direct = direct_io_;
  return oo;
}

absl::StatusOr<std::unique_ptr<OpenShard>> ShardSet::OpenAndCheck(uint32_t id) {
  const format::ShardInfo& info = *shard_info_.at(id);
  auto s = std::make_unique<OpenShard>();
  s->path = JoinPath(dir_, info.file_name);
  ShardHandles::Slot slot = handles_.Reserve();
  auto file = OpenShardFile(storage_, s->path, info, index_.manifest().info.id,
                            FileOptions());
  if (!file.ok()) return Annotate(file.status(), s->path);
  s->file = *std::move(file);
  slot.Fill(id, std::move(s->file.file));
  CKPT_RETURN_IF_ERROR(CheckIndex(id, s.get()));
  return s;
}

absl::Status ShardSet::CheckIndex(uint32_t id, OpenShard* s) const {
  CKPT_ASSIGN_OR_RETURN(std::vector<ChunkRef> matched,
                        CheckShardIndex(index_, id, s->path, s->file.index));
  for (const ChunkRef& r : matched) {
    s->indexed[ChunkKey(r.entry, r.chunk)] = r.indexed;
  }
  return absl::OkStatus();
}

absl::Status ShardSet::Adopt(uint32_t id, ShardMetaBytes meta) {
  {
    MutexLock l(&mu_);
    if (shards_.count(id) != 0) return absl::OkStatus();
  }
  const format::ShardInfo& info = *shard_info_.at(id);
  auto s = std::make_unique<OpenShard>();
  s->path = JoinPath(dir_, info.file_name);
  auto file = DecodeShardMeta(std::move(meta), info, index_.manifest().info.id);
  if (!file.ok()) return Annotate(file.status(), s->path);
  s->file = *std::move(file);
  CKPT_RETURN_IF_ERROR(CheckIndex(id, s.get()));
  MutexLock l(&mu_);
  shards_.emplace(id, std::move(s));
  return absl::OkStatus();
}

absl::StatusOr<ShardHandles::Lease> ShardSet::GetForReading(uint32_t id) {
  CKPT_ASSIGN_OR_RETURN(const OpenShard* s, Get(id));
  return handles_.Get(id, [&]() -> absl::StatusOr<std::unique_ptr<File>> {
    auto file =
        OpenShardHandle(storage_, s->path, *shard_info_.at(id), FileOptions());
    if (!file.ok()) return Annotate(file.status(), s->path);
    return file;
  });
}

absl::StatusOr<const OpenShard*> ShardSet::Get(uint32_t id) {
  {
    MutexLock l(&mu_);
    auto it = shards_.find(id);
    if (it != shards_.end()) return it->second.get();
  }
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<OpenShard> shard, OpenAndCheck(id));
  MutexLock l(&mu_);
  auto [it, inserted] = shards_.emplace(id, std::move(shard));
  return it->second.get();
}

absl::Status ShardSet::Open(const std::vector<uint32_t>& ids, int threads) {
  return ParallelFor(threads, ids.size(),
                     [&](int, size_t i) { return Get(ids[i]).status(); });
}

absl::Status ShardSet::CheckChunkless(const std::vector<uint32_t>& entries,
                                      int threads) {
  const format::Manifest& m = index_.manifest();
  auto no_chunks = [&](uint32_t e) { return m.entries[e].chunks.empty(); };
  if (std::none_of(entries.begin(), entries.end(), no_chunks)) {
    return absl::OkStatus();
  }
  std::vector<uint32_t> all;
  std::vector<const format::ShardIndex*> indexes;
  for (const format::ShardInfo& s : m.shards) all.push_back(s.shard_id);
  CKPT_RETURN_IF_ERROR(Open(all, threads));
  for (uint32_t id : all) indexes.push_back(&(*Get(id))->file.index);
  for (uint32_t e : UnindexedChunklessEntries(m, indexes)) {
    if (std::find(entries.begin(), entries.end(), e) == entries.end()) continue;
    return Annotate(ChunklessEntryNotIndexed(),
                    LocationText(dir_, m.entries[e].name, -1, "", -1));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::internal

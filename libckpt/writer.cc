#include "ckpt/writer.h"

#include <chrono>
#include <map>

#include <xxhash.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "format/coding.h"
#include "format/latest.h"
#include "format/manifest.h"
#include "format/names.h"
#include "format/plan_record.h"
#include "format/shard.h"
#include "format/status_macros.h"
#include "libckpt/commit.h"
#include "libckpt/save_plan.h"
#include "libckpt/shard_writer.h"
#include "libckpt/wire.h"

namespace ckpt {
namespace {

using internal::LocalItem;
using internal::LocalPlan;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

absl::Status ValidateOptions(const SaveOptions& o) {
  auto pow2 = [](uint64_t x) { return x != 0 && (x & (x - 1)) == 0; };
  if (!pow2(o.block_size) || o.block_size < format::kMinBlockSize ||
      o.block_size > format::kMaxBlockSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block_size ", o.block_size, " must be a power of two in [4096, 2^30]"));
  }
  if (!pow2(o.alignment) || o.alignment > format::kMaxAlignment) {
    return absl::InvalidArgumentError(
        absl::StrCat("alignment ", o.alignment, " must be a power of two <= 2^30"));
  }
  if (o.io_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("io_threads ", o.io_threads, " must be >= 1"));
  }
  if (o.codec != format::Codec::kNone && o.codec != format::Codec::kZstd) {
    return absl::InvalidArgumentError("unknown codec");
  }
  for (const auto& [k, v] : o.metadata) {
    CKPT_RETURN_IF_ERROR(format::ValidateMetadataKey(k));
    if (v.size() > format::kMaxMetadataValueLength) {
      return absl::InvalidArgumentError(absl::StrCat("metadata '", k, "': value of ", v.size(),
                                                     " bytes exceeds 1 MiB"));
    }
  }
  return absl::OkStatus();
}

class WriterImpl final : public Writer {
 public:
  explicit WriterImpl(const Options& o)
      : comm_(o.comm ? o.comm : &single_), storage_(o.storage ? o.storage : DefaultStorage()),
        device_memory_(o.device_memory) {}

  absl::Status AddTensor(const std::string& name, DType dtype, const Shape& shape,
                         const Region& local, const void* data,
                         const TensorOptions& options) override {
    CKPT_RETURN_IF_ERROR(format::ValidateEntryName(name));
    CKPT_RETURN_IF_ERROR(Annotate(ValidateShape(shape, DTypeSize(dtype)),
                                  absl::StrCat("entry '", name, "'")));
    CKPT_RETURN_IF_ERROR(Annotate(ValidateRegion(local, shape), absl::StrCat("entry '", name, "'")));
    if (data == nullptr && RegionElements(local) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("entry '", name, "': data is null"));
    }
    if (options.memory == MemoryKind::kCuda && device_memory_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "entry '", name, "' is in CUDA memory but Writer::Options::device_memory is not set"));
    }
    if (index_.contains(name)) {
      return absl::AlreadyExistsError(absl::StrCat("entry '", name, "' is already registered"));
    }
    Registered r;
    r.item.name = name;
    r.item.dtype = dtype;
    r.item.shape = shape;
    r.item.region = local;
    r.item.replica = options.replica;
    r.item.partial = options.partial;
    r.data = data;
    r.memory = options.memory;
    r.device = options.device;
    r.fp = internal::ItemFingerprint(r.item);
    index_[name] = items_.size();
    items_.push_back(std::move(r));
    return absl::OkStatus();
  }

  absl::Status AddTensorSource(const std::string& name, DType dtype, const Shape& shape,
                               const Region& local, TensorSource source,
                               const TensorOptions& options) override {
    if (!source) {
      return absl::InvalidArgumentError(absl::StrCat("entry '", name, "': source is empty"));
    }
    TensorOptions host = options;
    host.memory = MemoryKind::kHost;
    static const char kNonNull = 0;
    CKPT_RETURN_IF_ERROR(AddTensor(name, dtype, shape, local, &kNonNull, host));
    items_.back().source = std::move(source);
    items_.back().data = nullptr;
    return absl::OkStatus();
  }

  absl::Status SetObject(const std::string& name, std::string bytes) override {
    CKPT_RETURN_IF_ERROR(format::ValidateEntryName(name));
    auto it = index_.find(name);
    if (it != index_.end()) {
      Registered& r = items_[it->second];
      if (r.item.kind != format::EntryKind::kObject) {
        return absl::AlreadyExistsError(absl::StrCat("'", name, "' is registered as a tensor"));
      }
      r.bytes = std::move(bytes);
    } else {
      Registered r;
      r.item.name = name;
      r.item.kind = format::EntryKind::kObject;
      r.item.dtype = DType::kUInt8;
      r.bytes = std::move(bytes);
      r.fp = internal::ItemFingerprint(r.item);  // kind, dtype, name: not the size
      index_[name] = items_.size();
      items_.push_back(std::move(r));
    }
    Registered& r = items_[index_[name]];
    r.item.shape = {r.bytes.size()};
    r.item.region = FlatRange{0, r.bytes.size()};
    // No pointer into r.bytes is kept: a short string lives inside the
    // Registered record, which moves when items_ grows (Save takes it).
    return absl::OkStatus();
  }

  absl::Status Remove(const std::string& name) override {
    auto it = index_.find(name);
    if (it == index_.end()) {
      return absl::NotFoundError(absl::StrCat("entry '", name, "' is not registered"));
    }
    items_.erase(items_.begin() + it->second);
    index_.clear();
    for (size_t i = 0; i < items_.size(); ++i) index_[items_[i].item.name] = i;
    return absl::OkStatus();
  }

  void Clear() override {
    items_.clear();
    index_.clear();
  }

  absl::StatusOr<SaveResult> Save(const std::string& root, uint64_t step,
                                  const SaveOptions& options) override;

 private:
  struct Registered {
    LocalItem item;
    const void* data = nullptr;
    MemoryKind memory = MemoryKind::kHost;
    int device = 0;
    std::string bytes;  // objects only
    TensorSource source;  // AddTensorSource only
    format::Fingerprint fp{};  // internal::ItemFingerprint(item); sizes of objects excluded
  };

  // Rank 0 runs `fn`; its status (and payload) reach every rank.
  absl::StatusOr<std::string> OnCoordinator(
      absl::FunctionRef<absl::StatusOr<std::string>()> fn) {
    std::string msg;
    if (comm_->rank() == 0) msg = internal::EncodeStatusOr(fn());
    CKPT_RETURN_IF_ERROR(comm_->Broadcast(&msg, 0));
    return internal::DecodeStatusOr(msg);
  }

  // The plan of the last save, valid for exactly one local structure
  // (`local_fp`) on every rank of a world of `world` ranks.
  struct PlanCache {
    bool valid = false;
    int world = 0;
    format::Fingerprint local_fp{};
    std::vector<uint32_t> writes;  // positions in items_ this rank writes
    // Coordinator (rank 0) only: what the manifest records.
    format::Fingerprint global_fp{};
    std::string plan_section;  // PLAN section body
  };

  format::Fingerprint LocalFingerprint() const {
    return internal::CombineFingerprints(
        items_.size(), [&](size_t i) -> const format::Fingerprint& { return items_[i].fp; });
  }
  // Agrees across ranks whether the cached plan (or, with no cache, the one
  // recorded in the root's latest checkpoint) fits every rank's structure.
  absl::StatusOr<bool> TryCachedPlan(const std::string& root, const SaveOptions& options);
  // Full planning: gathers every local plan; the coordinator checks the
  // union and assigns writers; fills cache_.
  absl::Status Replan();
  // Adopts `record` as cache_ if it fits this rank; false otherwise.
  bool AdoptRecord(const format::PlanRecord& record, absl::string_view body,
                   const format::Fingerprint& local_fp);

  SingleProcessCommunicator single_;
  Communicator* comm_;
  Storage* storage_;
  DeviceMemory* device_memory_;
  std::vector<Registered> items_;
  absl::flat_hash_map<std::string, size_t> index_;
  PlanCache cache_;
};

format::Fingerprint GlobalFingerprint(const format::PlanRecord& record) {
  // Hash of the ranks' fingerprints in rank order.
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  for (const auto& r : record.ranks) XXH3_128bits_update(st, r.fingerprint.data(), 16);
  XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  format::Fingerprint fp;
  for (int i = 0; i < 8; ++i) {
    fp[i] = static_cast<uint8_t>(h.low64 >> (8 * i));
    fp[8 + i] = static_cast<uint8_t>(h.high64 >> (8 * i));
  }
  return fp;
}

bool WriterImpl::AdoptRecord(const format::PlanRecord& record, absl::string_view body,
                             const format::Fingerprint& local_fp) {
  const int rank = comm_->rank(), world = comm_->size();
  if (static_cast<int>(record.ranks.size()) != world) return false;
  const auto& mine = record.ranks[rank];
  if (mine.fingerprint != local_fp) return false;
  // The fingerprint covers the item count, but a cache is never trusted
  // further than it can be checked.
  for (uint32_t i : mine.writes) {
    if (i >= items_.size()) return false;
  }
  cache_.valid = true;
  cache_.world = world;
  cache_.local_fp = local_fp;
  cache_.writes = mine.writes;
  if (rank == 0) {
    cache_.global_fp = GlobalFingerprint(record);
    cache_.plan_section = std::string(body);
  }
  return true;
}

absl::StatusOr<bool> WriterImpl::TryCachedPlan(const std::string& root,
                                               const SaveOptions& options) {
  const format::Fingerprint fp = LocalFingerprint();
  const int world = comm_->size();
  std::vector<int64_t> flags = {
      (cache_.valid && cache_.world == world && cache_.local_fp == fp) ? 0 : 1,
      cache_.valid ? 0 : 1};
  CKPT_RETURN_IF_ERROR(comm_->AllReduceMax(&flags));
  if (flags[0] == 0) return true;
  if (flags[1] == 0 || !options.reuse_recorded_plan) {
    cache_.valid = false;
    return false;
  }
  // Some rank has no plan in memory (a restarted job): the root's latest
  // checkpoint may record one. Anything unreadable simply means a miss.
  std::string body;
  if (comm_->rank() == 0) {
    auto dir = internal::ResolveCheckpointDir(storage_, root);
    if (dir.ok()) {
      auto bytes = storage_->ReadFile(JoinPath(*dir, format::kManifestFileName));
      if (bytes.ok()) {
        auto m = format::DecodeManifest(*bytes);
        if (m.ok()) body = std::move(m->plan);
      }
    }
  }
  CKPT_RETURN_IF_ERROR(comm_->Broadcast(&body, 0));
  std::vector<int64_t> miss = {1};
  if (!body.empty()) {
    auto record = format::DecodePlanRecord(body);
    if (record.ok() && AdoptRecord(*record, body, fp)) miss[0] = 0;
  }
  CKPT_RETURN_IF_ERROR(comm_->AllReduceMax(&miss));
  if (miss[0] != 0) cache_.valid = false;
  return miss[0] == 0;
}

absl::Status WriterImpl::Replan() {
  cache_.valid = false;
  const int world = comm_->size();
  LocalPlan local;
  local.reserve(items_.size());
  for (const Registered& r : items_) local.push_back(r.item);
  const format::Fingerprint local_fp = LocalFingerprint();
  std::string mine(reinterpret_cast<const char*>(local_fp.data()), local_fp.size());
  mine += internal::EncodeLocalPlan(local);
  // Only the coordinator needs them (empty elsewhere).
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> plans, comm_->Gather(mine, 0));
  CKPT_ASSIGN_OR_RETURN(std::string body, OnCoordinator([&]() -> absl::StatusOr<std::string> {
    std::vector<LocalPlan> all(world);
    format::PlanRecord record;
    record.ranks.resize(world);
    for (int r = 0; r < world; ++r) {
      if (plans[r].size() < 16) return absl::InternalError("short local plan");
      std::copy(plans[r].begin(), plans[r].begin() + 16, record.ranks[r].fingerprint.begin());
      CKPT_ASSIGN_OR_RETURN(all[r], internal::DecodeLocalPlan(absl::string_view(plans[r]).substr(16)));
    }
    plans.clear();
    CKPT_ASSIGN_OR_RETURN(internal::GlobalPlan gp, internal::PlanSave(all));
    for (int r = 0; r < world; ++r) record.ranks[r].writes = std::move(gp.writes[r]);
    return format::EncodePlanRecord(record);
  }));
  CKPT_ASSIGN_OR_RETURN(format::PlanRecord record, format::DecodePlanRecord(body));
  if (!AdoptRecord(record, body, local_fp)) {
    return absl::InternalError("the coordinator's plan does not fit this rank's registrations");
  }
  return absl::OkStatus();
}

absl::StatusOr<SaveResult> WriterImpl::Save(const std::string& root, uint64_t step,
                                            const SaveOptions& options) {
  CKPT_RETURN_IF_ERROR(ValidateOptions(options));
  SaveResult result;
  auto t0 = std::chrono::steady_clock::now();
  const int rank = comm_->rank(), world = comm_->size();

  // 1. Plan. One small collective decides whether every rank's structure
  // is what the cached plan was made for; only then is it reused.
  CKPT_ASSIGN_OR_RETURN(bool hit, TryCachedPlan(root, options));
  if (!hit) CKPT_RETURN_IF_ERROR(Replan());
  result.plan_cache_hit = hit;
  result.plan_seconds = Seconds(t0);
  const format::Fingerprint fingerprint = cache_.global_fp;

  // 2. The coordinator creates the temporary directory and the id, under
  // the root's save lock (held until Save returns).
  std::unique_ptr<FileLock> save_lock;
  const std::string dir_name = format::StepDirName(step);
  const std::string final_dir = JoinPath(root, dir_name);
  CKPT_ASSIGN_OR_RETURN(std::string prep, OnCoordinator([&]() -> absl::StatusOr<std::string> {
    CKPT_RETURN_IF_ERROR(internal::EnsureRoot(storage_, root));
    CKPT_ASSIGN_OR_RETURN(save_lock, internal::LockRootForSave(storage_, root, nullptr));
    if (!options.overwrite && storage_->Stat(final_dir).ok()) {
      return absl::AlreadyExistsError(absl::StrCat(
          final_dir, ": a checkpoint of step ", step, " already exists (set overwrite to replace it)"));
    }
    CKPT_ASSIGN_OR_RETURN(std::string tmp, internal::CreateTempDir(storage_, root, step));
    // Everything of CHECKPOINT_INFO that is not known to every rank comes
    // from here, so that every shard index carries the manifest's (§7.1).
    auto id = internal::RandomId();
    std::string out(reinterpret_cast<const char*>(id.data()), id.size());
    out.append(reinterpret_cast<const char*>(fingerprint.data()), fingerprint.size());
    format::PutFixed64(&out, static_cast<uint64_t>(absl::GetCurrentTimeNanos()));
    return out + tmp;
  }));
  if (prep.size() < 40) return absl::InternalError("short commit preparation message");
  format::CheckpointInfo info;
  std::copy(prep.begin(), prep.begin() + 16, info.id.begin());
  std::copy(prep.begin() + 16, prep.begin() + 32, info.fingerprint.begin());
  info.created_unix_ns = static_cast<int64_t>(format::LoadFixed64(prep.data() + 32));
  const std::string tmp = prep.substr(40);
  info.step = step;
  info.world_size = world;
  info.writer = "ckpt " CKPT_VERSION_STRING;

  // 3. Every rank writes its shard file.
  auto t1 = std::chrono::steady_clock::now();
  std::vector<internal::WriteItem> writes;
  for (uint32_t i : cache_.writes) {
    const Registered& r = items_[i];
    const void* data = r.item.kind == format::EntryKind::kObject ? r.bytes.data() : r.data;
    writes.push_back(internal::WriteItem{&r.item, data, r.memory, r.device,
                                         r.source ? &r.source : nullptr});
  }
  format::ShardHeader header;
  header.checkpoint_id = info.id;
  header.shard_id = rank;
  header.alignment = options.alignment;
  auto written = internal::WriteShardFile(storage_, JoinPath(tmp, format::ShardFileName(rank)),
                                          header, info, options.metadata, writes, options,
                                          device_memory_);
  std::string report;
  if (written.ok()) {
    // Manifest view of this shard: entries without block tables.
    format::Manifest part;
    part.entries = written->index.entries;
    for (auto& e : part.entries)
      for (auto& c : e.chunks) c.blocks.clear();
    report = internal::EncodeStatusOr(absl::StatusOr<std::string>(
        internal::EncodeShardReport(written->file_size, part.entries)));
    result.local_stored_bytes = written->stored_bytes;
  } else {
    report = internal::EncodeStatusOr(absl::StatusOr<std::string>(
        Annotate(written.status(), absl::StrCat("rank ", rank))));
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> reports, comm_->Gather(report, 0));
  result.write_seconds = Seconds(t1);

  // 4. The coordinator commits only if every rank succeeded.
  auto t2 = std::chrono::steady_clock::now();
  CKPT_ASSIGN_OR_RETURN(std::string committed, OnCoordinator([&]() -> absl::StatusOr<std::string> {
    absl::Status status = [&]() -> absl::Status {
      format::Manifest m;
      m.info = info;
      m.metadata = options.metadata;
      std::map<std::string, format::EntryRecord> merged;
      uint64_t stored = 0;
      for (int r = 0; r < world; ++r) {
        CKPT_ASSIGN_OR_RETURN(std::string rep, internal::DecodeStatusOr(reports[r]));
        uint64_t file_size;
        std::vector<format::EntryRecord> entries;
        CKPT_RETURN_IF_ERROR(internal::DecodeShardReport(rep, &file_size, &entries));
        m.shards.push_back({static_cast<uint32_t>(r), format::ShardFileName(r), file_size});
        for (auto& e : entries) {
          for (const auto& c : e.chunks) stored += c.stored_length;
          auto [it, inserted] = merged.try_emplace(e.name, e);
          if (!inserted) {
            for (auto& c : e.chunks) it->second.chunks.push_back(std::move(c));
          }
        }
      }
      for (auto& [name, e] : merged) {
        for (const auto& c : e.chunks) {
          result.logical_bytes += RegionElements(c.region) * DTypeSize(e.dtype);
        }
        m.entries.push_back(std::move(e));
      }
      m.plan = cache_.plan_section;
      CKPT_RETURN_IF_ERROR(storage_->WriteFileAndSync(JoinPath(tmp, format::kManifestFileName),
                                                      format::EncodeManifest(m)));
      CKPT_RETURN_IF_ERROR(storage_->SyncDir(tmp));
      CKPT_ASSIGN_OR_RETURN(std::unique_ptr<FileLock> commit_lock,
                            internal::LockRootForCommit(storage_, root));
      CKPT_RETURN_IF_ERROR(internal::CommitDir(storage_, root, tmp, final_dir, options.overwrite));
      CKPT_RETURN_IF_ERROR(internal::UpdateLatest(storage_, root, dir_name, step));
      CKPT_RETURN_IF_ERROR(internal::PruneOld(storage_, root, options.keep_last));
      result.stored_bytes = stored;
      return absl::OkStatus();
    }();
    if (!status.ok()) {
      (void)storage_->RemoveAll(tmp);  // best effort; the error is what matters
      return status;
    }
    std::string out;
    format::PutVarint(&out, result.stored_bytes);
    format::PutVarint(&out, result.logical_bytes);
    return out;
  }));
  format::ByteReader br(committed);
  CKPT_ASSIGN_OR_RETURN(result.stored_bytes, br.ReadVarint("stored bytes"));
  CKPT_ASSIGN_OR_RETURN(result.logical_bytes, br.ReadVarint("logical bytes"));
  result.commit_seconds = Seconds(t2);
  result.path = final_dir;
  return result;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Writer>> Writer::Create(const Options& options) {
  return std::unique_ptr<Writer>(new WriterImpl(options));
}

}  // namespace ckpt

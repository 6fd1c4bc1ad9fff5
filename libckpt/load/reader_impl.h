// Internal to libckpt: the Reader's implementation, shared by reader.cc
// (opening, checks, single-rank loads) and coop_load.cc (cooperative
// loads over ReaderOptions::communicator).
#ifndef CKPT_LIBCKPT_LOAD_READER_IMPL_H_
#define CKPT_LIBCKPT_LOAD_READER_IMPL_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/reader.h"
#include "load/coop/coop_plan.h"
#include "load/coop_load.h"
#include "read/index_check.h"
#include "read/read_executor.h"
#include "read/read_plan.h"
#include "read/shard_file.h"
#include "read/shard_handles.h"
#include "staging/staging_pool.h"
#include "util/mutex.h"

namespace ckpt::internal {

using format::EntryRecord;

// Indexes of m.entries in name order (O(n) when already in name order, as
// ckpt's writers store them).
std::vector<uint32_t> NameOrder(const format::Manifest& m);

class ReaderImpl final : public Reader {
 public:
  ReaderImpl(Storage* storage, std::string dir, format::Manifest m,
             const ReaderOptions& o)
      : storage_(storage),
        dir_(std::move(dir)),
        manifest_(std::move(m)),
        options_(o),
        index_(manifest_),
        name_order_(NameOrder(manifest_)),
        handles_(o.max_open_files) {
    for (const auto& s : manifest_.shards) shard_info_[s.shard_id] = &s;
    description_.step = manifest_.info.step;
    description_.world_size = manifest_.info.world_size;
    description_.id = format::IdToHex(manifest_.info.id);
    description_.created_unix_ns = manifest_.info.created_unix_ns;
    description_.writer = manifest_.info.writer;
    description_.format_version =
        absl::StrCat(format::kFormatMajor, ".", manifest_.minor_version);
    description_.metadata = manifest_.metadata;
  }

  const std::string& path() const override { return dir_; }
  const CheckpointDescription& description() const override {
    return description_;
  }
  std::vector<EntryView> entries() const override {
    std::vector<EntryView> out;
    out.reserve(manifest_.entries.size());
    for (const EntryRecord& e : manifest_.entries) out.emplace_back(e);
    return out;
  }
  std::optional<EntryView> FindEntry(const std::string& name) const override {
    const EntryRecord* e = Find(name);
    if (e == nullptr) return std::nullopt;
    return EntryView(*e);
  }
  const format::Manifest& manifest() const override { return manifest_; }
  const EntryRecord* Find(const std::string& name) const override {
    const int64_t e = index_.Find(name);
    return e < 0 ? nullptr : &manifest_.entries[e];
  }

  // With ReaderOptions::communicator, LoadCooperative; else LoadLocal.
  absl::StatusOr<LoadReport> Load(const std::vector<LoadRequest>& requests,
                                  const LoadOptions& options) override;

  absl::StatusOr<std::string> ReadObject(const std::string& name) override {
    std::string out;
    LoadRequest r;
    r.name = name;
    r.object = &out;
    LoadOptions o;
    o.allow_unrequested = true;
    o.report_not_loaded = false;
    CKPT_RETURN_IF_ERROR(LoadLocal({r}, o).status());
    return out;
  }

 private:
  // This rank alone reads what it needs (the Reader without communicator).
  absl::StatusOr<LoadReport> LoadLocal(const std::vector<LoadRequest>& requests,
                                       const LoadOptions& options);
  // The ranks of options_.communicator read between them (coop_load.cc).
  absl::StatusOr<LoadReport> LoadCooperative(
      const std::vector<LoadRequest>& requests, const LoadOptions& options);

  // Shard `id`, opened and checked (OpenAndCheck) on first use, or adopted
  // from another rank's bytes (AdoptShard), in which case it has no file.
  absl::StatusOr<const OpenShard*> GetShard(uint32_t id);
  // The use of shard `id`'s file (opened, as GetShard does, if need be),
  // from handles_: hold it for the reads only.
  absl::StatusOr<ShardHandles::Lease> GetShardForReading(uint32_t id);
  // Opens the file in a slot of handles_, where it stays when it checks.
  absl::StatusOr<std::unique_ptr<OpenShard>> OpenAndCheck(uint32_t id);
  // The checks of OpenAndCheck after the shard file decoded: its index
  // against the manifest; fills s->indexed.
  absl::Status CheckIndex(uint32_t id, OpenShard* s) const;
  // Decodes and checks shard `id` from the bytes another rank read
  // (internal::DecodeShardMeta, CheckIndex), unless it is open already.
  absl::Status AdoptShard(uint32_t id, internal::ShardMetaBytes meta);
  // Cooperative load steps (coop_load.cc).
  absl::Status ShareShards(const std::vector<uint32_t>& ids, int threads);
  absl::StatusOr<LoadReport> RunCooperative(
      const Prepared& p, const internal::RequestGroups& groups,
      const internal::CoopPlan& plan, const LoadOptions& options, int threads,
      LoadReport report);
  // The upload pool when `p` has device destinations, else null; collective
  // (the ranks agree on the outcome).
  absl::StatusOr<internal::StagingPool*> AgreeOnUploadPool(const Prepared& p);
  // Runs `reads` (reads[i] of shard shards[i]) on `threads` threads.
  absl::Status RunReads(LoadRun* run, const std::vector<BlockRead>& reads,
                        const std::vector<uint32_t>& shards, int threads);
  // With a communicator that SharesAddressSpace (coop_direct.cc):
  // every rank's destinations as one list, or nullopt on every rank if some
  // rank has a destination that is not host memory. Collective (one AllGather).
  absl::StatusOr<std::optional<internal::AllDestinations>> ShareDestinations(
      const Prepared& p);
  // The cooperative load without exchange: each rank runs its reads of
  // `plan` with the copies going straight to `all`'s destinations, then
  // the ranks agree, and each calls its own requests' on_complete.
  absl::StatusOr<LoadReport> RunDirect(const Prepared& p,
                                       const internal::AllDestinations& all,
                                       const internal::RequestGroups& groups,
                                       const internal::CoopPlan& plan,
                                       int threads, LoadReport report);
  absl::Status OpenShards(const std::vector<uint32_t>& ids, int threads);
  absl::Status CheckRequest(const LoadRequest& r, const LoadOptions& o,
                            const EntryRecord** e);
  absl::StatusOr<Prepared> Prepare(const std::vector<LoadRequest>& requests,
                                   const LoadOptions& options,
                                   LoadReport* report);
  absl::Status CheckChunkless(const Prepared& p, int threads);
  int IoThreads(const LoadOptions& options) const;
  absl::StatusOr<internal::ReadPlan> Plan(const Prepared& p, int threads);
  absl::Status Execute(const internal::ReadPlan& plan, LoadRun* run,
                       int threads);
  // The pinned buffers of loads into device memory: made on first need and
  // kept for the Reader's lifetime.
  absl::StatusOr<internal::StagingPool*> UploadPool();

  Storage* storage_;
  std::string dir_;
  format::Manifest manifest_;
  ReaderOptions options_;
  internal::ManifestIndex index_;  // over manifest_
  // Indexes of manifest_.entries in name order: Prepare lists unrequested
  // entries in this order, so a report needs no sort per Load.
  const std::vector<uint32_t> name_order_;
  CheckpointDescription description_;
  absl::flat_hash_map<uint32_t, const format::ShardInfo*> shard_info_;
  Mutex mu_;
  // Every shard opened or adopted, with its index, for the Reader's
  // lifetime; their open files are in handles_ (max_open_files at most).
  std::map<uint32_t, std::unique_ptr<OpenShard>> shards_ ABSL_GUARDED_BY(mu_);
  ShardHandles handles_;
  Mutex pool_mu_;
  std::unique_ptr<internal::StagingPool> pool_ ABSL_GUARDED_BY(pool_mu_);
};

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_LOAD_READER_IMPL_H_

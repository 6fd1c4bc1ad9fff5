// load/: ckpt::Reader, which opens a committed checkpoint and loads regions
// of its entries into the caller's destinations (a single rank's reads,
// or a cooperative load of load/coop/). This header: the Reader's
// implementation.
#ifndef CKPT_LIBCKPT_LOAD_READER_IMPL_H_
#define CKPT_LIBCKPT_LOAD_READER_IMPL_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/reader.h"
#include "load/coop/coop_plan.h"
#include "read/index_check.h"
#include "read/read_executor.h"
#include "read/read_plan.h"
#include "read/shard_set.h"
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
      : dir_(std::move(dir)),
        manifest_(std::move(m)),
        options_(o),
        index_(manifest_),
        name_order_(NameOrder(manifest_)),
        shards_(storage, dir_, index_, o.direct_io, o.max_open_files) {
    // An object store (no rename, §4.3) answers each request at a cost of
    // about a megabyte's transfer: a cooperative load does not cut its
    // reads below kObjectStoreMinReadBytes there.
    min_read_bytes_ = storage->traits(dir_).atomic_rename
                          ? 0
                          : internal::kObjectStoreMinReadBytes;
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
  // The ranks of options_.communicator read between them
  // (load/coop/cooperative_load.h).
  absl::StatusOr<LoadReport> LoadCooperative(
      const std::vector<LoadRequest>& requests, const LoadOptions& options);

  absl::Status CheckRequest(const LoadRequest& r, const LoadOptions& o,
                            const EntryRecord** e);
  absl::StatusOr<Prepared> Prepare(const std::vector<LoadRequest>& requests,
                                   const LoadOptions& options,
                                   LoadReport* report, bool borrow);
  void ObjectsAsBytes(Prepared* p) const;
  absl::Status CheckUnrequested(std::vector<uint32_t> requested,
                                const LoadOptions& options,
                                LoadReport* report) const;
  int IoThreads(const LoadOptions& options) const;
  absl::StatusOr<internal::ReadPlan> Plan(const Prepared& p, int threads);
  // Reads what `p` requests, alone (LoadLocal after Prepare, and a
  // cooperative load that reads alone: CooperativeLoad::Source::load_alone).
  absl::StatusOr<LoadReport> LoadPrepared(const Prepared& p,
                                          const LoadOptions& options,
                                          LoadReport report);
  absl::Status Execute(const internal::ReadPlan& plan, ReadExecutor* run,
                       int threads);
  // The pinned buffers of loads into device memory: made on first need and
  // kept for the Reader's lifetime.
  absl::StatusOr<internal::StagingPool*> UploadPool();

  std::string dir_;
  uint64_t min_read_bytes_ = 0;  // CoopOptions::min_read_bytes
  format::Manifest manifest_;
  ReaderOptions options_;
  internal::ManifestIndex index_;  // over manifest_
  // Indexes of manifest_.entries in name order: Prepare lists unrequested
  // entries in this order, so a report needs no sort per Load.
  const std::vector<uint32_t> name_order_;
  CheckpointDescription description_;
  // Every shard opened or adopted, with its index, for the Reader's
  // lifetime (max_open_files open at most).
  ShardSet shards_;
  Mutex pool_mu_;
  std::unique_ptr<internal::StagingPool> pool_ ABSL_GUARDED_BY(pool_mu_);
};

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_LOAD_READER_IMPL_H_

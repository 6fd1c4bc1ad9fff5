#include "save/world_save.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/names.h"
#include "ckpt/format/plan_record.h"
#include "ckpt/format/status_macros.h"
#include "save/commit.h"
#include "save/object_store_commit.h"
#include "save/save_messages.h"
#include "save/save_plan.h"
#include "save/shard_writer.h"
#include "util/parallel_for.h"
#include "util/timing.h"

namespace ckpt::internal {

struct RankContents::Item {
  LocalItem item;
  const void* data = nullptr;
  TensorSource source;
  std::string bytes;  // objects
  format::Fingerprint fp{};
};

RankContents::RankContents() = default;
RankContents::~RankContents() = default;

absl::Status RankContents::Add(std::unique_ptr<Item> item) {
  if (!names_.insert(item->item.name).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("entry '", item->item.name, "' is already registered"));
  }
  item->fp = ItemFingerprint(item->item);
  items_.push_back(std::move(item));
  return absl::OkStatus();
}

absl::Status RankContents::AddTensor(const std::string& name, DType dtype,
                                     const Shape& shape, const Region& local,
                                     const void* data,
                                     const TensorOptions& options) {
  CKPT_RETURN_IF_ERROR(CheckTensorArguments(name, dtype, shape, local, data));
  if (options.memory != MemoryKind::kHost) {
    return absl::InvalidArgumentError(
        absl::StrCat("entry '", name, "': a batch save takes host memory"));
  }
  auto it = std::make_unique<Item>();
  it->item.name = name;
  it->item.dtype = dtype;
  it->item.shape = shape;
  it->item.region = local;
  it->item.replica = options.replica;
  it->item.partial = options.partial;
  it->data = data;
  return Add(std::move(it));
}

absl::Status RankContents::AddTensorSource(const std::string& name, DType dtype,
                                           const Shape& shape,
                                           const Region& local,
                                           TensorSource source,
                                           const TensorOptions& options) {
  if (!source) {
    return absl::InvalidArgumentError(
        absl::StrCat("entry '", name, "': source is empty"));
  }
  static const char kNonNull = 0;
  CKPT_RETURN_IF_ERROR(
      AddTensor(name, dtype, shape, local, &kNonNull, options));
  items_.back()->data = nullptr;
  items_.back()->source = std::move(source);
  return absl::OkStatus();
}

absl::Status RankContents::SetObject(const std::string& name,
                                     std::string bytes) {
  CKPT_RETURN_IF_ERROR(format::ValidateEntryName(name));
  auto it = std::make_unique<Item>();
  it->item.name = name;
  it->item.kind = format::EntryKind::kObject;
  it->item.dtype = DType::kUInt8;
  CKPT_RETURN_IF_ERROR(Add(std::move(it)));  // fingerprint without the size
  Item& o = *items_.back();
  o.bytes = std::move(bytes);
  o.item.shape = {o.bytes.size()};
  o.item.region = FlatRange{0, o.bytes.size()};
  return absl::OkStatus();
}

namespace {

format::Fingerprint LocalFingerprint(const RankContents& c) {
  return CombineFingerprints(
      c.items().size(),
      [&](size_t i) -> const format::Fingerprint& { return c.items()[i]->fp; });
}

// Every rank's RankPlan message, as Writer's Replan would gather them.
absl::StatusOr<std::vector<std::string>> GatherRankPlans(int world,
                                                         const FillRank& fill,
                                                         int parallel) {
  std::vector<std::string> messages(world);
  CKPT_RETURN_IF_ERROR(
      ParallelFor(parallel, world, [&](int, size_t r) -> absl::Status {
        RankContents c;
        std::shared_ptr<void> keep;
        CKPT_RETURN_IF_ERROR(Annotate(fill(static_cast<int>(r), c, keep),
                                      absl::StrCat("rank ", r)));
        RankPlan rp;
        rp.fingerprint = LocalFingerprint(c);
        rp.plan.reserve(c.items().size());
        for (const auto& it : c.items()) rp.plan.push_back(it->item);
        messages[r] = EncodeRankPlan(rp);
        return absl::OkStatus();
      }));
  return messages;
}

// What the coordinator's BeginSave decides, with the save lock it takes
// (held until the commit is done).
struct Prepared {
  std::unique_ptr<FileLock> lock;
  std::string tmp;
  format::CheckpointInfo info;
};

absl::StatusOr<Prepared> Prepare(Storage* storage, const std::string& root,
                                 uint64_t step, int world,
                                 const format::PlanRecord& record,
                                 const SaveOptions& options) {
  Prepared p;
  CKPT_ASSIGN_OR_RETURN(SavePrep prep,
                        BeginSave(storage, root, step, world, options.overwrite,
                                  GlobalFingerprint(record), &p.lock));
  p.tmp = prep.tmp_dir;
  p.info = CheckpointInfoOf(prep, step, static_cast<uint32_t>(world));
  return p;
}

// Fills rank r again and writes its shard; its report goes to *report.
absl::Status WriteRank(Storage* storage, const Prepared& p, int r,
                       const format::PlanRecord::Rank& plan,
                       const FillRank& fill, const SaveOptions& options,
                       ShardReport* report, uint64_t* stored) {
  RankContents c;
  std::shared_ptr<void> keep;
  CKPT_RETURN_IF_ERROR(fill(r, c, keep));
  if (LocalFingerprint(c) != plan.fingerprint) {
    return absl::InternalError(
        "registered another structure when writing than when planning");
  }
  std::vector<WriteItem> writes;
  writes.reserve(plan.writes.size());
  for (uint32_t i : plan.writes) {
    const RankContents::Item& it = *c.items()[i];
    const bool object = it.item.kind == format::EntryKind::kObject;
    writes.push_back(WriteItem{&it.item, object ? it.bytes.data() : it.data,
                               MemoryKind::kHost, 0,
                               it.source ? &it.source : nullptr});
  }
  CKPT_ASSIGN_OR_RETURN(ShardWriteResult written,
                        WriteRankShard(storage, p.tmp, static_cast<uint32_t>(r),
                                       p.info, writes, options, nullptr));
  *stored = written.stored_bytes;
  *report = ReportOf(std::move(written));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SaveResult> SaveWorld(const std::string& root, uint64_t step,
                                     int world, const FillRank& fill,
                                     const WorldSaveOptions& options) {
  if (world < 1 || options.parallel_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a batch save needs world >= 1 and parallel_ranks >= 1, "
                     "got ",
                     world, " and ", options.parallel_ranks));
  }
  Storage* storage =
      options.storage != nullptr ? options.storage : DefaultStorage();
  const SaveOptions& so = options.save;
  SaveResult result;
  const auto t0 = std::chrono::steady_clock::now();
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> messages,
                        GatherRankPlans(world, fill, options.parallel_ranks));
  CKPT_ASSIGN_OR_RETURN(CoordinatorPlan planned,
                        PlanOnCoordinator(std::move(messages)));
  CKPT_ASSIGN_OR_RETURN(format::PlanRecord record,
                        format::DecodePlanRecord(planned.body));
  result.plan_seconds = SecondsSince(t0);

  CKPT_ASSIGN_OR_RETURN(Prepared p,
                        Prepare(storage, root, step, world, record, so));
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<ShardReport> reports(world);
  std::vector<uint64_t> stored(world, 0);
  absl::Status status = ParallelFor(
      options.parallel_ranks, world, [&](int, size_t r) -> absl::Status {
        return Annotate(
            WriteRank(storage, p, static_cast<int>(r), record.ranks[r], fill,
                      so, &reports[r], &stored[r]),
            absl::StrCat("rank ", r));
      });
  result.write_seconds = SecondsSince(t1);
  const auto t2 = std::chrono::steady_clock::now();
  CommitSummary summary;
  if (status.ok()) {
    format::Manifest m =
        AssembleManifest(p.info, so.metadata, std::move(planned.body),
                         std::move(reports), &summary);
    status =
        CommitCheckpoint(storage, root, p.tmp, m, so.overwrite, so.keep_last);
  }
  if (!status.ok()) {
    (void)DiscardSave(storage, p.tmp, p.info);  // best effort
    return status;
  }
  result.commit_seconds = SecondsSince(t2);
  result.stored_bytes = summary.stored_bytes;
  result.logical_bytes = summary.logical_bytes;
  for (uint64_t s : stored) result.local_stored_bytes += s;
  result.path = JoinPath(root, format::StepDirName(step));
  return result;
}

}  // namespace ckpt::internal

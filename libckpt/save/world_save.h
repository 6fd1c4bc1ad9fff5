// Internal, shared with the tools: saves a checkpoint of N ranks from one
// process, a bounded number of ranks at a time, for tools that write
// checkpoints for large worlds (ckpt-reshard --to 16384, ckpt-synth).
//
// The result is the checkpoint that N ranks saving with ckpt::Writer would
// commit (same planner, shard writer, manifest and commit protocol), but
// no rank is a thread waiting in a collective: every rank's structure is
// registered and planned first (internal::PlanOnCoordinator), then the
// shards are written by `parallel_ranks` threads, each filling and writing
// one rank at a time, and the coordinator commits. Memory is that of
// `parallel_ranks` ranks' registrations and shard writers, plus the plan
// and the shard reports that become the manifest; it does not grow with N
// otherwise.
#ifndef CKPT_LIBCKPT_SAVE_WORLD_SAVE_H_
#define CKPT_LIBCKPT_SAVE_WORLD_SAVE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "ckpt/storage.h"
#include "ckpt/types.h"
#include "ckpt/writer.h"

namespace ckpt::internal {

// What one rank holds, registered as with a Writer: host memory or
// sources (no device memory), objects. Same checks and errors as Writer's
// AddTensor, AddTensorSource and SetObject.
class RankContents {
 public:
  RankContents();
  ~RankContents();
  RankContents(const RankContents&) = delete;
  RankContents& operator=(const RankContents&) = delete;

  // `data` must stay valid and unmodified until SaveWorld is done with
  // this rank (the FillRank call's owner keeps it).
  absl::Status AddTensor(const std::string& name, DType dtype,
                         const Shape& shape, const Region& local,
                         const void* data, const TensorOptions& options = {});
  absl::Status AddTensorSource(const std::string& name, DType dtype,
                               const Shape& shape, const Region& local,
                               TensorSource source,
                               const TensorOptions& options = {});
  absl::Status SetObject(const std::string& name, std::string bytes);

  struct Item;  // world_save.cc
  const std::vector<std::unique_ptr<Item>>& items() const { return items_; }

 private:
  absl::Status Add(std::unique_ptr<Item> item);

  std::vector<std::unique_ptr<Item>> items_;
  absl::flat_hash_set<std::string> names_;
};

// Registers rank `rank`'s contents. Called twice per rank (to plan, then to
// write), possibly for several ranks at once from different threads; both
// calls must register the same structure (a change fails the save naming
// the rank). Whatever `contents` points to must outlive the call's use:
// keep it in `keep` (destroyed when the rank is done).
using FillRank = std::function<absl::Status(int rank, RankContents& contents,
                                            std::shared_ptr<void>& keep)>;

struct WorldSaveOptions {
  SaveOptions save;            // as for Writer::Save (io_threads per rank)
  Storage* storage = nullptr;  // not owned; null = DefaultStorage()
  int parallel_ranks = 4;      // ranks filled and written at once (>= 1)
};

// Saves the checkpoint of step `step` of `world` ranks into `root`, as
// Writer::Save of `world` ranks would (SaveResult as rank 0's; its
// local_stored_bytes is the payload of all shards). Errors: those of
// Writer::Save, and the first error of a FillRank or of a shard's write
// (prefixed "rank R: "; once one fails no further rank is started).
// Nothing is committed on error and the temporary directory is removed.
// REQUIRES: options.save valid as Writer::Save checks it.
absl::StatusOr<SaveResult> SaveWorld(const std::string& root, uint64_t step,
                                     int world, const FillRank& fill,
                                     const WorldSaveOptions& options);

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_SAVE_WORLD_SAVE_H_

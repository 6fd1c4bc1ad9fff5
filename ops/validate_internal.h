// Internal to ckpt_ops: state shared between the metadata checks
// (validate.cc) and the payload scan (payload_scan.cc).
#ifndef CKPT_OPS_VALIDATE_INTERNAL_H_
#define CKPT_OPS_VALIDATE_INTERNAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "ckpt/format/records.h"
#include "ckpt/ops/validate.h"
#include "ckpt/storage.h"
#include "read/index_check.h"
#include "read/shard_file.h"
#include "util/mutex.h"

namespace ckpt::ops::internal {

// Thread-safe list of findings, keeping the first `max` and counting the
// rest.
class FindingList {
 public:
  explicit FindingList(size_t max) : max_(max) {}
  void Add(Finding f) ABSL_LOCKS_EXCLUDED(mu_);
  // Moves the findings, sorted, into `report`.
  void MoveTo(ValidateReport* report) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t max_;
  Mutex mu_;
  std::vector<Finding> findings_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

using ::ckpt::internal::ChunkRef;

// A shard file whose header, tail and index were verified.
struct OpenedShard {
  std::string path;
  ::ckpt::internal::ShardFile file;
  std::vector<ChunkRef> chunks;  // matched chunks, by data_offset
};

struct PayloadResult {
  uint64_t blocks_verified = 0;
  uint64_t bytes_verified = 0;
};

// Reads and verifies every block of the matched chunks of `shards` (those
// of entries accepted by options.entry_filter), adding a finding for each
// bad block, read error and (with check_finite) chunk holding NaN or Inf.
PayloadResult ScanPayload(const ValidateOptions& options,
                          const format::Manifest& manifest,
                          const std::vector<OpenedShard*>& shards, int threads,
                          FindingList* findings);

// "[2, 5]": the global coordinates of element `index` (in the chunk's own
// layout) of a chunk with region `region` of a tensor of `shape`.
std::string ElementCoordinates(const Shape& shape, const Region& region,
                               uint64_t index);

}  // namespace ckpt::ops::internal

#endif  // CKPT_OPS_VALIDATE_INTERNAL_H_

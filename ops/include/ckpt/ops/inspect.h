// What a checkpoint holds (what ckpt-inspect prints): from its manifest
// alone the format version, step, world size, sizes and, per entry, a
// sharding summary; optionally value statistics, which read and verify the
// data.
//
//   auto summary = ckpt::ops::LoadSummary("/ckpt/run1");  // follows latest
//
// The metadata path reads only the MANIFEST file and does not check
// coverage (ckpt-validate does), so it takes time linear in the manifest's
// size: well under a second for a million chunks.
#ifndef CKPT_OPS_INSPECT_H_
#define CKPT_OPS_INSPECT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/format/records.h"
#include "ckpt/ops/progress.h"
#include "ckpt/ops/values.h"
#include "ckpt/storage.h"

namespace ckpt::ops {

// How the stored chunks of an entry tile it, e.g. "whole", "dim0 x4",
// "dim0 x2 dim1 x4", "dim1 x3 uneven", "flat x8 even", "flat x8 uneven",
// "irregular x5", "none" (no chunk), "empty" (only chunks without
// elements); " partial" is appended for entries flagged partial. Describes
// what is stored: replicas are de-duplicated when saved, so a replicated
// tensor shows as "whole". Chunks without elements are ignored. A set of
// boxes is a grid when every combination of the distinct per-dimension
// intervals occurs exactly once. O(n log n) in the number of chunks.
std::string ShardingSummary(const format::EntryRecord& entry);

// One row of the entry table.
struct EntrySummary {
  size_t index = 0;            // in manifest.entries
  uint64_t logical_bytes = 0;  // element count x dtype size (objects: length)
  uint64_t raw_bytes = 0;      // raw bytes of the stored chunks
  uint64_t stored_bytes = 0;   // bytes in shard files
  std::string sharding;
  bool has_stats = false;
  ValueStats stats;
};

struct CheckpointSummary {
  std::string dir;  // the checkpoint directory (root resolved)
  format::Manifest manifest;
  uint64_t tensors = 0, objects = 0, chunks = 0;
  uint64_t logical_bytes = 0, raw_bytes = 0, stored_bytes = 0;
  std::vector<EntrySummary> entries;  // manifest order

  // raw_bytes / stored_bytes (1 when nothing is stored).
  double compression_ratio() const;
  // The entry named `name`: NotFound "entry 'x' is not in the checkpoint DIR".
  absl::StatusOr<size_t> FindEntry(const std::string& name) const;
};

// Summarizes a decoded manifest. Pure; no I/O.
CheckpointSummary Summarize(std::string dir, format::Manifest manifest);

// Reads the manifest of the checkpoint at `path` (a checkpoint directory,
// or a root whose `latest` is followed) and summarizes it. Reads nothing
// else. Errors: NotFound (no such directory, not a checkpoint, broken
// `latest`), DataLoss naming MANIFEST for a corrupt manifest,
// FailedPrecondition for a newer format version. `storage` null = POSIX.
absl::StatusOr<CheckpointSummary> LoadSummary(const std::string& path,
                                              Storage* storage = nullptr);

// Reads and verifies the payload of every tensor (or only of entry `only`,
// when not empty) and fills the entries' stats, streaming block by block
// with several threads (memory: a few MiB per thread). DataLoss naming the
// file, entry, chunk and block when the data does not verify (the message
// says how many other problems there are; ckpt-validate lists them all).
// Progress: phase kPhaseVerifying (Validate's).
absl::Status AddStats(CheckpointSummary* summary, const std::string& only,
                      int threads, Storage* storage = nullptr,
                      ProgressFn on_progress = nullptr);

}  // namespace ckpt::ops

#endif  // CKPT_OPS_INSPECT_H_

// Diff: structural and value differences between two checkpoints, whatever
// world sizes and shardings they were saved with (what ckpt-diff prints and
// ckpt.diff returns).
//
//   ckpt::ops::DiffOptions o;
//   o.a = "/ckpt/run1";            // a root (latest is followed) or a step dir
//   o.b = "/ckpt/run1-resharded";
//   auto report = ckpt::ops::Diff(o);   // report->equal()
//
// Tensors are compared as global tensors, window by window: each window is
// at most `window_bytes` per side and is loaded from both checkpoints with
// ckpt::Reader (which verifies every block it reads), so memory stays
// bounded (about 2 * window_bytes) whatever the size of the checkpoints.
// Objects are compared byte by byte (each object is read whole). Entries
// that fit in a window are loaded together, in name order, as many as fit
// in one window (and 16384 requests) with one Load per side, so that the
// work grows with the bytes compared, not with the number of entries.
//
// Findings (they make two checkpoints different):
//  - structural: an entry only in A ("removed") or only in B ("added"); a
//    kind (tensor/object), dtype, global shape or partial-flag change; for
//    entries flagged partial, chunks covering different elements;
//  - values: per entry with equal structure, the count of differing
//    elements (bytes for objects) and the max absolute difference.
// Informational notes (never findings): step, world size and user
// metadata differences. Shardings, codecs and block sizes are not compared.
//
// Thread safety: Diff may be called from several threads at once.
#ifndef CKPT_OPS_DIFF_H_
#define CKPT_OPS_DIFF_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/ops/compare.h"
#include "ckpt/ops/progress.h"
#include "ckpt/storage.h"

namespace ckpt::ops {

struct DiffOptions {
  std::string a, b;     // checkpoint roots or directories
  Tolerance tolerance;  // default: exact (bitwise)
  // Largest window loaded per side at once (at least one element).
  uint64_t window_bytes = 64ull << 20;
  int io_threads = 4;
  Storage* storage = nullptr;  // not owned; null = POSIX
  ProgressFn on_progress;      // phase kPhaseComparing: bytes compared per side
};

// A structural difference of one entry.
struct StructuralDiff {
  std::string entry;
  // "removed" (only in A), "added" (only in B), "kind", "dtype", "shape",
  // "partial", "coverage" (partial entries whose chunks cover different
  // elements).
  std::string change;
  std::string a, b;  // the two values ("" for added/removed)
};

// A value difference of one entry whose structure is equal on both sides.
struct ValueDiff {
  std::string entry;
  bool object = false;
  uint64_t differing = 0;   // elements (bytes for objects)
  uint64_t total = 0;       // elements compared (for objects: the larger size)
  double max_abs_diff = 0;  // tensors only; may be +inf
  // Tensors: where the first difference is, and the two values there.
  Dims first_at;
  std::string first_a, first_b;
  // Objects: the two sizes in bytes.
  uint64_t size_a = 0, size_b = 0;
};

// A difference that is reported but does not make the checkpoints differ.
struct DiffNote {
  std::string what;  // "step", "world size", "metadata 'key'"
  std::string a, b;  // "(absent)" when a metadata key is missing on a side
};

// One side of a diff.
struct DiffSide {
  std::string path;  // the checkpoint directory
  uint64_t step = 0;
  uint32_t world_size = 0;
  uint64_t entries = 0;
};

struct DiffReport {
  DiffSide a, b;
  Tolerance tolerance;
  std::vector<DiffNote> notes;
  std::vector<StructuralDiff> structural;  // sorted by entry name
  std::vector<ValueDiff> values;           // sorted by entry name
  uint64_t entries_compared = 0;  // entries on both sides with equal structure
  uint64_t bytes_compared = 0;    // per side
  // Reader::Load calls made per side: one per batch of entries that fit in
  // a window together (as many as window_bytes and 16384 requests allow),
  // one per window of a larger tensor, one per larger object.
  uint64_t loads = 0;
  bool equal() const { return structural.empty() && values.empty(); }
};

// Compares the checkpoints at options.a and options.b. Errors (never
// findings): a path that is not a checkpoint (NotFound, as
// ckpt::Reader::Open says), corruption found while reading (DataLoss naming
// the file, entry and block), InvalidArgument for bad options.
absl::StatusOr<DiffReport> Diff(const DiffOptions& options);

}  // namespace ckpt::ops

#endif  // CKPT_OPS_DIFF_H_

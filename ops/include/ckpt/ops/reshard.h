// Reshard: rewrites a checkpoint for another number of ranks, so that rank
// r of N finds its part of every tensor in one shard file (what
// ckpt-reshard runs and ckpt.reshard calls).
//
//   ckpt::ops::ReshardOptions o;
//   o.src = "/ckpt/run1";       // a root (latest is followed) or a step dir
//   o.dst = "/ckpt/run1-8";     // a root: the output is DST/step-NNNNNNNN
//   o.to = 8;
//   auto report = ckpt::ops::Reshard(o);
//
// The output is written as N ranks by internal::SaveWorld (the Writer's
// planner, shard writer and commit protocol, min(threads, N) ranks at a
// time: no thread per output rank), so it is committed atomically
// (manifest last, rename, then DST/latest) and is an ordinary checkpoint.
// Tensors are registered with Writer::AddTensorSource: their bytes are read
// from SRC on demand, a few MiB at a time, by ckpt::Reader (which verifies
// every block against its checksum), so memory stays bounded whatever the size
// of SRC. Objects are read whole and held in memory during the save.
//
// Layouts are inferred from SRC's chunks or taken from override rules
// (reshard_layout.h; ckpt-reshard reads them from its --layout file). Each
// split tensor's part for rank r is written by rank r into shard r; a
// replicated tensor is written once, by the rank the planner picks; objects are
// written by rank 0.
#ifndef CKPT_OPS_RESHARD_H_
#define CKPT_OPS_RESHARD_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/ops/diff.h"
#include "ckpt/ops/progress.h"
#include "ckpt/ops/reshard_layout.h"
#include "ckpt/storage.h"

namespace ckpt::ops {

// The largest --to (the format's limit of shards per checkpoint is
// higher): output ranks are written a few at a time, so memory does not
// grow with N beyond the manifest.
inline constexpr int kMaxReshardRanks = 65536;

struct ReshardOptions {
  std::string src;  // checkpoint root or directory
  std::string
      dst;       // checkpoint root (created if missing; its parent must exist)
  int to = 0;    // N, in [1, kMaxReshardRanks]
  int from = 0;  // > 0: SRC must have been saved on this many ranks
  // The layout override rules, read after SRC is opened and checked (so
  // that SRC's errors come first) with the storage the reshard uses; their
  // errors are returned as they are. Unset: every layout is inferred.
  // ckpt-reshard reads its --layout file here (tools/reshard/overrides.h).
  std::function<absl::StatusOr<Overrides>(Storage*)> read_overrides;
  // Names the rules in the errors of PlanAll ("FILE: ..."): the --layout
  // file's path. Unused without read_overrides.
  std::string overrides_source;
  std::optional<format::Codec> codec;  // default: zstd if SRC uses it anywhere
  std::optional<uint64_t> step;        // default: SRC's step
  int threads = 4;  // I/O threads in all, shared by the N ranks (>= 1)
  Storage* storage = nullptr;  // not owned; null = POSIX (SRC and DST)
  // Phases kPhaseWriting (tensor bytes read from SRC and written) and, with
  // `verify`, Diff's kPhaseComparing.
  ProgressFn on_progress;
  bool verify = false;  // afterwards, Diff SRC against the output
};

struct ReshardedEntry {
  std::string name;
  bool object = false;
  DType dtype = DType::kUInt8;
  Shape shape;
  std::string source;  // SRC's layout, described ("4 parts along dim0", ...)
  std::string layout;  // "dim0", "flat", "replicated", "partial", "object"
  bool from_override = false;
};

struct ReshardReport {
  std::string src_dir;    // the checkpoint directory read
  std::string dst_dir;    // the checkpoint directory written
  uint64_t src_step = 0;  // SRC's step
  uint64_t step = 0;      // the step written: --step, else SRC's
  uint32_t from = 0, to = 0;
  std::string codec;                    // "none" or "zstd"
  std::vector<ReshardedEntry> entries;  // sorted by name
  uint64_t tensor_bytes = 0, object_bytes = 0;
  uint64_t stored_bytes = 0;  // payload bytes written
  // The most bytes one read from SRC served at once (bounded memory).
  uint64_t largest_read = 0;
  std::optional<DiffReport> verify;  // with ReshardOptions::verify
  double seconds = 0;
};

// Reshards options.src into options.dst. Errors (nothing is committed):
//  - InvalidArgument: bad options; "--from M" not SRC's world size (the
//    message names SRC and both sizes); DST being a checkpoint directory;
//    an override rule that matches no entry, several rules matching one
//    entry, or a rule that does not fit an entry (messages prefixed by
//    overrides_source); an entry whose layout cannot be inferred (named).
//  - NotFound: SRC is not a checkpoint.
//  - the error of read_overrides (ckpt-reshard: a --layout file that is
//    missing, NotFound, or does not parse, InvalidArgument naming it).
//  - AlreadyExists: DST already holds a checkpoint of the step.
//  - DataLoss: SRC is corrupt (naming the file, entry and block).
//  - storage errors, naming the file.
absl::StatusOr<ReshardReport> Reshard(const ReshardOptions& options);

}  // namespace ckpt::ops

#endif  // CKPT_OPS_RESHARD_H_

// ckpt-reshard: rewrites a checkpoint for another number of ranks, so that
// rank r of N finds its part of every tensor in one shard file.
//
//   ckpt::tools::ReshardOptions o;
//   o.src = "/ckpt/run1";       // a root (latest is followed) or a step dir
//   o.dst = "/ckpt/run1-8";     // a root: the output is DST/step-NNNNNNNN
//   o.to = 8;
//   auto report = ckpt::tools::Reshard(o);
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
// Layouts are inferred from SRC's chunks or taken from an override file
// (tools/reshard/layout.h, overrides.h). Each split tensor's part for rank
// r is written by rank r into shard r; a replicated tensor is written once,
// by the rank the planner picks; objects are written by rank 0.
#ifndef CKPT_TOOLS_RESHARD_RESHARD_H_
#define CKPT_TOOLS_RESHARD_RESHARD_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/storage.h"
#include "diff/diff.h"
#include "nlohmann/json.hpp"

namespace ckpt::tools {

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
  std::string layout_file;             // override file (overrides.h); "" = none
  std::optional<format::Codec> codec;  // default: zstd if SRC uses it anywhere
  std::optional<uint64_t> step;        // default: SRC's step
  int threads = 4;  // I/O threads in all, shared by the N ranks (>= 1)
  Storage* storage = nullptr;  // not owned; null = POSIX (SRC and DST)
  bool progress = true;        // progress bar on stderr when it is a terminal
  bool verify = false;         // afterwards, ckpt-diff SRC against the output
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
//    an override file that does not parse (message prefixed by its path),
//    names or matches no entry, or does not fit an entry; an entry whose
//    layout cannot be inferred (named).
//  - NotFound: SRC is not a checkpoint, or the override file is missing.
//  - AlreadyExists: DST already holds a checkpoint of the step.
//  - DataLoss: SRC is corrupt (naming the file, entry and block).
//  - storage errors, naming the file.
absl::StatusOr<ReshardReport> Reshard(const ReshardOptions& options);

// Human-readable summary; with `verbose`, one line per entry.
void PrintReshardText(const ReshardReport& report, bool verbose,
                      std::ostream& out);
// The --json document (schema in tools/README.md (ckpt-reshard)).
nlohmann::ordered_json ReshardToJson(const ReshardReport& report);

// What main() runs: Reshard, then print. Exit code 0; 1 if --verify found
// differences; errors are returned as a Status (exit code 2).
absl::StatusOr<int> RunReshard(const ReshardOptions& options, bool json,
                               bool verbose, std::ostream& out);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RESHARD_RESHARD_H_

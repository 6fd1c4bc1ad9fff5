// ckpt-inspect: prints what a checkpoint holds (ops::LoadSummary and, with
// --stats, ops::AddStats of ckpt/ops/inspect.h): the checkpoint and a table
// of its entries, or the chunk map of one entry, as text or one JSON
// document.
#ifndef CKPT_TOOLS_INSPECT_INSPECT_H_
#define CKPT_TOOLS_INSPECT_INSPECT_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt/ops/inspect.h"
#include "ckpt/storage.h"
#include "nlohmann/json.hpp"

namespace ckpt::tools {

// The operation and its summary, as this tool prints them.
using ops::CheckpointSummary;
using ops::EntrySummary;
using ops::LoadSummary;
using ops::ShardingSummary;
using ops::Summarize;
using ops::ValueStats;

// Human-readable output: the checkpoint and its entry table (with value
// columns for entries that have stats), or the chunk map of one entry.
void PrintInspectText(const CheckpointSummary& s, std::ostream& out);
void PrintEntryText(const CheckpointSummary& s, size_t entry,
                    std::ostream& out);

// The --json document (schema in tools/README.md (ckpt-inspect)). With `entry`
// >= 0, "entries" holds only that entry, with its "chunk_map". Held whole:
// it takes many times the manifest's memory for a large checkpoint.
nlohmann::ordered_json InspectJson(const CheckpointSummary& s,
                                   int64_t entry = -1);

// What ckpt-inspect --json prints: JsonText(InspectJson(s, entry)) and a
// newline, written one entry (with `entry` >= 0, one chunk) at a time, so
// that output takes the memory of one element, not of the document.
void PrintInspectJson(const CheckpointSummary& s, int64_t entry,
                      std::ostream& out);

struct InspectOptions {
  std::string path;   // checkpoint directory or root
  std::string entry;  // non-empty: show this entry's chunk map
  bool stats = false;
  bool json = false;
  int threads = 0;  // for --stats; 0 = one per hardware thread
  Storage* storage = nullptr;
  bool progress = false;  // --stats progress bar on stderr (tty only)
};

// Runs ckpt-inspect, printing to `out`; returns kExitOk or the error.
absl::StatusOr<int> RunInspect(const InspectOptions& options,
                               std::ostream& out);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_INSPECT_INSPECT_H_

// ckpt-reshard: runs ops::Reshard (ckpt/ops/reshard.h) with the layout
// override file of --layout (overrides.h), prints what it did, as text or
// one JSON document, and maps it to an exit code.
#ifndef CKPT_TOOLS_RESHARD_RESHARD_H_
#define CKPT_TOOLS_RESHARD_RESHARD_H_

#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt/ops/reshard.h"
#include "nlohmann/json.hpp"
#include "reshard/overrides.h"

namespace ckpt::tools {

// The operation's report, as this tool prints it.
using ops::kMaxReshardRanks;
using ops::ReshardedEntry;
using ops::ReshardReport;

// What ckpt-reshard runs: the operation's options, the override file of
// --layout, and whether to draw progress bars on stderr (only when it is a
// terminal).
struct ReshardOptions : ops::ReshardOptions {
  std::string layout_file;  // override file (overrides.h); "" = none
  bool progress = true;
};

// ops::Reshard with the rules of options.layout_file (read through the
// reshard's storage once SRC is checked; errors prefixed by its path:
// NotFound when it is missing, InvalidArgument when it does not parse) and
// progress bars when options.progress.
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

// ckpt-inspect DIR [--entry NAME] [--stats] [--json] [--threads N]
#include <iostream>

#include "CLI/CLI.hpp"
#include "ckpt/format/status_macros.h"
#include "common/tool_storage.h"
#include "common/tool_util.h"
#include "inspect/foreign_inspect.h"
#include "inspect/inspect.h"

int main(int argc, char** argv) {
  CLI::App app(
      "Shows what a checkpoint holds (a checkpoint directory, or a root whose "
      "'latest' is followed): format version, step, world size, sizes and a "
      "table of "
      "entries, from the manifest alone.",
      "ckpt-inspect");
  ckpt::tools::InspectOptions opts;
  app.add_option("DIR", opts.path, "Checkpoint directory or checkpoint root")
      ->required();
  app.add_option("--entry", opts.entry, "Show the chunk map of this entry");
  app.add_flag("--stats", opts.stats,
               "Add min, max, mean, L2 norm and NaN/Inf counts of every tensor "
               "(reads and "
               "verifies the data)");
  app.add_flag("--json", opts.json,
               "Print one JSON document (see tools/README.md)");
  app.add_option("--threads", opts.threads,
                 "Reader threads for --stats (default: one per core)")
      ->check(CLI::Range(1, 1024));
  opts.progress = true;  // drawn only when stderr is a terminal
  return ckpt::tools::RunToolMain(
      app, argc, argv, [&]() -> absl::StatusOr<int> {
        CKPT_ASSIGN_OR_RETURN(opts.storage,
                              ckpt::tools::ToolStorage({opts.path}));
        return ckpt::tools::RunInspectAnyFormat(opts, std::cout);
      });
}

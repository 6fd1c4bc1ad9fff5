// ckpt-validate DIR [--quick] [--check-finite] [--strict] [--json] [--threads
// N]
#include <iostream>

#include "CLI/CLI.hpp"
#include "ckpt/format/status_macros.h"
#include "common/tool_storage.h"
#include "common/tool_util.h"
#include "validate/foreign_validate.h"
#include "validate/validate.h"

int main(int argc, char** argv) {
  CLI::App app(
      "Checks a checkpoint (a checkpoint directory, or a root whose 'latest' "
      "is "
      "followed) and reports every problem found. Exit 0: valid (warnings "
      "shown); 1: errors "
      "found (or warnings, with --strict); "
      "2: usage or I/O error, not a checkpoint.",
      "ckpt-validate");
  ckpt::tools::ValidateOptions opts;
  bool json = false;
  app.add_option("DIR", opts.path, "Checkpoint directory or checkpoint root")
      ->required();
  auto* quick = app.add_flag(
      "--quick", opts.quick,
      "Metadata only: manifest, shard headers and indexes, coverage; "
      "no payload is read");
  app.add_flag("--check-finite", opts.check_finite,
               "Also report NaN and Inf values in floating-point tensors")
      ->excludes(quick);
  app.add_flag("--strict", opts.strict,
               "Warnings (a stray .tmp-* entry under a root) fail the check "
               "too (exit 1)");
  app.add_flag("--json", json, "Print one JSON document (see tools/README.md)");
  app.add_option("--threads", opts.threads,
                 "Reader threads (default: one per core)")
      ->check(CLI::Range(1, 1024));
  // Drawn only when stderr is a terminal.
  ckpt::tools::ProgressBars bars(
      [](absl::string_view phase) { return std::string(phase); });
  opts.on_progress = bars.Callback();
  return ckpt::tools::RunToolMain(
      app, argc, argv, [&]() -> absl::StatusOr<int> {
        CKPT_ASSIGN_OR_RETURN(opts.storage,
                              ckpt::tools::ToolStorage({opts.path}));
        return ckpt::tools::RunValidateAnyFormat(opts, json, std::cout);
      });
}

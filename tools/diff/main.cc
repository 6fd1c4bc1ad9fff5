// ckpt-diff A B: structural and value differences between two checkpoints.
// Exit 0 equal, 1 different, 2 error. See tools/README.md (ckpt-diff).
#include <iostream>

#include "CLI/CLI.hpp"
#include "ckpt/format/status_macros.h"
#include "common/tool_storage.h"
#include "common/tool_util.h"
#include "diff/diff.h"
#include "diff/foreign_diff.h"

int main(int argc, char** argv) {
  CLI::App app(
      "Compares two checkpoints entry by entry, whatever their world sizes and "
      "shardings. Exit code 0 = equal, 1 = different, 2 = error.",
      "ckpt-diff");
  ckpt::tools::DiffOptions opts;
  bool json = false;
  uint64_t window_mib = 64;
  app.add_option(
         "A", opts.a,
         "First checkpoint (a root, following 'latest', or a step directory)")
      ->required();
  app.add_option("B", opts.b, "Second checkpoint")->required();
  app.add_option(
         "--atol", opts.tolerance.atol,
         "Absolute tolerance: |a - b| <= atol + rtol * |b| (default 0: exact)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rtol", opts.tolerance.rtol,
                 "Relative tolerance (default 0: exact)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--window-mib", window_mib,
                 "Largest window of a tensor loaded per side at once, in MiB "
                 "(default 64)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  app.add_option("--threads", opts.io_threads,
                 "I/O threads per load (default 4)")
      ->check(CLI::Range(1, 256));
  app.add_flag("--json", json,
               "Print one JSON document (schema in tools/README.md)");
  return ckpt::tools::RunToolMain(
      app, argc, argv, [&]() -> absl::StatusOr<int> {
        opts.window_bytes = window_mib << 20;
        CKPT_ASSIGN_OR_RETURN(opts.storage,
                              ckpt::tools::ToolStorage({opts.a, opts.b}));
        return ckpt::tools::RunDiffAnyFormat(opts, json, std::cout);
      });
}

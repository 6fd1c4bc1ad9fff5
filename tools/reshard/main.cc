// ckpt-reshard SRC DST --to N: rewrites a checkpoint for N ranks.
// Exit 0 done, 1 --verify found differences, 2 error. See tools/README.md
// (ckpt-reshard).
#include <iostream>
#include <map>

#include "CLI/CLI.hpp"
#include "ckpt/format/status_macros.h"
#include "common/tool_storage.h"
#include "common/tool_util.h"
#include "reshard/reshard.h"

int main(int argc, char** argv) {
  CLI::App app(
      "Rewrites checkpoint SRC as checkpoint DST/step-NNNNNNNN laid out for N "
      "ranks, "
      "so that rank r finds its part of every tensor in shard r. Streams with "
      "bounded "
      "memory, verifies checksums as it reads, commits atomically.",
      "ckpt-reshard");
  ckpt::tools::ReshardOptions opts;
  bool json = false, verbose = false;
  std::string codec;
  uint64_t step = 0;
  app.add_option("SRC", opts.src,
                 "Source checkpoint (a root, following 'latest', or a step "
                 "directory)")
      ->required();
  app.add_option("DST", opts.dst,
                 "Destination checkpoint root (created if missing)")
      ->required();
  app.add_option("--to", opts.to, "World size of the output")
      ->required()
      ->check(CLI::Range(1, ckpt::tools::kMaxReshardRanks));
  app.add_option("--from", opts.from,
                 "Fail unless SRC was saved on this many ranks")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option(
      "--layout", opts.layout_file,
      "Override file giving entries' layouts (JSON; see tools/README.md)");
  app.add_option("--codec", codec, "Codec of the output (default: SRC's)")
      ->check(CLI::IsMember({"none", "zstd"}));
  auto* step_opt =
      app.add_option("--step", step, "Step of the output (default: SRC's)");
  app.add_option("--threads", opts.threads, "I/O threads in all (default 4)")
      ->check(CLI::Range(1, 1024));
  app.add_flag(
      "--verify", opts.verify,
      "Compare the output with SRC afterwards (exit 1 if they differ)");
  app.add_flag("-v,--verbose", verbose, "List every entry and its layout");
  app.add_flag("--json", json,
               "Print one JSON document (schema in tools/README.md)");
  return ckpt::tools::RunToolMain(
      app, argc, argv, [&]() -> absl::StatusOr<int> {
        if (!codec.empty()) {
          opts.codec = codec == "zstd" ? ckpt::format::Codec::kZstd
                                       : ckpt::format::Codec::kNone;
        }
        if (step_opt->count() > 0) opts.step = step;
        CKPT_ASSIGN_OR_RETURN(opts.storage,
                              ckpt::tools::ToolStorage({opts.src, opts.dst}));
        return ckpt::tools::RunReshard(opts, json, verbose, std::cout);
      });
}

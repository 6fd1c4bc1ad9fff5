// ckpt-synth: writes a synthetic transformer-shaped checkpoint from N
// ranks (written a few at a time), and verifies one as any number of ranks. See
// README.md.
#include <iostream>

#include "CLI/CLI.hpp"
#include "common/tool_util.h"
#include "synth/synth_tool.h"

namespace {

// `ckpt-synth write`, its values into `w`.
CLI::App* AddWriteCommand(CLI::App& app, ckpt::synth::WriteArgs& w) {
  CLI::App* write = app.add_subcommand("write",
                                       "Write a synthetic checkpoint from N "
                                       "ranks through the library");
  write->add_option("dir", w.dir, "Checkpoint root (created if missing)")
      ->required();
  write->add_option("--ranks", w.ranks, "Writing ranks")
      ->required()
      ->check(CLI::Range(1, 65536));
  write
      ->add_option("--layout", w.layout,
                   "Sharding: tp, fsdp, replicated or mixed")
      ->required()
      ->check(CLI::IsMember({"tp", "fsdp", "replicated", "mixed"}));
  write->add_option("--seed", w.seed, "Seed of every value")->required();
  write
      ->add_option("--size-mb", w.size_mb,
                   "MiB of parameters + Adam states, about")
      ->capture_default_str();
  write->add_option("--dtype", w.dtype, "Parameter dtype (states are float32)")
      ->capture_default_str();
  write->add_option("--step", w.step, "Step of the checkpoint")
      ->capture_default_str();
  write->add_option("--codec", w.codec, "Block codec")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "zstd"}));
  write->add_option("--zstd-level", w.zstd_level, "zstd level")
      ->capture_default_str();
  write->add_option("--io-threads", w.io_threads, "I/O threads per rank")
      ->capture_default_str();
  write->add_flag("--overwrite", w.overwrite,
                  "Replace an existing checkpoint of this step");
  write->add_flag("--json", w.json, "One JSON document on stdout");
  return write;
}

// `ckpt-synth verify`, its values into `v` and the --seed given into
// `seed` (its option into `seed_opt`).
CLI::App* AddVerifyCommand(CLI::App& app, ckpt::synth::VerifyArgs& v,
                           uint64_t& seed, CLI::Option** seed_opt) {
  CLI::App* verify =
      app.add_subcommand("verify",
                         "Load a synthetic checkpoint as N ranks and check "
                         "every value (exit 1 if any differ)");
  verify->add_option("path", v.path, "Checkpoint root or directory")
      ->required();
  verify
      ->add_option("--ranks", v.ranks,
                   "Loading ranks (default: as many as wrote it)")
      ->check(CLI::Range(1, 65536));
  verify
      ->add_option("--layout", v.layout,
                   "Loading layout (default: the one recorded)")
      ->check(CLI::IsMember({"tp", "fsdp", "replicated", "mixed"}));
  *seed_opt = verify->add_option("--seed", seed,
                                 "Expected seed (default: the one recorded)");
  verify->add_option("--io-threads", v.io_threads, "I/O threads per rank")
      ->capture_default_str();
  verify->add_flag("--json", v.json, "One JSON document on stdout");
  return verify;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "Writes and verifies synthetic checkpoints (tools/README.md "
      "(ckpt-synth))",
      "ckpt-synth");
  app.require_subcommand(1);
  ckpt::synth::WriteArgs w;
  CLI::App* write = AddWriteCommand(app, w);
  ckpt::synth::VerifyArgs v;
  uint64_t seed = 0;
  CLI::Option* seed_opt = nullptr;
  AddVerifyCommand(app, v, seed, &seed_opt);
  return ckpt::tools::RunToolMain(
      app, argc, argv, [&]() -> absl::StatusOr<int> {
        if (write->parsed()) return ckpt::synth::RunWrite(w, std::cout);
        if (seed_opt->count() != 0) v.seed = seed;
        return ckpt::synth::RunVerify(v, std::cout);
      });
}

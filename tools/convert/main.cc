// ckpt-convert SRC OUT.h5 --to hdf5 | ckpt-convert IN.h5 DST --from hdf5
#include <iostream>

#include "CLI/CLI.hpp"
#include "ckpt/format/status_macros.h"
#include "common/tool_storage.h"
#include "common/tool_util.h"
#include "convert/convert.h"

namespace {

using ckpt::tools::ConvertOptions;

// SRC, DST, the direction and what every mode takes.
void AddCommonFlags(CLI::App& app, ConvertOptions& opts) {
  app.add_option("SRC", opts.source, "Checkpoint (--to) or HDF5 file (--from)")
      ->required();
  app.add_option("DST", opts.destination,
                 "HDF5 file (--to) or checkpoint root (--from)")
      ->required();
  app.add_option("--to", opts.to,
                 "Export the checkpoint SRC to DST in this format (hdf5)");
  app.add_option("--from", opts.from,
                 "Import SRC, a file in this format (hdf5), into DST");
  app.add_flag(
      "--force", opts.force,
      "Replace DST (--to) or the checkpoint of that step in DST (--from); a "
      "--max-shard-size directory DST is replaced only if it holds nothing "
      "but shards and model.safetensors.index.json");
  app.add_flag("--json", opts.json,
               "Print one JSON document (see tools/README.md)");
  app.add_flag("-v,--verbose", opts.verbose,
               "List every entry with its HDF5 path");
  app.add_option("--threads", opts.threads,
                 "Threads for checkpoint I/O (default 4) and, with --to, for "
                 "compression "
                 "(default: one per core)")
      ->check(CLI::Range(1, 1024));
}

// --to hdf5.
void AddHdf5ExportFlags(CLI::App& app, ConvertOptions& opts) {
  app.add_option("--compression", opts.compression,
                 "--to: HDF5 compression, none or deflate (default deflate, "
                 "with shuffle)");
  app.add_option("--level", opts.level, "--to: deflate level 0..9 (default 4)")
      ->check(CLI::Range(0, 9));
}

// --from: the imports. The step goes to `step`; the option is returned.
CLI::Option* AddImportFlags(CLI::App& app, ConvertOptions& opts,
                            uint64_t& step) {
  CLI::Option* step_opt =
      app.add_option("--step", step,
                     "--from: step of the new checkpoint (default: the file's "
                     "ckpt_step attribute, else 0)");
  app.add_flag(
      "--skip-unsupported", opts.skip_unsupported,
      "--from: skip (and list) datasets and attributes that cannot be imported "
      "instead of failing");
  app.add_option("--codec", opts.codec,
                 "--from: checkpoint codec, none or zstd (default none)");
  return step_opt;
}

// --to and --from safetensors.
void AddSafetensorsFlags(CLI::App& app, ConvertOptions& opts) {
  app.add_option(
      "--max-shard-size", opts.max_shard_size,
      "--to safetensors: write Hugging Face shards of at most SIZE (5GB, "
      "500MiB, "
      "bytes) and model.safetensors.index.json into the directory DST");
  app.add_option(
      "--include", opts.include,
      "--to safetensors: export only entries matching this glob (repeatable)");
  app.add_option(
      "--exclude", opts.exclude,
      "--to safetensors: leave out entries matching this glob (repeatable)");
  app.add_option("--ranks", opts.ranks,
                 "--from safetensors: write the checkpoint for N ranks "
                 "(layouts inferred as "
                 "ckpt-reshard does)")
      ->check(CLI::Range(1, 1024));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "Converts a checkpoint to one HDF5 file (--to hdf5: SRC is a checkpoint "
      "directory or a "
      "root whose 'latest' is followed, DST the .h5 file) or to safetensors "
      "(--to "
      "safetensors: one file, or Hugging Face shards with --max-shard-size), "
      "or imports an "
      "HDF5 file (--from hdf5), a safetensors file or Hugging Face index "
      "directory (--from "
      "safetensors) or a PyTorch DCP / Megatron torch_dist directory (--from "
      "dcp) into the "
      "checkpoint root DST. Exit 0: converted; 2: usage or I/O error, "
      "unsupported input.",
      "ckpt-convert");
  ConvertOptions opts;
  uint64_t step = 0;
  AddCommonFlags(app, opts);
  AddHdf5ExportFlags(app, opts);
  CLI::Option* step_opt = AddImportFlags(app, opts, step);
  AddSafetensorsFlags(app, opts);
  return ckpt::tools::RunToolMain(
      app, argc, argv, [&]() -> absl::StatusOr<int> {
        if (step_opt->count() > 0) opts.step = step;
        CKPT_ASSIGN_OR_RETURN(
            opts.storage,
            ckpt::tools::ToolStorage({opts.source, opts.destination}));
        return ckpt::tools::RunConvert(opts, std::cout);
      });
}

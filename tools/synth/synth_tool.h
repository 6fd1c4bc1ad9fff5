// The command-line layer of ckpt-synth: parsed flags in, text or JSON out,
// an exit code back (tools/common/tool_util.h). main.cc only declares the
// flags; everything here is unit-tested.
#ifndef CKPT_TOOLS_SYNTH_SYNTH_TOOL_H_
#define CKPT_TOOLS_SYNTH_SYNTH_TOOL_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "synth/synth.h"

namespace ckpt::synth {

// ckpt-synth write DIR --ranks N --layout L --seed S [--size-mb M]
//   [--dtype T] [--step K] [--codec none|zstd] [--zstd-level Z]
//   [--io-threads T] [--overwrite] [--json]
struct WriteArgs {
  std::string dir;
  int ranks = 1;
  std::string layout = "tp";
  uint64_t seed = 0;
  double size_mb = 16;
  std::string dtype = "bfloat16";
  uint64_t step = 100;
  std::string codec = "none";
  int zstd_level = 3;
  int io_threads = 4;
  bool overwrite = false;
  bool json = false;
};

// ckpt-synth verify PATH [--ranks N] [--layout L] [--seed S]
//   [--io-threads T] [--json]
struct VerifyArgs {
  std::string path;
  int ranks = 0;       // 0: as many as wrote it
  std::string layout;  // empty: the one recorded
  std::optional<uint64_t> seed;
  int io_threads = 4;
  bool json = false;
};

// Write: 0, or an error (exit 2) for bad flags or a failed save.
absl::StatusOr<int> RunWrite(const WriteArgs& args, std::ostream& out);
// Verify: 0 when every value matches, 1 with mismatches (listed on `out`),
// an error (exit 2) when the checkpoint cannot be opened or is not synthetic.
absl::StatusOr<int> RunVerify(const VerifyArgs& args, std::ostream& out);

// Renderings (the formats are in tools/README.md (ckpt-synth)).
std::string WriteText(const SynthResult& r);
nlohmann::ordered_json WriteJson(const SynthResult& r);
// At most `max_listed` mismatches are listed, then "... and N more".
std::string VerifyText(const VerifyResult& r, size_t max_listed = 10);
nlohmann::ordered_json VerifyJson(const VerifyResult& r);

}  // namespace ckpt::synth

#endif  // CKPT_TOOLS_SYNTH_SYNTH_TOOL_H_

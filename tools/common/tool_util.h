// Shared conventions of the ckpt command-line tools (tools/README.md):
// exit codes, version text, human-readable sizes, a progress bar that only
// draws on a terminal, and the one function every main() calls.
//
// Each tool keeps its logic in a library (tools/<tool>/<tool>.{h,cc}) that
// returns a Status or a result struct and is unit-tested; its main.cc only
// declares flags and calls RunToolMain.
#ifndef CKPT_TOOLS_COMMON_TOOL_UTIL_H_
#define CKPT_TOOLS_COMMON_TOOL_UTIL_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/ops/progress.h"

namespace CLI {
class App;
}

namespace ckpt::tools {

// Exit codes shared by every tool.
enum ExitCode : int {
  kExitOk = 0,        // ok / valid / equal
  kExitFindings = 1,  // invalid, different (the tool ran and found problems)
  kExitError = 2,     // usage or I/O error, not a checkpoint, ...
};

// "ckpt-inspect 0.1.0 (ckpt library 0.1.0, format v1.0)".
std::string VersionText(absl::string_view tool);

// 0 B, 1023 B, 1.0 KiB, 12.3 MiB, 4.00 GiB (binary units, 3 significant
// digits).
std::string HumanBytes(uint64_t bytes);

// A shape as "[4096, 1024]" ("[]" for a scalar).
template <typename Dims>
std::string ShapeText(const Dims& dims) {
  std::string s = "[";
  bool first = true;
  for (auto d : dims) {
    if (!first) s += ", ";
    s += std::to_string(d);
    first = false;
  }
  return s + "]";
}

// Progress of long work on stderr: "label [=====>    ]  42% 1.2 GiB/2.9 GiB".
// Draws only when stderr is a terminal (and at most ~10 times a second);
// otherwise every call is a no-op. Thread-compatible: call from one thread.
class Progress {
 public:
  Progress(std::string label, uint64_t total);
  ~Progress();  // Finish()es.
  void Add(uint64_t done);
  void Finish();
  // Forces drawing off (tests) or on (never: only a terminal draws).
  static void DisableForTesting();

 private:
  void Draw(bool final);
  std::string label_;
  uint64_t total_, done_ = 0;
  bool enabled_, finished_ = false;
  std::chrono::steady_clock::time_point last_;
};

// A Progress for work that learns its total only when it starts: the
// callback (done, total) starts one labelled `label` on its first call.
// The callback refers to this object, which must outlive its calls.
class LazyProgress {
 public:
  explicit LazyProgress(std::string label) : label_(std::move(label)) {}
  std::function<void(uint64_t, uint64_t)> Callback();
  // Ends the progress line, if one was started.
  void Finish();

 private:
  std::string label_;
  std::unique_ptr<Progress> progress_;
};

// The progress of an operation of ckpt/ops/ as bars on stderr (Progress):
// one bar per phase, labelled `label(phase)`, started by the phase's first
// update and finished by its last (or by Finish). The callback refers to
// this object, which must outlive its calls; the operation serializes them.
class ProgressBars {
 public:
  explicit ProgressBars(
      std::function<std::string(absl::string_view phase)> label)
      : label_(std::move(label)) {}
  ops::ProgressFn Callback();
  // Ends the current bar, if one was started.
  void Finish();

 private:
  std::function<std::string(absl::string_view)> label_;
  uint64_t done_ = 0;
  std::unique_ptr<Progress> progress_;  // the phase's bar; null between phases
};

// The body of a tool's main(): parses `argc/argv` with `app` (which must
// already declare its options; --version is added here), then runs `run`.
//   --help                       -> help on stdout, exit 0
//   --version                    -> VersionText on stdout, exit 0
//   parse error                  -> "TOOL: error: MSG" + hint on stderr, exit 2
//   run() returns an error        -> "TOOL: error: MSG" on stderr, exit 2
//   run() returns a code          -> that code
//   an allocation fails (any thread)
//                                -> "TOOL: error: out of memory ..." on
//                                   stderr, exit 2 (never std::terminate)
// What run() prints on std::cout passes through an EscapingStreambuf and
// error messages through EscapeText (escaped_output.h): no control byte,
// C1 control or invalid UTF-8 reaches the terminal.
int RunToolMain(CLI::App& app, int argc, char** argv,
                const std::function<absl::StatusOr<int>()>& run);

// Prints "TOOL: error: MSG" on stderr, MSG on one line through EscapeText.
void PrintError(absl::string_view tool, const absl::Status& status);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_COMMON_TOOL_UTIL_H_

#include "common/tool_util.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <new>
#include <stdexcept>
#include <system_error>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/version.h"
#include "common/escaped_output.h"

namespace ckpt::tools {
namespace {
std::atomic<bool> g_progress_disabled{false};

// "TOOL: error: out of memory ...\n", built before run() so that reporting a
// failed allocation allocates nothing.
char g_oom_line[256];

void SetOutOfMemoryLine(const std::string& tool) {
  std::snprintf(g_oom_line, sizeof(g_oom_line),
                "%s: error: out of memory (an allocation failed)\n",
                tool.c_str());
}

// The new-handler of a tool: any thread's failed allocation is a one-line
// error and exit 2, never std::terminate (exit 134) from a worker thread.
[[noreturn]] void ExitOutOfMemory() {
  ssize_t unused = write(STDERR_FILENO, g_oom_line, std::strlen(g_oom_line));
  (void)unused;
  _exit(kExitError);
}

// run() on this thread; an allocation that throws rather than reaching the
// new-handler (an array size that overflows, a container's max_size
// exceeded) is the same one-line error.
absl::StatusOr<int> RunCatchingAllocationFailure(
    const std::function<absl::StatusOr<int>()>& run) {
  try {
    return run();
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  } catch (const std::system_error& e) {
    // A thread whose stack could not be mapped (EAGAIN under ulimit -v).
    if (e.code() != std::errc::resource_unavailable_try_again) throw;
    return absl::ResourceExhaustedError(
        "out of memory (a thread could not start)");
  }
  return absl::ResourceExhaustedError("out of memory (an allocation failed)");
}
}  // namespace

std::string VersionText(absl::string_view tool) {
  return absl::StrFormat("%s %s (ckpt library %s, format v%d.%d)", tool,
                         CKPT_VERSION_STRING, CKPT_VERSION_STRING,
                         format::kFormatMajor, format::kFormatMinor);
}

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrFormat("%d B", bytes);
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  // Three significant digits; rounding may carry into the next unit.
  if (v >= 999.5 && u < 6) {
    v /= 1024;
    ++u;
  }
  int decimals = v < 9.995 ? 2 : (v < 99.95 ? 1 : 0);
  return absl::StrFormat("%.*f %s", decimals, v, kUnits[u]);
}

Progress::Progress(std::string label, uint64_t total)
    : label_(std::move(label)),
      total_(total),
      enabled_(!g_progress_disabled.load() && isatty(STDERR_FILENO)),
      last_(std::chrono::steady_clock::now() - std::chrono::seconds(1)) {}

Progress::~Progress() { Finish(); }

void Progress::DisableForTesting() { g_progress_disabled = true; }

void Progress::Add(uint64_t done) {
  done_ += done;
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  Draw(false);
}

void Progress::Finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_) Draw(true);
}

std::function<void(uint64_t, uint64_t)> LazyProgress::Callback() {
  return [this](uint64_t done, uint64_t total) {
    if (!progress_) progress_ = std::make_unique<Progress>(label_, total);
    progress_->Add(done);
  };
}

void LazyProgress::Finish() {
  if (progress_) progress_->Finish();
}

ops::ProgressFn ProgressBars::Callback() {
  return [this](const ops::ProgressUpdate& u) {
    if (progress_ == nullptr) {
      progress_ = std::make_unique<Progress>(label_(u.phase), u.total);
      done_ = 0;
    }
    if (u.done > done_) progress_->Add(u.done - done_);
    done_ = u.done;
    if (u.finished) Finish();
  };
}

void ProgressBars::Finish() {
  if (progress_) progress_->Finish();
  progress_.reset();
}

void Progress::Draw(bool final) {
  constexpr int kWidth = 30;
  double frac =
      total_ == 0 ? 1.0 : std::min(1.0, static_cast<double>(done_) / total_);
  int full = static_cast<int>(frac * kWidth);
  std::string bar(full, '=');
  if (full < kWidth) bar += '>';
  bar.resize(kWidth, ' ');
  std::string line = absl::StrFormat("\r%s [%s] %3d%% %s/%s", label_, bar,
                                     static_cast<int>(frac * 100),
                                     HumanBytes(done_), HumanBytes(total_));
  if (final) line += "\n";
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

void PrintError(absl::string_view tool, const absl::Status& status) {
  // One line, whatever file content the message quotes unescaped.
  std::string msg = EscapeText(status.message());
  if (msg.empty()) msg = EscapeText(status.ToString());
  std::fprintf(stderr, "%.*s: error: %s\n", static_cast<int>(tool.size()),
               tool.data(), msg.c_str());
}

int RunToolMain(CLI::App& app, int argc, char** argv,
                const std::function<absl::StatusOr<int>()>& run) {
  const std::string tool = app.get_name();
  app.set_version_flag("--version", VersionText(tool),
                       "Print the tool, library and format version");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    std::cout << app.help();
    return kExitOk;
  } catch (const CLI::CallForAllHelp& e) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << "\n";
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s\nRun '%s --help' for usage.\n",
                 tool.c_str(), EscapeText(e.what()).c_str(), tool.c_str());
    return kExitError;
  }
  SetOutOfMemoryLine(tool);
  std::set_new_handler(ExitOutOfMemory);
  absl::StatusOr<int> code;
  {
    // The last line of defence of escaped_output.h: what run() prints on
    // stdout is escaped line by line.
    ScopedEscapedStream escaped(std::cout);
    code = RunCatchingAllocationFailure(run);
  }
  if (!code.ok()) {
    PrintError(tool, code.status());
    return kExitError;
  }
  return *code;
}

}  // namespace ckpt::tools

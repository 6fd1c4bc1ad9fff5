// ops/: the operations on whole checkpoints that the command-line tools and
// the Python package run: validate, diff, reshard, inspect's summary and
// value statistics. Options in, a report struct or a Status out; no command
// line, no printing, no JSON (tools/<tool>/ prints what these return).
//
// Progress of a long operation is reported through a callback, so that a
// tool can draw a bar and a library caller can log or ignore it.
#ifndef CKPT_OPS_PROGRESS_H_
#define CKPT_OPS_PROGRESS_H_

#include <cstdint>
#include <functional>

#include "absl/strings/string_view.h"

namespace ckpt::ops {

// One report of an operation's progress: `done` of `total` bytes of the
// work `phase` ("verifying", "comparing", "writing") are done.
struct ProgressUpdate {
  absl::string_view phase;
  uint64_t done = 0;
  uint64_t total = 0;
  bool finished = false;  // the last update of this phase
};

// Called as an operation goes. A phase begins with an update of done == 0,
// `done` then grows, and it ends with an update that is `finished` (done
// may stay below total when part of the work failed); a later phase begins
// anew. Calls are serialized (never two at once) but may come from any of
// the operation's threads; the callback must not call back into the
// operation. Unset: no progress is reported.
using ProgressFn = std::function<void(const ProgressUpdate&)>;

// Phases of the operations below.
inline constexpr char kPhaseVerifying[] = "verifying";  // Validate's payload
inline constexpr char kPhaseComparing[] = "comparing";  // Diff's values
inline constexpr char kPhaseWriting[] = "writing";      // Reshard's output

}  // namespace ckpt::ops

#endif  // CKPT_OPS_PROGRESS_H_

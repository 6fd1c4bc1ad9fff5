// Validate: checks a checkpoint on disk against spec/FORMAT.md and reports
// every problem it finds, not only the first (what ckpt-validate prints and
// ckpt.validate returns).
//
//   ckpt::ops::ValidateOptions o;
//   o.path = "/ckpt/run1";  // a root (latest is followed) or a checkpoint
//   auto report = ckpt::ops::Validate(o);
//   if (report.ok() && !report->findings.empty()) { ... }
//
// What is checked (spec sections in brackets):
//  - under a root: the `latest` pointer [§4.2] (broken, or naming a
//    directory that is not a committed checkpoint), and stray `.tmp-*`
//    entries left by interrupted saves [§4, §4.1];
//  - the manifest [§6.2 steps 1-12] and the coverage of every entry, each
//    on its own [§8.5];
//  - every shard file listed in SHARDS, each opened on its own: presence,
//    size [§5.6], header, tail and index [§5.1, §5.4, §5.5], checkpoint id
//    and shard id against the manifest, CHECKPOINT_INFO and METADATA
//    against the manifest's [§5.6], entries and chunks equal to the
//    manifest's in both directions [§8.6], payloads that do not overlap
//    [§5.2]; when every shard opened, entries without any chunk listed by
//    some index [§5.7];
//  - unless `quick`: every block of every chunk, read with several threads
//    in large sequential reads and verified against its checksum while it
//    is in cache; zstd blocks are also decoded [§5.3]; bool bytes are 0 or
//    1 [§9];
//  - with `check_finite`: NaN and Inf in floating-point tensors.
//
// A problem is a Finding, not an error: Validate returns an error status
// only when it cannot validate at all (see Validate). The checks and their
// messages are libckpt's read core (libckpt/read/: shard_file.h,
// index_check.h), shared with ckpt::Reader; this library collects every problem
// and reports them. A shard that fails to open is reported once and its chunks
// are not read; everything else goes on.
#ifndef CKPT_OPS_VALIDATE_H_
#define CKPT_OPS_VALIDATE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/format/records.h"
#include "ckpt/ops/progress.h"
#include "ckpt/storage.h"

namespace ckpt::ops {

// An error makes the checkpoint invalid (ckpt-validate exits 1). A warning
// concerns the root rather than the checkpoint: a stray temporary entry
// can be a save in progress, so it is shown but does not make the
// checkpoint invalid, unless ValidateOptions::strict.
enum class Severity { kError, kWarning };
absl::string_view SeverityName(Severity s);  // "error", "warning"

// One problem. Fields that do not apply are empty / -1.
struct Finding {
  Severity severity = Severity::kError;
  std::string file;    // full path of the file or directory concerned
  std::string entry;   // entry name
  int64_t chunk = -1;  // index of the chunk in the manifest's entry
  std::string region;  // that chunk's region, "[0:4, 0:8]" or "flat[0:100)"
  int64_t block = -1;  // index of the block in the chunk
  std::string message;
};

// "FILE: block 3 of chunk 1 [4:8, 0:8] of 'w': checksum ...": the finding
// as one line, most specific location first (no severity prefix), through
// format::EscapeText: a name or message that quotes file content can
// neither break the line nor carry a control character.
std::string FindingText(const Finding& f);

struct ValidateOptions {
  std::string path;            // a checkpoint directory, or a root
  bool quick = false;          // metadata only: no payload byte is read
  bool check_finite = false;   // NaN/Inf in floating-point tensors are findings
  bool strict = false;         // warnings make the checkpoint invalid too
  int threads = 0;             // payload readers; 0 = one per hardware thread
  Storage* storage = nullptr;  // not owned; null = POSIX
  ProgressFn on_progress;      // phase kPhaseVerifying: payload bytes read
  // Findings kept; more are counted in ValidateReport::findings_dropped.
  size_t max_findings = 1000;
  // Payloads are read only for entries for which this returns true (all
  // when unset). Metadata is checked for every entry regardless.
  std::function<bool(const std::string& name)> entry_filter;
  // Called with the raw (decoded) bytes of verified payload, a run of whole
  // elements of chunk `chunk` of entry `entry_index` (manifest order)
  // starting at byte `offset` of the chunk. Called concurrently from
  // several threads, never twice for the same bytes; not called with bytes
  // that failed verification. Not called when `quick`.
  std::function<void(size_t entry_index, const format::EntryRecord& entry,
                     size_t chunk, uint64_t offset, absl::string_view raw)>
      on_data;
};

struct ValidateReport {
  std::string root;  // the root given, or "" for a checkpoint directory
  std::string checkpoint_dir;  // the checkpoint validated; "" if none was found
  bool manifest_ok =
      false;  // the manifest decoded (then the fields below are set)
  uint16_t format_minor = 0;
  format::CheckpointInfo info;
  bool quick = false;
  bool check_finite = false;
  bool strict = false;
  uint64_t shards = 0;     // shard files listed
  uint64_t shards_ok = 0;  // shard files whose header, tail and index are valid
  uint64_t entries = 0;
  uint64_t chunks = 0;
  uint64_t payload_bytes = 0;  // stored bytes of all chunks
  uint64_t blocks_verified = 0;
  uint64_t bytes_verified = 0;  // payload bytes read and verified
  double seconds = 0;
  std::vector<Finding> findings;  // sorted by file, entry, chunk, block
  uint64_t findings_dropped = 0;

  size_t errors() const;
  size_t warnings() const;
  // No error (and, when strict, no warning) found. Findings beyond the
  // limit count as errors.
  bool valid() const {
    return errors() == 0 && findings_dropped == 0 &&
           (!strict || warnings() == 0);
  }
};

// Validates the checkpoint at options.path (following `latest` under a
// root) and returns every problem found in the report. Returns an error
// only when there is nothing to validate or it cannot be judged:
//  - NotFound: `path` does not exist, is not a directory, or is neither a
//    checkpoint (no MANIFEST) nor a checkpoint root (no `latest`, no
//    committed step-* directory, no .tmp-* entry);
//  - FailedPrecondition: the manifest is of a newer format version or
//    needs an unknown feature (upgrade ckpt);
//  - InvalidArgument: bad options (quick together with check_finite);
//  - the storage's error when the root or directory cannot be listed.
// Errors reading a checkpoint file (other than the manifest's absence) are
// findings naming the file. Thread-safe; uses up to options.threads threads.
absl::StatusOr<ValidateReport> Validate(const ValidateOptions& options);

}  // namespace ckpt::ops

#endif  // CKPT_OPS_VALIDATE_H_

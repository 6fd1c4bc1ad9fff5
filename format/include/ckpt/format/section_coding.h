// Internal to format/: section framing (spec/FORMAT.md §7) and the encoding
// of sections shared by the manifest and the shard index.
#ifndef CKPT_FORMAT_SECTION_CODING_H_
#define CKPT_FORMAT_SECTION_CODING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/records.h"

namespace ckpt::format::internal {

struct RawSection {
  uint32_t tag = 0;
  uint32_t flags = 0;
  absl::string_view body;
  uint64_t offset = 0;  // of the section header, for messages
};

void PutSection(std::string* dst, uint32_t tag, bool required,
                absl::string_view body);

// Splits `bytes`, the sections of one file of kind `file_kind` ("manifest"
// or "shard index"), into sections and checks their framing in the order of
// spec/FORMAT.md §7. DataLoss: a header or body past the end, reserved flag
// bits; a tag of kKnownSections that is not in `allowed` (the tags this file
// kind may hold), or whose required flag differs from kKnownSections; a tag
// seen twice. A tag v1 does not define is skipped when its required flag is
// clear and FailedPrecondition when it is set. The returned bodies point
// into `bytes`.
absl::StatusOr<std::vector<RawSection>> SplitSections(
    absl::string_view bytes, uint64_t base_offset,
    absl::Span<const uint32_t> allowed, absl::string_view file_kind);

void EncodeCheckpointInfo(const CheckpointInfo& info, std::string* out);
// Ignores bytes after the last field: later minors may append fields (§7.1).
absl::StatusOr<CheckpointInfo> DecodeCheckpointInfo(const RawSection& s);

// DataLoss "section <tag>: N trailing bytes after the last <what>" unless
// `r` has consumed the whole body of `s`.
absl::Status CheckNoTrailingBytes(const RawSection& s, const ByteReader& r,
                                  absl::string_view what);

void EncodeMetadata(const Metadata& md, std::string* out);
// DataLoss also when bytes follow the last pair.
absl::StatusOr<Metadata> DecodeMetadata(const RawSection& s);

void EncodeEntries(const std::vector<EntryRecord>& entries, bool with_blocks,
                   std::string* out);
// Decodes and checks each entry on its own (names, kinds, shapes, chunk
// bounds, block tables) and that nothing follows the last one; cross-entry
// checks are the caller's.
absl::StatusOr<std::vector<EntryRecord>> DecodeEntries(const RawSection& s,
                                                       bool with_blocks);

}  // namespace ckpt::format::internal

#endif  // CKPT_FORMAT_SECTION_CODING_H_

// Internal to format/: section framing (spec/FORMAT.md §7) and the encoding
// of sections shared by the manifest and the shard index.
#ifndef CKPT_FORMAT_SECTION_CODING_H_
#define CKPT_FORMAT_SECTION_CODING_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "format/records.h"

namespace ckpt::format::internal {

struct RawSection {
  uint32_t tag = 0;
  uint32_t flags = 0;
  absl::string_view body;
  uint64_t offset = 0;  // of the section header, for messages
};

void PutSection(std::string* dst, uint32_t tag, bool required,
                absl::string_view body);

// Splits `bytes` into sections. Unknown optional sections are dropped;
// unknown required ones fail with FailedPrecondition; a known tag seen twice,
// reserved flag bits, or framing past the end fail with DataLoss.
// `known` lists the tags the caller understands.
absl::StatusOr<std::vector<RawSection>> SplitSections(
    absl::string_view bytes, uint64_t base_offset,
    const std::vector<uint32_t>& known);

void EncodeCheckpointInfo(const CheckpointInfo& info, std::string* out);
absl::StatusOr<CheckpointInfo> DecodeCheckpointInfo(const RawSection& s);

void EncodeMetadata(const Metadata& md, std::string* out);
absl::StatusOr<Metadata> DecodeMetadata(const RawSection& s);

void EncodeEntries(const std::vector<EntryRecord>& entries, bool with_blocks,
                   std::string* out);
// Decodes and checks each entry on its own (names, kinds, shapes, chunk
// bounds, block tables); cross-entry checks are the caller's.
absl::StatusOr<std::vector<EntryRecord>> DecodeEntries(const RawSection& s,
                                                       bool with_blocks);

}  // namespace ckpt::format::internal

#endif  // CKPT_FORMAT_SECTION_CODING_H_

// Encoding of the MANIFEST file (spec/FORMAT.md §6). The manifest is written
// last; its presence commits a checkpoint.
#ifndef CKPT_FORMAT_MANIFEST_H_
#define CKPT_FORMAT_MANIFEST_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/format/records.h"

namespace ckpt::format {

// Serializes `m`. Sets the zstd feature bit when any chunk uses zstd.
// REQUIRES: `m` is valid (as DecodeManifest would accept it).
std::string EncodeManifest(const Manifest& m);

// Parses and checks a whole manifest file. Errors:
//  - FailedPrecondition: newer major version (reported whenever the first 12
//    bytes hold the magic and a newer major, whatever the file's size),
//    unknown required feature bit, unknown required section;
//  - DataLoss: anything else that is not exactly a valid v1 manifest
//    (truncation, magic, checksum, reserved bits, a section of the wrong
//    file kind or with the wrong required flag, bytes after the last field
//    of a section other than CHECKPOINT_INFO, bad names, chunk outside its
//    tensor, unknown shard, shard table not one file per rank, duplicate
//    entry names, limits, more chunks with elements in an entry than it
//    has elements: they overlap).
// The result takes at most 16 bytes of memory per byte of `bytes`, plus
// the dims of boxes and shapes beyond 4 and names beyond 15 bytes (each
// also on disk); see SECURITY.md "Resource use".
// Messages name the field and, where known, the entry and chunk. Coverage
// (overlap, gaps) is checked separately by ValidateCoverage: it costs more
// and is not needed to list entries.
absl::StatusOr<Manifest> DecodeManifest(absl::string_view bytes);

// DataLoss naming the entry when the chunks of any entry overlap or, for an
// entry not flagged partial, leave elements uncovered, and when an irregular
// layout is too complex to verify (see CheckCover).
absl::Status ValidateCoverage(const Manifest& m);

// Section PLAN of the manifest can be absent; DecodeManifest leaves
// Manifest::plan empty then.

// Required features that `entries` need (kFeatureZstd if any chunk uses it).
uint64_t RequiredFeaturesOf(const std::vector<EntryRecord>& entries);

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_MANIFEST_H_

// Encoding of shard files (spec/FORMAT.md §5): a fixed 64-byte header,
// aligned chunk payloads, the footer index, and a fixed 32-byte tail that
// lets a reader start at the end of the file.
#ifndef CKPT_FORMAT_SHARD_H_
#define CKPT_FORMAT_SHARD_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/format/records.h"

namespace ckpt::format {

// Exactly kShardHeaderSize bytes.
std::string EncodeShardHeader(const ShardHeader& h);
// Parses the first kShardHeaderSize bytes of a shard file (`bytes` may be
// longer). FailedPrecondition for a newer major version, even when fewer
// than kShardHeaderSize (but at least 12) bytes are given; DataLoss for
// truncation, bad magic, checksum, reserved bits, bad alignment.
absl::StatusOr<ShardHeader> DecodeShardHeader(absl::string_view bytes);

// Exactly kShardTailSize bytes.
std::string EncodeShardTail(const ShardTail& t);
// Parses the last kShardTailSize bytes of a shard file of `file_size` bytes
// and checks that the index lies between the header and the tail.
absl::StatusOr<ShardTail> DecodeShardTail(absl::string_view last_bytes,
                                          uint64_t file_size);

std::string EncodeShardIndex(const ShardIndex& index);
// Parses the index bytes located by `tail`, verifying their checksum, and
// checks them against `header`: same checkpoint id, shard id below the world
// size, every chunk in this shard, its payload inside
// [kShardHeaderSize, index_offset) and aligned. DataLoss also for sections
// of the wrong file kind or required flag (tags 3, 4, 6) and for bytes after
// the last field of METADATA or SHARD_CHUNKS.
absl::StatusOr<ShardIndex> DecodeShardIndex(absl::string_view bytes,
                                            const ShardHeader& header,
                                            const ShardTail& tail);

// "shard-00003.ckpt".
std::string ShardFileName(uint32_t shard_id);

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_SHARD_H_

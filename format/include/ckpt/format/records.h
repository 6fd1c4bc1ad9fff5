// Plain structs for the metadata of format v1 (spec/FORMAT.md §6-§8). They
// carry no behaviour; manifest.h and shard.h encode and decode them.
#ifndef CKPT_FORMAT_RECORDS_H_
#define CKPT_FORMAT_RECORDS_H_

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/format/block_table.h"
#include "ckpt/format/dtype.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/geometry.h"

namespace ckpt::format {

using CheckpointId = std::array<uint8_t, 16>;
using Fingerprint = std::array<uint8_t, 16>;

// "0011..ff": 32 lower-case hex digits.
std::string IdToHex(const CheckpointId& id);

// One stored piece of an entry (§8.3). A manifest may hold little else,
// so the record is kept small: 96 bytes on x86-64 (a region of up to two
// dims inline, a one-pointer block table, the narrow fields last), under
// 11 times the smallest chunk record on disk (9 bytes), plus the dims of
// boxes beyond 2 on the heap (SECURITY.md "Resource use").
struct ChunkRecord {
  Region region;
  uint64_t data_offset = 0;    // file offset of the first block
  uint64_t stored_length = 0;  // sum of the blocks' stored sizes
  uint64_t block_size = kDefaultBlockSize;
  BlockTable blocks;   // only in a shard index
  uint32_t shard = 0;  // shard id (= writing rank)
  Codec codec = Codec::kNone;
  friend bool operator==(const ChunkRecord& a, const ChunkRecord& b) {
    return a.region == b.region && a.shard == b.shard &&
           a.data_offset == b.data_offset &&
           a.stored_length == b.stored_length && a.codec == b.codec &&
           a.block_size == b.block_size && a.blocks == b.blocks;
  }
};

inline constexpr uint8_t kEntryFlagPartial = 1;  // chunks need not cover
inline constexpr uint8_t kEntryFlagsKnown = kEntryFlagPartial;

// A tensor or an object (§8.1). An object is a 1-d uint8 entry whose shape
// is its byte length.
struct EntryRecord {
  std::string name;
  EntryKind kind = EntryKind::kTensor;
  DType dtype = DType::kFloat32;
  uint8_t flags = 0;
  Shape shape;
  std::vector<ChunkRecord> chunks;
  friend bool operator==(const EntryRecord& a, const EntryRecord& b) {
    return a.name == b.name && a.kind == b.kind && a.dtype == b.dtype &&
           a.flags == b.flags && a.shape == b.shape && a.chunks == b.chunks;
  }
};

// Section CHECKPOINT_INFO (§7.1), in the manifest and in every shard index.
struct CheckpointInfo {
  CheckpointId id{};
  uint64_t step = 0;
  uint32_t world_size = 1;
  int64_t created_unix_ns = 0;
  Fingerprint fingerprint{};
  std::string writer;  // e.g. "ckpt 0.1.0"; informational
  friend bool operator==(const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.id == b.id && a.step == b.step && a.world_size == b.world_size &&
           a.created_unix_ns == b.created_unix_ns &&
           a.fingerprint == b.fingerprint && a.writer == b.writer;
  }
};

// Section SHARDS (§7.3).
struct ShardInfo {
  uint32_t shard_id = 0;
  std::string file_name;
  uint64_t file_size = 0;
  friend bool operator==(const ShardInfo& a, const ShardInfo& b) {
    return a.shard_id == b.shard_id && a.file_name == b.file_name &&
           a.file_size == b.file_size;
  }
};

using Metadata = std::vector<std::pair<std::string, std::string>>;

// The MANIFEST file (§6).
struct Manifest {
  uint16_t minor_version = kFormatMinor;
  uint64_t required_features = 0;
  uint64_t optional_features = 0;
  CheckpointInfo info;
  Metadata metadata;
  std::vector<ShardInfo> shards;
  std::vector<EntryRecord> entries;  // chunks carry no block tables
  std::string plan;                  // section PLAN, empty when absent
  friend bool operator==(const Manifest& a, const Manifest& b) {
    return a.minor_version == b.minor_version &&
           a.required_features == b.required_features &&
           a.optional_features == b.optional_features && a.info == b.info &&
           a.metadata == b.metadata && a.shards == b.shards &&
           a.entries == b.entries && a.plan == b.plan;
  }
};

// Fixed header of a shard file (§5.1).
struct ShardHeader {
  uint16_t minor_version = kFormatMinor;
  CheckpointId checkpoint_id{};
  uint32_t shard_id = 0;
  uint32_t alignment = kDefaultAlignment;
  friend bool operator==(const ShardHeader& a, const ShardHeader& b) {
    return a.minor_version == b.minor_version &&
           a.checkpoint_id == b.checkpoint_id && a.shard_id == b.shard_id &&
           a.alignment == b.alignment;
  }
};

// Fixed tail of a shard file (§5.4).
struct ShardTail {
  uint64_t index_offset = 0;
  uint64_t index_length = 0;
  uint64_t index_checksum = 0;
  friend bool operator==(const ShardTail& a, const ShardTail& b) {
    return a.index_offset == b.index_offset &&
           a.index_length == b.index_length &&
           a.index_checksum == b.index_checksum;
  }
};

// The footer index of a shard file (§5.5): everything needed to rebuild the
// manifest's view of this shard.
struct ShardIndex {
  uint64_t required_features = 0;
  CheckpointInfo info;
  Metadata metadata;
  // Whether the index has a METADATA section, even one with no pairs
  // (§5.6 compares a present section with the manifest's). Encoding writes
  // the section when this is set or `metadata` is not empty, and == treats
  // the two alike.
  bool metadata_present = false;
  std::vector<EntryRecord> entries;  // chunks carry block tables
  friend bool operator==(const ShardIndex& a, const ShardIndex& b) {
    return a.required_features == b.required_features && a.info == b.info &&
           a.metadata == b.metadata &&
           (a.metadata_present || !a.metadata.empty()) ==
               (b.metadata_present || !b.metadata.empty()) &&
           a.entries == b.entries;
  }
};

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_RECORDS_H_

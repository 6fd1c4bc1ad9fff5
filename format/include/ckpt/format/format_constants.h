// Constants of on-disk format v1, shared by reader and writer. Each group
// names the section of spec/FORMAT.md it implements; a change here is a
// change of format (see the spec's changelog).
#ifndef CKPT_FORMAT_FORMAT_CONSTANTS_H_
#define CKPT_FORMAT_FORMAT_CONSTANTS_H_

#include <cstdint>

namespace ckpt::format {

// §2 Versioning. Readers reject a newer major version; any minor is read.
inline constexpr uint16_t kFormatMajor = 1;
inline constexpr uint16_t kFormatMinor = 0;

// §3 Magic numbers: 0x89 (non-ASCII, catches 7-bit transfers), "CKPT", a
// kind letter, CR LF (catches newline conversion). Each file kind has the
// same magic at both ends.
inline constexpr char kShardMagic[8] = {'\x89', 'C', 'K',  'P',
                                        'T',    'S', '\r', '\n'};
inline constexpr char kManifestMagic[8] = {'\x89', 'C', 'K',  'P',
                                           'T',    'M', '\r', '\n'};
inline constexpr int kMagicSize = 8;

// §4 Directory layout.
inline constexpr char kManifestFileName[] = "MANIFEST";
inline constexpr char kLatestFileName[] = "latest";
inline constexpr char kStepDirPrefix[] = "step-";
inline constexpr char kTempDirPrefix[] = ".tmp-";
inline constexpr char kShardFilePrefix[] = "shard-";
inline constexpr char kShardFileSuffix[] = ".ckpt";
inline constexpr char kLatestPrefix[] = "ckpt-latest v1 ";

// §5 Shard file: fixed header and tail.
inline constexpr int kShardHeaderSize = 64;
inline constexpr int kShardTailSize = 32;

// §6 Manifest: fixed header and tail.
inline constexpr int kManifestHeaderSize = 32;
inline constexpr int kManifestTailSize = 16;

// §7 Sections (manifest body and shard index).
inline constexpr int kSectionHeaderSize = 16;
inline constexpr uint32_t kSectionFlagRequired = 1u;
inline constexpr uint32_t kSectionFlagsKnown = kSectionFlagRequired;
enum SectionTag : uint32_t {
  kSectionCheckpointInfo = 1,
  kSectionMetadata = 2,
  kSectionShards = 3,
  kSectionEntries = 4,      // manifest: entries without block tables
  kSectionShardChunks = 5,  // shard index: entries with block tables
  kSectionPlan = 6,         // manifest: cached save plan (optional)
};

// §7 The tags v1 defines and the value their required flag MUST have. Which
// of them a file kind allows is up to its decoder (§5.5, §6.1).
struct KnownSection {
  uint32_t tag;
  const char* name;
  bool required;
};
inline constexpr KnownSection kKnownSections[] = {
    {kSectionCheckpointInfo, "CHECKPOINT_INFO", true},
    {kSectionMetadata, "METADATA", false},
    {kSectionShards, "SHARDS", true},
    {kSectionEntries, "ENTRIES", true},
    {kSectionShardChunks, "SHARD_CHUNKS", true},
    {kSectionPlan, "PLAN", false},
};

// §2 Feature bits. Required: a reader that does not implement a set bit
// MUST refuse the file. Optional: MAY be ignored.
inline constexpr uint64_t kFeatureZstd = 1ull << 0;  // required
inline constexpr uint64_t kKnownRequiredFeatures = kFeatureZstd;

// §8 Entry and chunk encodings.
enum class EntryKind : uint8_t { kTensor = 1, kObject = 2 };
enum class GeometryKind : uint8_t { kBox = 1, kFlat = 2 };
enum class Codec : uint8_t { kNone = 0, kZstd = 1 };

// §10 Limits.
inline constexpr uint64_t kMaxDims = 32;
inline constexpr uint64_t kMaxNameLength = 1024;
inline constexpr uint64_t kMaxMetadataEntries = 1u << 16;
inline constexpr uint64_t kMaxMetadataValueLength = 1u << 20;
inline constexpr uint64_t kMaxEntries = 1u << 24;
inline constexpr uint64_t kMaxChunksPerEntry = 1u << 24;
inline constexpr uint64_t kMaxShards = 1u << 20;
inline constexpr uint64_t kMaxManifestSize = 1ull << 32;
inline constexpr uint64_t kMaxIndexSize = 1ull << 32;
inline constexpr uint64_t kMinBlockSize = 4096;
inline constexpr uint64_t kMaxBlockSize = 1ull << 30;
inline constexpr uint64_t kMaxAlignment = 1ull << 30;
inline constexpr uint64_t kMaxFileNameLength = 255;

// Defaults used by writers (recorded in the files, so readers need none).
inline constexpr uint64_t kDefaultBlockSize = 1ull << 20;
inline constexpr uint64_t kDefaultAlignment = 4096;

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_FORMAT_CONSTANTS_H_

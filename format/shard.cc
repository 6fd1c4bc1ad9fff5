#include "ckpt/format/shard.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/format/checksum.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/names.h"
#include "ckpt/format/section_coding.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::format {

using internal::RawSection;

std::string ShardFileName(uint32_t shard_id) {
  return absl::StrFormat("%s%05d%s", kShardFilePrefix, shard_id,
                         kShardFileSuffix);
}

std::string EncodeShardHeader(const ShardHeader& h) {
  std::string out;
  out.append(kShardMagic, kMagicSize);
  PutFixed16(&out, kFormatMajor);
  PutFixed16(&out, h.minor_version);
  PutFixed32(&out, 0);
  out.append(reinterpret_cast<const char*>(h.checkpoint_id.data()), 16);
  PutFixed32(&out, h.shard_id);
  PutFixed32(&out, h.alignment);
  out.append(16, '\0');
  PutFixed64(&out, Checksum(out));
  return out;
}

namespace {

absl::Status TruncatedShardHeader(absl::string_view bytes) {
  return absl::DataLossError(
      absl::StrFormat("shard header: truncated: %d bytes, %d needed",
                      bytes.size(), kShardHeaderSize));
}

// §2 stable prefix: magic and major come before the v1 size, so a newer
// major is Unsupported even when its header is shorter. Fills the minor
// version of `h`.
absl::Status CheckShardHeaderPrefix(absl::string_view bytes, ShardHeader* h) {
  if (bytes.size() < kMagicSize + 4) return TruncatedShardHeader(bytes);
  if (std::memcmp(bytes.data(), kShardMagic, kMagicSize) != 0) {
    return absl::DataLossError(
        "shard header: bad magic at offset 0: not a ckpt shard file");
  }
  uint16_t major = LoadFixed16(bytes.data() + 8);
  h->minor_version = LoadFixed16(bytes.data() + 10);
  if (major > kFormatMajor) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "shard header: format version %d.%d is newer than this reader supports "
        "(%d.x); upgrade ckpt",
        major, h->minor_version, kFormatMajor));
  }
  if (major != kFormatMajor) {
    return absl::DataLossError(absl::StrFormat(
        "shard header: format major version %d is invalid (expected %d)", major,
        kFormatMajor));
  }
  return absl::OkStatus();
}

// The checksum and the reserved fields of a whole v1 header (spec §5.1).
absl::Status CheckShardHeaderIntegrity(absl::string_view bytes) {
  uint64_t stored = LoadFixed64(bytes.data() + 56);
  uint64_t actual = Checksum(bytes.data(), 56);
  if (stored != actual) {
    return absl::DataLossError(absl::StrFormat(
        "shard header: checksum 0x%016x != 0x%016x (stored != computed)",
        stored, actual));
  }
  uint32_t flags = LoadFixed32(bytes.data() + 12);
  if (flags != 0) {
    return absl::DataLossError(absl::StrFormat(
        "shard header: reserved field at offset 12 is 0x%x, must be 0", flags));
  }
  for (int i = 40; i < 56; ++i) {
    if (bytes[i] != 0) {
      return absl::DataLossError(absl::StrFormat(
          "shard header: reserved byte at offset %d is 0x%02x, must be 0", i,
          static_cast<unsigned char>(bytes[i])));
    }
  }
  return absl::OkStatus();
}

// The checkpoint id, shard id and alignment, checked (spec §5.1).
absl::Status DecodeShardHeaderFields(absl::string_view bytes, ShardHeader* h) {
  std::memcpy(h->checkpoint_id.data(), bytes.data() + 16, 16);
  h->shard_id = LoadFixed32(bytes.data() + 32);
  h->alignment = LoadFixed32(bytes.data() + 36);
  if (h->shard_id >= kMaxShards) {
    return absl::DataLossError(
        absl::StrFormat("shard header: shard id %d exceeds the limit %d",
                        h->shard_id, kMaxShards - 1));
  }
  if (h->alignment == 0 || (h->alignment & (h->alignment - 1)) != 0 ||
      h->alignment > kMaxAlignment) {
    return absl::DataLossError(absl::StrFormat(
        "shard header: alignment %d is not a power of two in [1, %d]",
        h->alignment, kMaxAlignment));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ShardHeader> DecodeShardHeader(absl::string_view bytes) {
  ShardHeader h;
  CKPT_RETURN_IF_ERROR(CheckShardHeaderPrefix(bytes, &h));
  if (bytes.size() < kShardHeaderSize) return TruncatedShardHeader(bytes);
  CKPT_RETURN_IF_ERROR(CheckShardHeaderIntegrity(bytes));
  CKPT_RETURN_IF_ERROR(DecodeShardHeaderFields(bytes, &h));
  return h;
}

std::string EncodeShardTail(const ShardTail& t) {
  std::string out;
  PutFixed64(&out, t.index_offset);
  PutFixed64(&out, t.index_length);
  PutFixed64(&out, t.index_checksum);
  out.append(kShardMagic, kMagicSize);
  return out;
}

absl::StatusOr<ShardTail> DecodeShardTail(absl::string_view last_bytes,
                                          uint64_t file_size) {
  if (file_size < kShardHeaderSize + kShardTailSize ||
      last_bytes.size() < kShardTailSize) {
    return absl::DataLossError(absl::StrFormat(
        "shard tail: truncated: file is %d bytes, at least %d needed",
        file_size, kShardHeaderSize + kShardTailSize));
  }
  const char* p = last_bytes.data() + last_bytes.size() - kShardTailSize;
  if (std::memcmp(p + 24, kShardMagic, kMagicSize) != 0) {
    return absl::DataLossError(
        absl::StrFormat("shard tail: bad magic at offset %d (end of file): "
                        "truncated or extended",
                        file_size - kMagicSize));
  }
  ShardTail t;
  t.index_offset = LoadFixed64(p);
  t.index_length = LoadFixed64(p + 8);
  t.index_checksum = LoadFixed64(p + 16);
  const uint64_t tail_at = file_size - kShardTailSize;
  if (t.index_offset < kShardHeaderSize || t.index_offset > tail_at ||
      t.index_length != tail_at - t.index_offset) {
    return absl::DataLossError(absl::StrFormat(
        "shard tail: index at [%d, +%d) does not end at the tail (offset %d)",
        t.index_offset, t.index_length, tail_at));
  }
  if (t.index_length > kMaxIndexSize) {
    return absl::DataLossError(
        absl::StrFormat("shard tail: index of %d bytes exceeds the limit %d",
                        t.index_length, kMaxIndexSize));
  }
  return t;
}

std::string EncodeShardIndex(const ShardIndex& index) {
  std::string out;
  PutFixed64(&out, index.required_features | RequiredFeaturesOf(index.entries));
  PutFixed64(&out, 0);  // optional features
  std::string body;
  internal::EncodeCheckpointInfo(index.info, &body);
  internal::PutSection(&out, kSectionCheckpointInfo, true, body);
  if (!index.metadata.empty() || index.metadata_present) {
    body.clear();
    internal::EncodeMetadata(index.metadata, &body);
    internal::PutSection(&out, kSectionMetadata, false, body);
  }
  body.clear();
  internal::EncodeEntries(index.entries, /*with_blocks=*/true, &body);
  internal::PutSection(&out, kSectionShardChunks, true, body);
  return out;
}

namespace {

// The index's sections (spec §7), each decoded by its codec;
// CHECKPOINT_INFO and SHARD_CHUNKS must be present. Errors unannotated.
absl::Status DecodeIndexSections(absl::string_view sections_bytes,
                                 uint64_t file_offset, ShardIndex* index) {
  auto sections = internal::SplitSections(
      sections_bytes, file_offset,
      {kSectionCheckpointInfo, kSectionMetadata, kSectionShardChunks},
      "shard index");
  if (!sections.ok()) return sections.status();
  bool have_info = false, have_chunks = false;
  for (const RawSection& s : *sections) {
    if (s.tag == kSectionCheckpointInfo) {
      CKPT_ASSIGN_OR_RETURN(index->info, internal::DecodeCheckpointInfo(s));
      have_info = true;
    } else if (s.tag == kSectionMetadata) {
      CKPT_ASSIGN_OR_RETURN(index->metadata, internal::DecodeMetadata(s));
      index->metadata_present = true;
    } else if (s.tag == kSectionShardChunks) {
      CKPT_ASSIGN_OR_RETURN(index->entries,
                            internal::DecodeEntries(s, /*with_blocks=*/true));
      have_chunks = true;
    }
  }
  if (!have_info || !have_chunks) {
    return absl::DataLossError(
        absl::StrCat("missing required section ",
                     !have_info ? "CHECKPOINT_INFO (1)" : "SHARD_CHUNKS (5)"));
  }
  return absl::OkStatus();
}

// Every chunk of the index is this file's, inside its payload area and
// aligned as the header says. Errors unannotated.
absl::Status CheckIndexChunks(const ShardIndex& index,
                              const ShardHeader& header,
                              const ShardTail& tail) {
  for (const EntryRecord& e : index.entries) {
    for (size_t i = 0; i < e.chunks.size(); ++i) {
      const ChunkRecord& c = e.chunks[i];
      std::string where =
          absl::StrCat("entry '", EscapeText(e.name), "': chunk ", i, ": ");
      if (c.shard != header.shard_id) {
        return absl::DataLossError(absl::StrCat(
            where, "shard id ", c.shard, " != this file's ", header.shard_id));
      }
      if (c.stored_length == 0) continue;
      if (c.data_offset < kShardHeaderSize ||
          c.data_offset > tail.index_offset ||
          c.stored_length > tail.index_offset - c.data_offset) {
        return absl::DataLossError(absl::StrCat(
            where, "bytes [", c.data_offset, ", ",
            c.data_offset + c.stored_length, ") lie outside the payload area [",
            kShardHeaderSize, ", ", tail.index_offset, ")"));
      }
      if (c.data_offset % header.alignment != 0) {
        return absl::DataLossError(
            absl::StrCat(where, "data offset ", c.data_offset,
                         " is not aligned to ", header.alignment));
      }
    }
  }
  return absl::OkStatus();
}

// Length, checksum and feature bits (spec §5.5), then the sections and the
// checks that tie the index to its header.
absl::StatusOr<ShardIndex> DecodeShardIndexUnannotated(
    absl::string_view bytes, const ShardHeader& header, const ShardTail& tail) {
  if (bytes.size() != tail.index_length) {
    return absl::DataLossError(absl::StrFormat(
        "%d bytes given, tail says %d", bytes.size(), tail.index_length));
  }
  uint64_t actual = Checksum(bytes);
  if (actual != tail.index_checksum) {
    return absl::DataLossError(
        absl::StrFormat("checksum 0x%016x != 0x%016x (stored != computed)",
                        tail.index_checksum, actual));
  }
  ShardIndex index;
  ByteReader r(bytes, tail.index_offset);
  CKPT_ASSIGN_OR_RETURN(index.required_features, r.Read64("required features"));
  CKPT_RETURN_IF_ERROR(r.Read64("optional features").status());
  if ((index.required_features & ~kKnownRequiredFeatures) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "unknown required feature bits 0x%x; written by a newer ckpt",
        index.required_features & ~kKnownRequiredFeatures));
  }
  CKPT_RETURN_IF_ERROR(
      DecodeIndexSections(bytes.substr(16), tail.index_offset + 16, &index));
  if (index.info.id != header.checkpoint_id) {
    return absl::DataLossError(
        absl::StrCat("checkpoint id ", IdToHex(index.info.id), " != header's ",
                     IdToHex(header.checkpoint_id)));
  }
  if (header.shard_id >= index.info.world_size) {
    return absl::DataLossError(absl::StrCat("shard id ", header.shard_id,
                                            " is not below the world size ",
                                            index.info.world_size));
  }
  if (RequiredFeaturesOf(index.entries) & ~index.required_features) {
    return absl::DataLossError(
        "a chunk uses zstd but feature bit 0 (zstd) is not set");
  }
  CKPT_RETURN_IF_ERROR(CheckIndexChunks(index, header, tail));
  return index;
}

}  // namespace

absl::StatusOr<ShardIndex> DecodeShardIndex(absl::string_view bytes,
                                            const ShardHeader& header,
                                            const ShardTail& tail) {
  absl::StatusOr<ShardIndex> index =
      DecodeShardIndexUnannotated(bytes, header, tail);
  if (!index.ok()) return Annotate(index.status(), "shard index");
  return index;
}

}  // namespace ckpt::format

#include "ckpt/format/manifest.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/format/checksum.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/coverage.h"
#include "ckpt/format/names.h"
#include "ckpt/format/section_coding.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::format {

using internal::RawSection;

std::string IdToHex(const CheckpointId& id) {
  std::string s;
  for (uint8_t b : id) absl::StrAppendFormat(&s, "%02x", b);
  return s;
}

uint64_t RequiredFeaturesOf(const std::vector<EntryRecord>& entries) {
  for (const EntryRecord& e : entries) {
    for (const ChunkRecord& c : e.chunks) {
      if (c.codec == Codec::kZstd) return kFeatureZstd;
    }
  }
  return 0;
}

std::string EncodeManifest(const Manifest& m) {
  std::string out;
  out.append(kManifestMagic, kMagicSize);
  PutFixed16(&out, kFormatMajor);
  PutFixed16(&out, m.minor_version);
  PutFixed32(&out, 0);
  PutFixed64(&out, m.required_features | RequiredFeaturesOf(m.entries));
  PutFixed64(&out, m.optional_features);
  std::string body;
  internal::EncodeCheckpointInfo(m.info, &body);
  internal::PutSection(&out, kSectionCheckpointInfo, true, body);
  if (!m.metadata.empty()) {
    body.clear();
    internal::EncodeMetadata(m.metadata, &body);
    internal::PutSection(&out, kSectionMetadata, false, body);
  }
  body.clear();
  PutVarint(&body, m.shards.size());
  for (const ShardInfo& s : m.shards) {
    PutVarint(&body, s.shard_id);
    PutString(&body, s.file_name);
    PutVarint(&body, s.file_size);
  }
  internal::PutSection(&out, kSectionShards, true, body);
  body.clear();
  internal::EncodeEntries(m.entries, /*with_blocks=*/false, &body);
  internal::PutSection(&out, kSectionEntries, true, body);
  if (!m.plan.empty()) internal::PutSection(&out, kSectionPlan, false, m.plan);
  PutFixed64(&out, Checksum(out));
  out.append(kManifestMagic, kMagicSize);
  return out;
}

namespace {

// "duplicate shard id" or "duplicate shard file name" unless both are
// unique. Sorts arrays of 4-byte indices: hash sets of the ids and names
// took more memory than the records on disk (up to 2^20 of 4 bytes).
absl::Status CheckUniqueShards(const std::vector<ShardInfo>& shards) {
  std::vector<uint32_t> order(shards.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
  auto sorted_by = [&](auto key) {
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      return std::make_pair(key(shards[a]), a) <
             std::make_pair(key(shards[b]), b);
    });
  };
  sorted_by([](const ShardInfo& x) { return x.shard_id; });
  for (size_t k = 1; k < order.size(); ++k) {
    if (shards[order[k]].shard_id == shards[order[k - 1]].shard_id) {
      return absl::DataLossError(
          absl::StrCat("duplicate shard id ", shards[order[k]].shard_id));
    }
  }
  sorted_by(
      [](const ShardInfo& x) -> absl::string_view { return x.file_name; });
  for (size_t k = 1; k < order.size(); ++k) {
    if (shards[order[k]].file_name == shards[order[k - 1]].file_name) {
      return absl::DataLossError(absl::StrCat("duplicate shard file name '",
                                              shards[order[k]].file_name, "'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ShardInfo>> DecodeShards(const RawSection& s) {
  ByteReader r(s.body, s.offset + kSectionHeaderSize);
  CKPT_ASSIGN_OR_RETURN(uint64_t n,
                        r.ReadVarintAtMost("shard count", kMaxShards));
  std::vector<ShardInfo> shards;
  // A record takes at least 4 bytes: id, name length, name, file size.
  shards.reserve(std::min<uint64_t>(n, r.remaining() / 4));
  for (uint64_t i = 0; i < n; ++i) {
    ShardInfo si;
    CKPT_ASSIGN_OR_RETURN(uint64_t id,
                          r.ReadVarintAtMost("shard id", kMaxShards - 1));
    si.shard_id = static_cast<uint32_t>(id);
    CKPT_ASSIGN_OR_RETURN(auto name,
                          r.ReadString("shard file name", kMaxFileNameLength));
    si.file_name = std::string(name);
    CKPT_ASSIGN_OR_RETURN(si.file_size, r.ReadVarint("shard file size"));
    absl::Status fs = ValidateFileName(si.file_name);
    if (!fs.ok()) {
      return absl::DataLossError(
          absl::StrCat("shard ", si.shard_id, ": ", fs.message()));
    }
    if (si.file_size < kShardHeaderSize + kShardTailSize) {
      return absl::DataLossError(
          absl::StrCat("shard ", si.shard_id, ": file size ", si.file_size,
                       " is smaller than a header and a tail (",
                       kShardHeaderSize + kShardTailSize, ")"));
    }
    shards.push_back(std::move(si));
  }
  CKPT_RETURN_IF_ERROR(internal::CheckNoTrailingBytes(s, r, "shard"));
  CKPT_RETURN_IF_ERROR(CheckUniqueShards(shards));
  return shards;
}

constexpr uint64_t kMinManifestSize = kManifestHeaderSize + kManifestTailSize;

// §2 stable prefix: magic and major come before every check that depends
// on the v1 layout, so a newer major is Unsupported whatever its size.
// Fills the minor version of `m`.
absl::Status CheckManifestPrefix(absl::string_view bytes, Manifest* m) {
  constexpr size_t kPrefix = kMagicSize + 4;
  if (bytes.size() < kPrefix) {
    return absl::DataLossError(
        absl::StrFormat("manifest: truncated: %d bytes, at least %d needed",
                        bytes.size(), kMinManifestSize));
  }
  if (std::memcmp(bytes.data(), kManifestMagic, kMagicSize) != 0) {
    return absl::DataLossError(
        "manifest: bad magic at offset 0: not a ckpt manifest");
  }
  uint16_t major = LoadFixed16(bytes.data() + 8);
  m->minor_version = LoadFixed16(bytes.data() + 10);
  if (major == kFormatMajor) return absl::OkStatus();
  if (major > kFormatMajor) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "manifest: format version %d.%d is newer than this reader supports "
        "(%d.x); upgrade ckpt",
        major, m->minor_version, kFormatMajor));
  }
  return absl::DataLossError(
      absl::StrFormat("manifest: format major version %d is invalid "
                      "(expected %d)",
                      major, kFormatMajor));
}

// The size limits and the tail (spec §6.2): its magic and the checksum.
absl::Status CheckManifestSizeAndTail(absl::string_view bytes) {
  if (bytes.size() < kMinManifestSize) {
    return absl::DataLossError(
        absl::StrFormat("manifest: truncated: %d bytes, at least %d needed",
                        bytes.size(), kMinManifestSize));
  }
  if (bytes.size() > kMaxManifestSize) {
    return absl::DataLossError(
        absl::StrFormat("manifest: %d bytes exceeds the limit of %d",
                        bytes.size(), kMaxManifestSize));
  }
  const size_t tail = bytes.size() - kManifestTailSize;
  if (std::memcmp(bytes.data() + tail + 8, kManifestMagic, kMagicSize) != 0) {
    return absl::DataLossError(absl::StrFormat(
        "manifest: bad magic at offset %d (end of file): truncated or extended",
        tail + 8));
  }
  uint64_t stored = LoadFixed64(bytes.data() + tail);
  uint64_t actual = Checksum(bytes.data(), tail);
  if (stored != actual) {
    return absl::DataLossError(absl::StrFormat(
        "manifest: checksum 0x%016x != 0x%016x (stored != computed)", stored,
        actual));
  }
  return absl::OkStatus();
}

// The header's reserved field and feature bits (spec §6.1); fills the
// features of `m`.
absl::Status DecodeManifestFeatures(absl::string_view bytes, Manifest* m) {
  uint32_t reserved = LoadFixed32(bytes.data() + 12);
  if (reserved != 0) {
    return absl::DataLossError(absl::StrFormat(
        "manifest: reserved field at offset 12 is 0x%x, must be 0", reserved));
  }
  m->required_features = LoadFixed64(bytes.data() + 16);
  m->optional_features = LoadFixed64(bytes.data() + 24);
  if ((m->required_features & ~kKnownRequiredFeatures) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "manifest: unknown required feature bits 0x%x; written by a newer ckpt",
        m->required_features & ~kKnownRequiredFeatures));
  }
  return absl::OkStatus();
}

// The fixed header and tail (spec §6.1, §6.2): magic, version, size limits,
// checksum, reserved field and feature bits. Fills the version and features
// of `m`.
absl::Status DecodeManifestFrame(absl::string_view bytes, Manifest* m) {
  CKPT_RETURN_IF_ERROR(CheckManifestPrefix(bytes, m));
  CKPT_RETURN_IF_ERROR(CheckManifestSizeAndTail(bytes));
  return DecodeManifestFeatures(bytes, m);
}

// The sections between header and tail (spec §7), each decoded by its codec;
// CHECKPOINT_INFO, SHARDS and ENTRIES must be present.
absl::Status DecodeManifestSections(absl::string_view sections_bytes,
                                    Manifest* m) {
  auto fail = [](const absl::Status& s) { return Annotate(s, "manifest"); };
  auto sections =
      internal::SplitSections(sections_bytes, kManifestHeaderSize,
                              {kSectionCheckpointInfo, kSectionMetadata,
                               kSectionShards, kSectionEntries, kSectionPlan},
                              "manifest");
  if (!sections.ok()) return fail(sections.status());
  bool have_info = false, have_shards = false, have_entries = false;
  for (const RawSection& s : *sections) {
    switch (s.tag) {
      case kSectionCheckpointInfo: {
        auto info = internal::DecodeCheckpointInfo(s);
        if (!info.ok()) return fail(info.status());
        m->info = *std::move(info);
        have_info = true;
        break;
      }
      case kSectionMetadata: {
        auto md = internal::DecodeMetadata(s);
        if (!md.ok()) return fail(md.status());
        m->metadata = *std::move(md);
        break;
      }
      case kSectionShards: {
        auto sh = DecodeShards(s);
        if (!sh.ok()) return fail(sh.status());
        m->shards = *std::move(sh);
        have_shards = true;
        break;
      }
      case kSectionEntries: {
        auto en = internal::DecodeEntries(s, /*with_blocks=*/false);
        if (!en.ok()) return fail(en.status());
        m->entries = *std::move(en);
        have_entries = true;
        break;
      }
      case kSectionPlan:
        m->plan = std::string(s.body);
        break;
    }
  }
  if (!have_info || !have_shards || !have_entries) {
    return absl::DataLossError(absl::StrCat(
        "manifest: missing required section ", !have_info
                                                   ? "CHECKPOINT_INFO (1)"
                                               : !have_shards ? "SHARDS (3)"
                                                              : "ENTRIES (4)"));
  }
  return absl::OkStatus();
}

// Shard ids are ranks, and every rank writes a shard file (§7.3), so the
// ids are exactly 0 .. world_size - 1.
absl::Status CheckShardTable(const Manifest& m) {
  for (const ShardInfo& s : m.shards) {
    if (s.shard_id >= m.info.world_size) {
      return absl::DataLossError(
          absl::StrCat("manifest: shard id ", s.shard_id, " ('", s.file_name,
                       "') is not below the world size ", m.info.world_size));
    }
  }
  if (m.shards.size() != m.info.world_size) {
    return absl::DataLossError(absl::StrCat(
        "manifest: ", m.shards.size(), " shard files listed for world size ",
        m.info.world_size, "; every rank writes one"));
  }
  return absl::OkStatus();
}

// Every chunk must live in a listed shard, inside its payload area.
absl::Status CheckChunkLocations(const Manifest& m) {
  // CheckShardTable made the ids exactly 0 .. world_size - 1.
  std::vector<uint64_t> sizes(m.shards.size());
  for (const ShardInfo& s : m.shards) sizes[s.shard_id] = s.file_size;
  for (const EntryRecord& e : m.entries) {
    for (size_t i = 0; i < e.chunks.size(); ++i) {
      const ChunkRecord& c = e.chunks[i];
      if (c.shard >= sizes.size()) {
        return absl::DataLossError(
            absl::StrCat("manifest: entry '", EscapeText(e.name), "': chunk ",
                         i, ": shard ", c.shard, " is not in the shard table"));
      }
      uint64_t payload_end = sizes[c.shard] - kShardTailSize;
      if (c.stored_length > 0 &&
          (c.data_offset < kShardHeaderSize || c.data_offset > payload_end ||
           c.stored_length > payload_end - c.data_offset)) {
        return absl::DataLossError(absl::StrCat(
            "manifest: entry '", EscapeText(e.name), "': chunk ", i,
            ": bytes [", c.data_offset, ", ", c.data_offset + c.stored_length,
            ") lie outside the payload area of shard ", c.shard, " [",
            kShardHeaderSize, ", ", payload_end, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Manifest> DecodeManifest(absl::string_view bytes) {
  Manifest m;
  CKPT_RETURN_IF_ERROR(DecodeManifestFrame(bytes, &m));
  const size_t tail = bytes.size() - kManifestTailSize;
  CKPT_RETURN_IF_ERROR(DecodeManifestSections(
      bytes.substr(kManifestHeaderSize, tail - kManifestHeaderSize), &m));
  CKPT_RETURN_IF_ERROR(CheckShardTable(m));
  if (RequiredFeaturesOf(m.entries) & ~m.required_features) {
    return absl::DataLossError(
        "manifest: a chunk uses zstd but feature bit 0 (zstd) is not set");
  }
  CKPT_RETURN_IF_ERROR(CheckChunkLocations(m));
  return m;
}

absl::Status ValidateCoverage(const Manifest& m) {
  for (const EntryRecord& e : m.entries) {
    absl::Status s = CheckEntryCover(e);
    if (!s.ok()) {
      return absl::DataLossError(absl::StrCat(
          "manifest: entry '", EscapeText(e.name), "': ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckpt::format

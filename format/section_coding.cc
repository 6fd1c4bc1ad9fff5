#include "ckpt/format/section_coding.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/format/block_codec.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::format::internal {
namespace {

// The smallest records (spec §11): an entry record has a name of at least
// 1 byte and its length, kind, dtype, flags, ndim and chunk count; a chunk
// record a geometry kind, a region (two varints, or 2 * ndim), shard,
// data offset, stored length, codec and a block size of at least 4096 (two
// bytes), 9 bytes in all except a 0-d box (7).
constexpr uint64_t kMinEntryRecordSize = 7;
constexpr uint64_t kMinChunkRecordSize = 9;

absl::Status Corrupt(const absl::Status& s, absl::string_view where) {
  // Bytes read from disk that fail validation are corruption, whatever code
  // the validator used for caller input.
  return absl::DataLossError(absl::StrCat(where, ": ", s.message()));
}

}  // namespace

void PutSection(std::string* dst, uint32_t tag, bool required,
                absl::string_view body) {
  PutFixed32(dst, tag);
  PutFixed32(dst, required ? kSectionFlagRequired : 0);
  PutFixed64(dst, body.size());
  dst->append(body.data(), body.size());
}

absl::StatusOr<std::vector<RawSection>> SplitSections(
    absl::string_view bytes, uint64_t base_offset,
    absl::Span<const uint32_t> allowed, absl::string_view file_kind) {
  std::vector<RawSection> out;
  ByteReader r(bytes, base_offset);
  while (!r.empty()) {
    RawSection s;
    s.offset = r.offset();
    CKPT_ASSIGN_OR_RETURN(s.tag, r.Read32("section tag"));
    CKPT_ASSIGN_OR_RETURN(s.flags, r.Read32("section flags"));
    CKPT_ASSIGN_OR_RETURN(uint64_t len, r.Read64("section length"));
    CKPT_ASSIGN_OR_RETURN(
        s.body, r.ReadBytes(absl::StrCat("section ", s.tag, " body"), len));
    if ((s.flags & ~kSectionFlagsKnown) != 0) {
      return absl::DataLossError(absl::StrFormat(
          "section %d at offset %d: reserved flag bits 0x%x are set", s.tag,
          s.offset, s.flags & ~kSectionFlagsKnown));
    }
    const bool required = (s.flags & kSectionFlagRequired) != 0;
    const KnownSection* known = nullptr;
    for (const KnownSection& k : kKnownSections) {
      if (k.tag == s.tag) known = &k;
    }
    if (known == nullptr) {
      if (required) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "unknown required section %d at offset %d: written by a newer "
            "ckpt; this reader cannot read it",
            s.tag, s.offset));
      }
      continue;  // optional: skipped by length
    }
    // A tag v1 defines is never "unknown", whatever its flag says: in the
    // wrong kind of file, or with the wrong flag, it is corruption.
    if (std::find(allowed.begin(), allowed.end(), s.tag) == allowed.end()) {
      return absl::DataLossError(
          absl::StrFormat("section %d is not allowed in a %s (%s at offset %d)",
                          s.tag, file_kind, known->name, s.offset));
    }
    if (required != known->required) {
      return absl::DataLossError(absl::StrFormat(
          "section %d (%s) at offset %d has required flag %d; v1 defines it "
          "as %d",
          s.tag, known->name, s.offset, required ? 1 : 0,
          known->required ? 1 : 0));
    }
    for (const RawSection& o : out) {
      if (o.tag == s.tag) {
        return absl::DataLossError(
            absl::StrFormat("section %d appears twice (offsets %d and %d)",
                            s.tag, o.offset, s.offset));
      }
    }
    out.push_back(s);
  }
  return out;
}

absl::Status CheckNoTrailingBytes(const RawSection& s, const ByteReader& r,
                                  absl::string_view what) {
  if (r.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrFormat(
      "section %d: %d trailing bytes after the last %s (at offset %d)", s.tag,
      r.remaining(), what, r.offset()));
}

void EncodeCheckpointInfo(const CheckpointInfo& info, std::string* out) {
  out->append(reinterpret_cast<const char*>(info.id.data()), info.id.size());
  PutVarint(out, info.step);
  PutVarint(out, info.world_size);
  PutFixed64(out, static_cast<uint64_t>(info.created_unix_ns));
  out->append(reinterpret_cast<const char*>(info.fingerprint.data()),
              info.fingerprint.size());
  PutString(out, info.writer);
}

absl::StatusOr<CheckpointInfo> DecodeCheckpointInfo(const RawSection& s) {
  ByteReader r(s.body, s.offset + kSectionHeaderSize);
  CheckpointInfo info;
  CKPT_ASSIGN_OR_RETURN(auto id, r.ReadBytes("checkpoint id", 16));
  std::copy(id.begin(), id.end(), info.id.begin());
  CKPT_ASSIGN_OR_RETURN(info.step, r.ReadVarint("step"));
  CKPT_ASSIGN_OR_RETURN(uint64_t ws,
                        r.ReadVarintAtMost("world size", kMaxShards));
  if (ws == 0) return absl::DataLossError("world size: 0 is not allowed");
  info.world_size = static_cast<uint32_t>(ws);
  CKPT_ASSIGN_OR_RETURN(uint64_t t, r.Read64("creation time"));
  info.created_unix_ns = static_cast<int64_t>(t);
  CKPT_ASSIGN_OR_RETURN(auto fp, r.ReadBytes("fingerprint", 16));
  std::copy(fp.begin(), fp.end(), info.fingerprint.begin());
  CKPT_ASSIGN_OR_RETURN(auto writer, r.ReadString("writer", kMaxNameLength));
  info.writer = std::string(writer);
  // Trailing bytes are allowed: a later minor version may append fields.
  return info;
}

void EncodeMetadata(const Metadata& md, std::string* out) {
  PutVarint(out, md.size());
  for (const auto& [k, v] : md) {
    PutString(out, k);
    PutString(out, v);
  }
}

absl::StatusOr<Metadata> DecodeMetadata(const RawSection& s) {
  ByteReader r(s.body, s.offset + kSectionHeaderSize);
  CKPT_ASSIGN_OR_RETURN(
      uint64_t n, r.ReadVarintAtMost("metadata count", kMaxMetadataEntries));
  Metadata md;
  absl::flat_hash_set<absl::string_view> seen;
  for (uint64_t i = 0; i < n; ++i) {
    CKPT_ASSIGN_OR_RETURN(auto k, r.ReadString("metadata key", kMaxNameLength));
    CKPT_ASSIGN_OR_RETURN(
        auto v, r.ReadString("metadata value", kMaxMetadataValueLength));
    absl::Status ks = ValidateMetadataKey(k);
    if (!ks.ok()) return Corrupt(ks, absl::StrCat("metadata entry ", i));
    if (!seen.insert(k).second) {
      return absl::DataLossError(
          absl::StrCat("metadata: duplicate key '", EscapeText(k), "'"));
    }
    md.emplace_back(std::string(k), std::string(v));
  }
  CKPT_RETURN_IF_ERROR(CheckNoTrailingBytes(s, r, "metadata pair"));
  return md;
}

void EncodeEntries(const std::vector<EntryRecord>& entries, bool with_blocks,
                   std::string* out) {
  PutVarint(out, entries.size());
  for (const EntryRecord& e : entries) {
    PutString(out, e.name);
    PutFixed8(out, static_cast<uint8_t>(e.kind));
    PutFixed8(out, static_cast<uint8_t>(e.dtype));
    PutFixed8(out, e.flags);
    PutVarint(out, e.shape.size());
    for (uint64_t d : e.shape) PutVarint(out, d);
    PutVarint(out, e.chunks.size());
    for (const ChunkRecord& c : e.chunks) {
      if (const Box* b = std::get_if<Box>(&c.region)) {
        PutFixed8(out, static_cast<uint8_t>(GeometryKind::kBox));
        for (uint64_t o : b->offset) PutVarint(out, o);
        for (uint64_t s : b->size) PutVarint(out, s);
      } else {
        const FlatRange& f = std::get<FlatRange>(c.region);
        PutFixed8(out, static_cast<uint8_t>(GeometryKind::kFlat));
        PutVarint(out, f.start);
        PutVarint(out, f.length);
      }
      PutVarint(out, c.shard);
      PutVarint(out, c.data_offset);
      PutVarint(out, c.stored_length);
      PutFixed8(out, static_cast<uint8_t>(c.codec));
      PutVarint(out, c.block_size);
      if (with_blocks) {
        PutVarint(out, c.blocks.size());
        for (const BlockRecord& b : c.blocks) {
          PutVarint(out, b.stored_size);
          PutFixed64(out, b.checksum);
        }
      }
    }
  }
}

namespace {

// The chunk's geometry kind and region (spec §8.3), valid in the entry's
// shape.
absl::Status DecodeChunkRegion(ByteReader& r, const Shape& shape,
                               Region* region) {
  CKPT_ASSIGN_OR_RETURN(uint8_t geom, r.Read8("geometry kind"));
  const size_t n = shape.size();
  if (geom == static_cast<uint8_t>(GeometryKind::kBox)) {
    Box b;
    b.offset.resize(n);
    b.size.resize(n);
    for (size_t d = 0; d < n; ++d) {
      CKPT_ASSIGN_OR_RETURN(b.offset[d], r.ReadVarint("box offset"));
    }
    for (size_t d = 0; d < n; ++d) {
      CKPT_ASSIGN_OR_RETURN(b.size[d], r.ReadVarint("box size"));
    }
    *region = std::move(b);
  } else if (geom == static_cast<uint8_t>(GeometryKind::kFlat)) {
    FlatRange f;
    CKPT_ASSIGN_OR_RETURN(f.start, r.ReadVarint("flat start"));
    CKPT_ASSIGN_OR_RETURN(f.length, r.ReadVarint("flat length"));
    *region = f;
  } else {
    return absl::DataLossError(
        absl::StrCat("unknown geometry kind ", static_cast<int>(geom)));
  }
  absl::Status rs = ValidateRegion(*region, shape);
  if (!rs.ok()) return absl::DataLossError(rs.message());
  return absl::OkStatus();
}

// Shard, data offset, stored length, codec and block size, checked against
// the chunk's `raw` bytes.
absl::Status DecodeChunkStorage(ByteReader& r, uint64_t raw, ChunkRecord* c) {
  CKPT_ASSIGN_OR_RETURN(uint64_t shard,
                        r.ReadVarintAtMost("shard id", kMaxShards - 1));
  c->shard = static_cast<uint32_t>(shard);
  CKPT_ASSIGN_OR_RETURN(c->data_offset, r.ReadVarint("data offset"));
  CKPT_ASSIGN_OR_RETURN(c->stored_length, r.ReadVarint("stored length"));
  if (c->data_offset > (1ull << 62) || c->stored_length > (1ull << 62)) {
    return absl::DataLossError("data offset or stored length beyond 2^62");
  }
  CKPT_ASSIGN_OR_RETURN(uint8_t codec, r.Read8("codec"));
  if (codec > static_cast<uint8_t>(Codec::kZstd)) {
    return absl::DataLossError(
        absl::StrCat("unknown codec ", static_cast<int>(codec)));
  }
  c->codec = static_cast<Codec>(codec);
  CKPT_ASSIGN_OR_RETURN(c->block_size, r.ReadVarint("block size"));
  if (c->block_size < kMinBlockSize || c->block_size > kMaxBlockSize) {
    return absl::DataLossError(absl::StrCat("block size ", c->block_size,
                                            " outside [", kMinBlockSize, ", ",
                                            kMaxBlockSize, "]"));
  }
  if (c->codec == Codec::kNone && c->stored_length != raw) {
    return absl::DataLossError(
        absl::StrCat("stored length ", c->stored_length, " != ", raw,
                     " raw bytes for an uncompressed chunk"));
  }
  if (c->stored_length > raw) {
    return absl::DataLossError(absl::StrCat("stored length ", c->stored_length,
                                            " exceeds raw size ", raw));
  }
  return absl::OkStatus();
}

// The block table of a shard index's chunk: one record per block of the
// chunk's `raw` bytes, whose stored sizes add up to the stored length.
absl::Status DecodeChunkBlocks(ByteReader& r, uint64_t raw, ChunkRecord* c) {
  const uint64_t nblocks = NumBlocks(raw, c->block_size);
  CKPT_ASSIGN_OR_RETURN(uint64_t count, r.ReadVarint("block count"));
  if (count != nblocks) {
    return absl::DataLossError(
        absl::StrCat("block count ", count, " != ", nblocks, " expected for ",
                     raw, " bytes in blocks of ", c->block_size));
  }
  // Each block record takes at least 9 bytes: never reserve more than the
  // bytes left can hold.
  c->blocks.reserve(std::min<uint64_t>(count, r.remaining() / 9));
  uint64_t sum = 0;
  for (uint64_t i = 0; i < count; ++i) {
    BlockRecord b;
    CKPT_ASSIGN_OR_RETURN(b.stored_size, r.ReadVarint("block stored size"));
    CKPT_ASSIGN_OR_RETURN(b.checksum, r.Read64("block checksum"));
    uint64_t braw = std::min(c->block_size, raw - i * c->block_size);
    if (b.stored_size > braw || b.stored_size == 0 ||
        (c->codec == Codec::kNone && b.stored_size != braw)) {
      return absl::DataLossError(absl::StrCat("block ", i, ": stored size ",
                                              b.stored_size, " invalid for ",
                                              braw, " raw bytes"));
    }
    sum += b.stored_size;
    c->blocks.push_back(b);
  }
  if (sum != c->stored_length) {
    return absl::DataLossError(absl::StrCat("blocks add up to ", sum,
                                            " bytes, stored length is ",
                                            c->stored_length));
  }
  return absl::OkStatus();
}

absl::Status DecodeChunk(ByteReader& r, const EntryRecord& e,
                         uint64_t raw_elem_size, bool with_blocks,
                         ChunkRecord* c) {
  CKPT_RETURN_IF_ERROR(DecodeChunkRegion(r, e.shape, &c->region));
  const uint64_t raw = RegionElements(c->region) * raw_elem_size;
  CKPT_RETURN_IF_ERROR(DecodeChunkStorage(r, raw, c));
  if (!with_blocks) return absl::OkStatus();
  return DecodeChunkBlocks(r, raw, c);
}

// The `count` chunks of entry `e` (spec §8.3), appended to e->chunks.
// Chunks with elements must not overlap (§8.5), so an entry of N elements
// has at most N of them: a record past that is refused as it is read, which
// bounds the records of a 0-d entry (7 bytes each, the only ones under 9)
// by one. Memory is reserved for at most what the bytes left can hold.
absl::Status DecodeEntryChunks(ByteReader& r, uint64_t count, bool with_blocks,
                               EntryRecord* e) {
  e->chunks.reserve(std::min<uint64_t>(
      count, r.remaining() / kMinChunkRecordSize + (e->shape.empty() ? 1 : 0)));
  const uint64_t esize = DTypeSize(e->dtype);
  uint64_t numel = 1;
  for (uint64_t d : e->shape) numel *= d;
  uint64_t with_elements = 0;
  for (uint64_t c = 0; c < count; ++c) {
    ChunkRecord chunk;
    absl::Status cs = DecodeChunk(r, *e, esize, with_blocks, &chunk);
    if (!cs.ok()) {
      return absl::Status(cs.code(),
                          absl::StrCat("chunk ", c, ": ", cs.message()));
    }
    if (RegionElements(chunk.region) != 0 && ++with_elements > numel) {
      return absl::DataLossError(
          absl::StrCat("chunk ", c, ": ", with_elements,
                       " chunks hold elements of an entry of ", numel,
                       " elements, so two of them overlap"));
    }
    e->chunks.push_back(std::move(chunk));
  }
  return absl::OkStatus();
}

// "duplicate entry name" unless the names of `entries` are unique. Sorts
// an array of 4-byte indices (a hash set of the names took 20-40 bytes an
// entry, more than many entries take on disk).
absl::Status CheckUniqueNames(const std::vector<EntryRecord>& entries) {
  std::vector<uint32_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return entries[a].name != entries[b].name
               ? entries[a].name < entries[b].name
               : a < b;
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const std::string& name = entries[order[k]].name;
    if (name == entries[order[k - 1]].name) {
      return absl::DataLossError(
          absl::StrCat("duplicate entry name '", EscapeText(name), "'"));
    }
  }
  return absl::OkStatus();
}

// The kind, dtype and flags of an entry record (spec §8.2).
absl::Status DecodeEntryType(ByteReader& r, EntryRecord* e) {
  CKPT_ASSIGN_OR_RETURN(uint8_t kind, r.Read8("entry kind"));
  if (kind != 1 && kind != 2) {
    return absl::DataLossError(
        absl::StrCat("unknown entry kind ", static_cast<int>(kind)));
  }
  e->kind = static_cast<EntryKind>(kind);
  CKPT_ASSIGN_OR_RETURN(uint8_t code, r.Read8("dtype"));
  CKPT_ASSIGN_OR_RETURN(e->dtype, DTypeFromCode(code));
  CKPT_ASSIGN_OR_RETURN(uint8_t flags, r.Read8("entry flags"));
  if ((flags & ~kEntryFlagsKnown) != 0) {
    return absl::DataLossError(absl::StrFormat(
        "reserved entry flag bits 0x%x are set", flags & ~kEntryFlagsKnown));
  }
  e->flags = flags;
  return absl::OkStatus();
}

// The global shape of an entry record, checked against its dtype and kind.
absl::Status DecodeEntryShape(ByteReader& r, EntryRecord* e) {
  CKPT_ASSIGN_OR_RETURN(uint64_t ndim, r.ReadVarintAtMost("ndim", kMaxDims));
  e->shape.resize(ndim);
  for (uint64_t d = 0; d < ndim; ++d) {
    CKPT_ASSIGN_OR_RETURN(e->shape[d], r.ReadVarint("dim"));
  }
  absl::Status ss = ValidateShape(e->shape, DTypeSize(e->dtype));
  if (!ss.ok()) return absl::DataLossError(ss.message());
  if (e->kind == EntryKind::kObject &&
      (e->dtype != DType::kUInt8 || e->shape.size() != 1)) {
    return absl::DataLossError("an object must be a 1-d uint8 entry");
  }
  return absl::OkStatus();
}

// An entry record after its name: type, shape and chunks. Messages name
// nothing; the caller adds the entry.
absl::Status DecodeEntryBody(ByteReader& r, bool with_blocks, EntryRecord* e) {
  CKPT_RETURN_IF_ERROR(DecodeEntryType(r, e));
  CKPT_RETURN_IF_ERROR(DecodeEntryShape(r, e));
  CKPT_ASSIGN_OR_RETURN(uint64_t nchunks,
                        r.ReadVarintAtMost("chunk count", kMaxChunksPerEntry));
  return DecodeEntryChunks(r, nchunks, with_blocks, e);
}

}  // namespace

absl::StatusOr<std::vector<EntryRecord>> DecodeEntries(const RawSection& s,
                                                       bool with_blocks) {
  ByteReader r(s.body, s.offset + kSectionHeaderSize);
  CKPT_ASSIGN_OR_RETURN(uint64_t n,
                        r.ReadVarintAtMost("entry count", kMaxEntries));
  std::vector<EntryRecord> entries;
  entries.reserve(std::min<uint64_t>(n, r.remaining() / kMinEntryRecordSize));
  for (uint64_t i = 0; i < n; ++i) {
    EntryRecord e;
    CKPT_ASSIGN_OR_RETURN(auto name,
                          r.ReadString("entry name", kMaxNameLength));
    e.name = std::string(name);
    absl::Status ns = ValidateEntryName(e.name);
    if (!ns.ok()) return Corrupt(ns, absl::StrCat("entry ", i));
    absl::Status es = DecodeEntryBody(r, with_blocks, &e);
    if (!es.ok()) {
      return absl::Status(es.code(), absl::StrCat("entry '", EscapeText(e.name),
                                                  "': ", es.message()));
    }
    entries.push_back(std::move(e));
  }
  CKPT_RETURN_IF_ERROR(CheckNoTrailingBytes(s, r, "entry"));
  CKPT_RETURN_IF_ERROR(CheckUniqueNames(entries));
  return entries;
}

}  // namespace ckpt::format::internal

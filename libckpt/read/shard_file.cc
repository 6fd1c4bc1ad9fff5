#include "read/shard_file.h"

#include <algorithm>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ckpt/format/checksum.h"
#include "ckpt/format/names.h"
#include "ckpt/format/shard.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::internal {

using format::ChunkRecord;
using format::EntryRecord;

std::string LocationText(absl::string_view file, absl::string_view entry,
                         int64_t chunk, absl::string_view region,
                         int64_t block) {
  std::string where;
  if (block >= 0) absl::StrAppend(&where, "block ", block, " of ");
  if (chunk >= 0) {
    absl::StrAppend(&where, "chunk ", chunk, region.empty() ? "" : " ", region,
                    " of ");
  }
  if (!entry.empty()) {
    absl::StrAppend(&where, where.empty() ? "entry '" : "'",
                    format::EscapeText(entry), "'");
  }
  if (file.empty()) return where;
  if (where.empty()) return std::string(file);
  return absl::StrCat(file, ": ", where);
}

namespace {

// [offset, offset + n) of `file`, fewer bytes only where the file ends.
absl::StatusOr<std::string> ReadUpTo(File& file, uint64_t offset, uint64_t n) {
  std::string buf(n, '\0');
  CKPT_ASSIGN_OR_RETURN(size_t got, file.PRead(offset, n, buf.data()));
  buf.resize(got);
  return buf;
}

// The header's ids and the file size against the manifest (§5.6 steps 1
// and 5), checked after the header so that a file of another checkpoint
// is named as such even when its size differs too.
absl::Status CheckHeaderAgainstManifest(const format::ShardHeader& header,
                                        uint64_t size,
                                        const format::ShardInfo& info,
                                        const format::CheckpointId& id) {
  if (header.checkpoint_id != id) {
    return absl::DataLossError(
        absl::StrCat("checkpoint id ", format::IdToHex(header.checkpoint_id),
                     " != manifest's ", format::IdToHex(id),
                     ": this shard belongs to another checkpoint"));
  }
  if (header.shard_id != info.shard_id) {
    return absl::DataLossError(absl::StrCat("shard id ", header.shard_id,
                                            " != ", info.shard_id,
                                            " in the manifest"));
  }
  if (size != info.file_size) {
    return absl::DataLossError(absl::StrCat(
        "file is ", size, " bytes, the manifest says ", info.file_size,
        size < info.file_size ? " (truncated)" : " (extended)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<File>> OpenShardHandle(
    Storage* storage, const std::string& path, const format::ShardInfo& info,
    const OpenOptions& options) {
  auto file = storage->Open(path, OpenMode::kRead, options);
  if (!file.ok() && absl::IsNotFound(file.status())) {
    return absl::DataLossError(absl::StrCat(
        "shard file is missing (shard ", info.shard_id, " in the manifest)"));
  }
  return file;
}

absl::StatusOr<ShardFile> OpenShardFile(Storage* storage,
                                        const std::string& path,
                                        const format::ShardInfo& info,
                                        const format::CheckpointId& id,
                                        const OpenOptions& options) {
  ShardFile s;
  CKPT_ASSIGN_OR_RETURN(s.file, OpenShardHandle(storage, path, info, options));
  ShardMetaBytes& m = s.meta;
  CKPT_ASSIGN_OR_RETURN(m.file_size, s.file->Size());
  CKPT_ASSIGN_OR_RETURN(
      m.head,
      ReadUpTo(*s.file, 0,
               std::min<uint64_t>(m.file_size, format::kShardHeaderSize)));
  CKPT_ASSIGN_OR_RETURN(s.header, format::DecodeShardHeader(m.head));
  CKPT_RETURN_IF_ERROR(
      CheckHeaderAgainstManifest(s.header, m.file_size, info, id));
  // file_size >= 96 (DecodeManifest checks it), so the tail is in the file.
  CKPT_ASSIGN_OR_RETURN(m.tail,
                        ReadUpTo(*s.file, m.file_size - format::kShardTailSize,
                                 format::kShardTailSize));
  CKPT_ASSIGN_OR_RETURN(format::ShardTail tail,
                        format::DecodeShardTail(m.tail, m.file_size));
  CKPT_ASSIGN_OR_RETURN(
      m.index, ReadUpTo(*s.file, tail.index_offset, tail.index_length));
  CKPT_ASSIGN_OR_RETURN(s.index,
                        format::DecodeShardIndex(m.index, s.header, tail));
  return s;
}

absl::StatusOr<ShardFile> DecodeShardMeta(ShardMetaBytes meta,
                                          const format::ShardInfo& info,
                                          const format::CheckpointId& id) {
  ShardFile s;
  CKPT_ASSIGN_OR_RETURN(s.header, format::DecodeShardHeader(meta.head));
  CKPT_RETURN_IF_ERROR(
      CheckHeaderAgainstManifest(s.header, meta.file_size, info, id));
  CKPT_ASSIGN_OR_RETURN(format::ShardTail tail,
                        format::DecodeShardTail(meta.tail, meta.file_size));
  if (meta.index.size() != tail.index_length) {
    return absl::DataLossError(absl::StrCat("index is ", meta.index.size(),
                                            " bytes, the tail says ",
                                            tail.index_length));
  }
  CKPT_ASSIGN_OR_RETURN(s.index,
                        format::DecodeShardIndex(meta.index, s.header, tail));
  s.meta = std::move(meta);
  return s;
}

uint64_t ChunkRawBytes(const EntryRecord& e, const ChunkRecord& c) {
  return RegionElements(c.region) * DTypeSize(e.dtype);
}

absl::Status ReadExactly(File& file, uint64_t offset, uint64_t n, char* out) {
  const std::string what =
      absl::StrCat("reading bytes [", offset, ", ", offset + n, ")");
  auto got = file.PRead(offset, n, out);
  if (!got.ok()) return Annotate(got.status(), what);
  if (*got == n) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrCat(what, ": file ends at offset ", offset + *got));
}

absl::Status CheckBoolBytes(absl::string_view raw, uint64_t first_element) {
  for (size_t i = 0; i < raw.size(); ++i) {
    const unsigned char v = static_cast<unsigned char>(raw[i]);
    if (v > 1) {
      return absl::DataLossError(absl::StrFormat(
          "bool element %d of the chunk is 0x%02x, not 0x00 or 0x01 "
          "(spec/FORMAT.md §9)",
          first_element + i, v));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const char*> VerifyBlock(const EntryRecord& e,
                                        const ChunkRecord& c, uint64_t b,
                                        absl::string_view stored,
                                        format::BlockDecoder* decoder,
                                        char* raw_out) {
  const format::BlockRecord& block = c.blocks[b];
  const uint64_t raw_size =
      std::min(c.block_size, ChunkRawBytes(e, c) - b * c.block_size);
  const char* raw = stored.data();
  if (c.codec == format::Codec::kNone) {
    uint64_t sum = format::Checksum(stored.data(), stored.size());
    if (sum != block.checksum) {
      return format::ChecksumMismatch(block.checksum, sum);
    }
  } else {
    CKPT_RETURN_IF_ERROR(
        decoder->Decode(c.codec, stored, block.checksum, raw_size, raw_out));
    raw = raw_out;
  }
  if (e.dtype == DType::kBool) {
    CKPT_RETURN_IF_ERROR(
        CheckBoolBytes(absl::string_view(raw, raw_size), b * c.block_size));
  }
  return raw;
}

}  // namespace ckpt::internal

// Checkpoints whose every checksum is valid but whose metadata asks for
// much more memory or work than their bytes on disk (issue 28, SECURITY.md
// "Resource use"): built at test time with the format's own encoders, so
// no large file is committed. Used by the resource-bound tests of the tools
// and by ckpt-hostile-gen (the measurements in SECURITY.md).
#ifndef CKPT_TESTS_TESTING_HOSTILE_CHECKPOINTS_H_
#define CKPT_TESTS_TESTING_HOSTILE_CHECKPOINTS_H_

#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/format/checksum.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/records.h"
#include "ckpt/format/section_coding.h"
#include "ckpt/format/shard.h"
#include "testing/files.h"

namespace ckpt::testing {

// A checkpoint of one shard: the manifest and the shard file's payload area
// (what lies between the header and the index) and index entries.
struct HostileCheckpoint {
  format::Manifest manifest;
  std::string payload;  // starts at offset kShardHeaderSize of the shard
  std::vector<format::EntryRecord> index_entries;
  uint32_t alignment = 64;  // of the shard's chunks
  // `repeats` copies of `repeated` follow the chunks of the manifest's last
  // entry, and of the index's last entry when `index_repeats`: encoded
  // without holding a record for each (the last entry must have no chunks).
  format::ChunkRecord repeated;
  uint64_t repeats = 0;
  bool index_repeats = false;
};

// `encoded` (a manifest or shard index) without its last `trailer` bytes,
// whose last section, of tag `tag`, holds `entries`, with `n` copies of
// `chunk` appended to the chunks of the last entry (which has none).
inline std::string WithRepeatedChunk(const std::string& encoded, size_t trailer,
                                     uint32_t tag,
                                     std::vector<format::EntryRecord> entries,
                                     bool with_blocks,
                                     const format::ChunkRecord& chunk,
                                     uint64_t n) {
  std::string body0, body1;
  format::internal::EncodeEntries(entries, with_blocks, &body0);
  entries.back().chunks = {chunk};
  format::internal::EncodeEntries(entries, with_blocks, &body1);
  const std::string chunk_bytes = body1.substr(body0.size());
  std::string body = body0.substr(0, body0.size() - 1);  // the count 0
  format::PutVarint(&body, n);
  body.reserve(body.size() + n * chunk_bytes.size());
  for (uint64_t i = 0; i < n; ++i) body += chunk_bytes;
  std::string out = encoded.substr(
      0, encoded.size() - trailer - format::kSectionHeaderSize - body0.size());
  format::internal::PutSection(&out, tag, /*required=*/true, body);
  return out;
}

inline format::Manifest HostileManifestBase() {
  format::Manifest m;
  for (int i = 0; i < 16; ++i) m.info.id[i] = static_cast<uint8_t>(0xa0 + i);
  m.info.step = 1;
  m.info.world_size = 1;
  m.info.writer = "hostile";
  return m;
}

// A chunk without stored bytes (codec zstd, so stored_length 0 is legal for
// any region): all its bytes are metadata.
inline format::ChunkRecord EmptyZstdChunk(Region region) {
  format::ChunkRecord c;
  c.region = std::move(region);
  c.codec = format::Codec::kZstd;
  c.block_size = format::kMinBlockSize;
  return c;
}

// Writes `dir`/MANIFEST and `dir`/shard-00000.ckpt for `h`, setting the
// shard's size in the manifest. Returns the bytes of metadata written (the
// manifest and the shard's index).
inline uint64_t WriteHostileCheckpoint(const std::string& dir,
                                       HostileCheckpoint h) {
  std::filesystem::create_directories(dir);
  const uint64_t zstd =
      h.repeated.codec == format::Codec::kZstd ? format::kFeatureZstd : 0;
  format::ShardHeader header;
  header.checkpoint_id = h.manifest.info.id;
  header.alignment = h.alignment;
  format::ShardIndex index;
  index.info = h.manifest.info;
  index.entries = std::move(h.index_entries);
  std::string index_bytes;
  if (h.index_repeats && h.repeats != 0) {
    index.required_features |= zstd;
    index_bytes = WithRepeatedChunk(
        format::EncodeShardIndex(index), 0, format::kSectionShardChunks,
        index.entries, /*with_blocks=*/true, h.repeated, h.repeats);
  } else {
    index_bytes = format::EncodeShardIndex(index);
  }
  format::ShardTail tail;
  tail.index_offset = format::kShardHeaderSize + h.payload.size();
  tail.index_length = index_bytes.size();
  tail.index_checksum = format::Checksum(index_bytes);
  std::string shard = format::EncodeShardHeader(header);
  shard += h.payload;
  shard += index_bytes;
  shard += format::EncodeShardTail(tail);
  h.manifest.shards = {{0, format::ShardFileName(0), shard.size()}};
  std::string manifest;
  if (h.repeats != 0) {
    h.manifest.required_features |= zstd;
    manifest = WithRepeatedChunk(format::EncodeManifest(h.manifest),
                                 format::kManifestTailSize,
                                 format::kSectionEntries, h.manifest.entries,
                                 /*with_blocks=*/false, h.repeated, h.repeats);
    format::PutFixed64(&manifest, format::Checksum(manifest));
    manifest.append(format::kManifestMagic, format::kMagicSize);
  } else {
    manifest = format::EncodeManifest(h.manifest);
  }
  WriteFileBytes(dir + "/" + format::kManifestFileName, manifest);
  WriteFileBytes(dir + "/" + format::ShardFileName(0), shard);
  return manifest.size() + index_bytes.size();
}

// Issue 28's coverage case: a partial uint8 entry of 2^32 elements in 32
// dims of 2, one box that is not a contiguous run, then `copies` copies of
// the flat range [1, 2^32 - 1), each of which is 63 boxes of 32 dims. The
// flat ranges overlap: a correct reader refuses the entry.
inline HostileCheckpoint CoverageBomb(uint64_t copies) {
  HostileCheckpoint h;
  h.manifest = HostileManifestBase();
  format::EntryRecord e;
  e.name = "t";
  e.dtype = DType::kUInt8;
  e.flags = format::kEntryFlagPartial;
  e.shape.assign(32, 2);
  Box b = FullBox(e.shape);
  b.size[1] = 1;  // [0:2, 0:1, 0:2, ...]: not one run of the flattening
  e.chunks.push_back(EmptyZstdChunk(b));
  for (uint64_t i = 0; i < copies; ++i) {
    e.chunks.push_back(EmptyZstdChunk(FlatRange{1, (1ull << 32) - 2}));
  }
  h.manifest.entries.push_back(std::move(e));
  return h;
}

// Issue 28's decoding case: one float32 scalar entry with `n` chunks of 7
// bytes each (the smallest chunk record there is), all overlapping.
inline HostileCheckpoint ScalarChunks(uint64_t n) {
  HostileCheckpoint h;
  h.manifest = HostileManifestBase();
  format::EntryRecord e;
  e.name = "s";
  e.dtype = DType::kFloat32;
  h.manifest.entries.push_back(std::move(e));
  h.repeated = EmptyZstdChunk(Box{});
  h.repeats = n;
  return h;
}

// The smallest records a valid checkpoint can hold in number: one uint8
// entry of shape [0] with `n` chunks of no elements (9 bytes each in the
// manifest, 10 in the index). Coverage allows any number of them (§8.5).
// With `indexed` false the shard's index lists the entry without chunks,
// so that every chunk of the manifest is missing from it.
inline HostileCheckpoint EmptyChunks(uint64_t n, bool indexed) {
  HostileCheckpoint h;
  h.manifest = HostileManifestBase();
  format::EntryRecord e;
  e.name = "e";
  e.dtype = DType::kUInt8;
  e.shape = {0};
  h.index_entries.push_back(e);
  h.manifest.entries.push_back(std::move(e));
  h.repeated.region = Box{{0}, {0}};
  h.repeated.block_size = format::kMinBlockSize;
  h.repeats = n;
  h.index_repeats = indexed;
  return h;
}

// `n` float32 scalar entries of one chunk each, with short unique names and
// their 4 bytes of payload: a valid checkpoint of many small entries.
inline HostileCheckpoint ScalarEntries(uint64_t n) {
  HostileCheckpoint h;
  h.manifest = HostileManifestBase();
  static constexpr char kDigits[] =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  h.payload.assign(4 * n, '\0');
  h.alignment = 4;
  const uint64_t sum = format::Checksum(absl::string_view("\0\0\0\0", 4));
  for (uint64_t k = 0; k < n; ++k) {
    format::EntryRecord e;
    for (uint64_t v = k; e.name.empty() || v != 0; v /= 62) {
      e.name += kDigits[v % 62];
    }
    e.dtype = DType::kFloat32;
    format::ChunkRecord c;
    c.region = Box{};
    c.data_offset = format::kShardHeaderSize + 4 * k;
    c.stored_length = 4;
    c.blocks = {{4, sum}};
    e.chunks = {c};
    h.index_entries.push_back(e);
    e.chunks[0].blocks.clear();
    h.manifest.entries.push_back(std::move(e));
  }
  return h;
}

// One zstd frame of `raw` zero bytes, compressed in pieces (the raw bytes
// are never held in memory).
inline std::string ZstdZeros(uint64_t raw) {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setPledgedSrcSize(cctx, raw);
  const std::string zeros(1 << 20, '\0');
  std::string out(ZSTD_CStreamOutSize(), '\0');
  std::string frame;
  uint64_t left = raw;
  for (;;) {
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(left, zeros.size()));
    ZSTD_inBuffer in{zeros.data(), n, 0};
    const ZSTD_EndDirective end = n == left ? ZSTD_e_end : ZSTD_e_continue;
    size_t pending;
    do {
      ZSTD_outBuffer o{out.data(), out.size(), 0};
      pending = ZSTD_compressStream2(cctx, &o, &in, end);
      frame.append(out.data(), o.pos);
    } while (!ZSTD_isError(pending) &&
             (in.pos < in.size || (end == ZSTD_e_end && pending != 0)));
    left -= n;
    if (end == ZSTD_e_end || ZSTD_isError(pending)) break;
  }
  ZSTD_freeCCtx(cctx);
  return frame;
}

// Issue 28's legal-but-costly case: one uint8 entry of `blocks` blocks of
// `block_size` zero bytes, each stored as one small zstd frame. Valid in
// every respect.
inline HostileCheckpoint ZeroBlocks(uint64_t block_size, uint64_t blocks) {
  HostileCheckpoint h;
  h.manifest = HostileManifestBase();
  const std::string frame = ZstdZeros(block_size);
  format::EntryRecord e;
  e.name = "z";
  e.dtype = DType::kUInt8;
  e.shape = {block_size * blocks};
  format::ChunkRecord c;
  c.region = FlatRange{0, block_size * blocks};
  c.codec = format::Codec::kZstd;
  c.block_size = block_size;
  c.data_offset = format::kShardHeaderSize;
  for (uint64_t i = 0; i < blocks; ++i) {
    h.payload += frame;
    c.blocks.push_back({frame.size(), format::Checksum(frame)});
  }
  c.stored_length = h.payload.size();
  e.chunks.push_back(c);
  h.index_entries.push_back(e);
  e.chunks[0].blocks.clear();
  h.manifest.entries.push_back(std::move(e));
  return h;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_HOSTILE_CHECKPOINTS_H_

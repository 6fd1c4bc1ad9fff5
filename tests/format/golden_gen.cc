// One-time generator of tests/data/v1/golden (format v1). Kept to document
// how the files were made; never re-run to "fix" a failing golden test.
// Usage: ckpt-golden-gen OUT_ROOT
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "ckpt/format/block_codec.h"
#include "ckpt/format/checksum.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/shard.h"
#include "format/golden_spec.h"

namespace ckpt::golden {
namespace {

using namespace ckpt::format;

constexpr uint64_t kBlock = 4096;
constexpr uint32_t kAlign = 4096;

struct ShardBuilder {
  std::string bytes;
  ShardIndex index;
};

void Pad(std::string* s, uint64_t align) {
  s->resize((s->size() + align - 1) / align * align, '\0');
}

int Main(const std::string& root) {
  CheckpointInfo info;
  for (int i = 0; i < 16; ++i) info.id[i] = static_cast<uint8_t>(0xc0 + i);
  info.step = kStep;
  info.world_size = 2;
  info.created_unix_ns = 1763683200000000000;  // 2025-11-21T00:00:00Z
  info.writer = "ckpt golden generator v1";
  Metadata md = {{"purpose", "golden"}};
  ShardBuilder shards[2];
  for (uint32_t s = 0; s < 2; ++s) {
    ShardHeader h;
    h.checkpoint_id = info.id;
    h.shard_id = s;
    h.alignment = kAlign;
    shards[s].bytes = EncodeShardHeader(h);
    shards[s].index.info = info;
    shards[s].index.metadata = md;
  }
  Manifest m;
  m.info = info;
  m.metadata = md;
  BlockEncoder enc(3);
  std::vector<GoldenEntry> entries = GoldenEntries();
  GoldenEntry obj{kObjectName,
                  DType::kUInt8,
                  {sizeof(kObjectValue) - 1},
                  Codec::kNone,
                  {{FlatRange{0, sizeof(kObjectValue) - 1}, 1}}};
  entries.push_back(obj);
  for (const GoldenEntry& e : entries) {
    bool is_obj = e.name == kObjectName;
    std::string global = is_obj ? std::string(kObjectValue) : GoldenBytes(e);
    EntryRecord rec;
    rec.name = e.name;
    rec.kind = is_obj ? EntryKind::kObject : EntryKind::kTensor;
    rec.dtype = e.dtype;
    rec.shape = e.shape;
    int es = DTypeSize(e.dtype);
    uint64_t numel = global.size() / es;
    for (const GoldenChunk& gc : e.chunks) {
      std::string local(RegionElements(gc.region) * es, '\0');
      ForEachRun(e.shape, FlatRange{0, numel}, gc.region,
                 [&](uint64_t src, uint64_t dst, uint64_t n) {
                   std::memcpy(local.data() + dst * es,
                               global.data() + src * es, n * es);
                 });
      ShardBuilder& sb = shards[gc.shard];
      Pad(&sb.bytes, kAlign);
      ChunkRecord c;
      c.region = gc.region;
      c.shard = gc.shard;
      c.data_offset = sb.bytes.size();
      c.codec = e.codec;
      c.block_size = kBlock;
      for (uint64_t off = 0; off < local.size(); off += kBlock) {
        std::string raw = local.substr(off, kBlock), stored;
        if (e.codec == Codec::kZstd) {
          if (!enc.EncodeZstd(raw, &stored).ok()) return 1;
        } else {
          stored = raw;
        }
        c.blocks.push_back({stored.size(), Checksum(stored)});
        sb.bytes += stored;
        c.stored_length += stored.size();
      }
      // Index records keep block tables; the manifest's do not.
      auto sit =
          std::find_if(sb.index.entries.begin(), sb.index.entries.end(),
                       [&](const EntryRecord& r) { return r.name == e.name; });
      if (sit == sb.index.entries.end()) {
        EntryRecord r = rec;
        r.chunks.clear();
        sb.index.entries.push_back(r);
        sit = sb.index.entries.end() - 1;
      }
      sit->chunks.push_back(c);
      c.blocks.clear();
      rec.chunks.push_back(c);
    }
    // An entry with no chunks is listed, with none, in the lowest shard's
    // index, so that the manifest can be rebuilt from the shards (§5.7).
    if (e.chunks.empty()) shards[0].index.entries.push_back(rec);
    m.entries.push_back(rec);
  }
  std::string dir = root + "/" + StepDirName(kStep);
  std::filesystem::create_directories(dir);
  for (uint32_t s = 0; s < 2; ++s) {
    ShardBuilder& sb = shards[s];
    std::string idx = EncodeShardIndex(sb.index);
    ShardTail t{sb.bytes.size(), idx.size(), Checksum(idx)};
    sb.bytes += idx;
    sb.bytes += EncodeShardTail(t);
    std::ofstream(dir + "/" + ShardFileName(s), std::ios::binary) << sb.bytes;
    m.shards.push_back({s, ShardFileName(s), sb.bytes.size()});
  }
  std::ofstream(dir + "/MANIFEST", std::ios::binary) << EncodeManifest(m);
  std::ofstream(root + "/latest", std::ios::binary)
      << EncodeLatest(StepDirName(kStep));
  std::cout << "wrote " << dir << "\n";
  return 0;
}

}  // namespace
}  // namespace ckpt::golden

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: ckpt-golden-gen OUT_ROOT\n";
    return 2;
  }
  return ckpt::golden::Main(argv[1]);
}

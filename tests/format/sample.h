// Small valid structures for codec tests.
#ifndef CKPT_TESTS_FORMAT_SAMPLE_H_
#define CKPT_TESTS_FORMAT_SAMPLE_H_

#include <string>

#include "ckpt/format/checksum.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/records.h"

namespace ckpt::format::testing {

inline Manifest SampleManifest() {
  Manifest m;
  for (int i = 0; i < 16; ++i) m.info.id[i] = static_cast<uint8_t>(i * 17);
  m.info.step = 100;
  m.info.world_size = 2;
  m.info.created_unix_ns = 1763683200000000000;
  m.info.fingerprint[0] = 0xfe;
  m.info.writer = "ckpt test";
  m.metadata = {{"run", "llama-7b"}, {"lr", "3e-4"}};
  m.shards = {{0, "shard-00000.ckpt", 1 << 20},
              {1, "shard-00001.ckpt", 1 << 20}};
  EntryRecord w;
  w.name = "layers.0.w";
  w.dtype = DType::kBFloat16;
  w.shape = {8, 4};
  ChunkRecord c0;
  c0.region = Box{{0, 0}, {4, 4}};
  c0.shard = 0;
  c0.data_offset = 4096;
  c0.stored_length = 32;
  ChunkRecord c1 = c0;
  c1.region = Box{{4, 0}, {4, 4}};
  c1.shard = 1;
  w.chunks = {c0, c1};
  EntryRecord f;
  f.name = "optimizer.exp_avg";
  f.dtype = DType::kFloat32;
  f.shape = {10};
  ChunkRecord f0;
  f0.region = FlatRange{0, 3};
  f0.shard = 0;
  f0.data_offset = 8192;
  f0.stored_length = 12;
  ChunkRecord f1 = f0;
  f1.region = FlatRange{3, 7};
  f1.shard = 1;
  f1.stored_length = 28;
  f.chunks = {f0, f1};
  EntryRecord o;
  o.name = "rng";
  o.kind = EntryKind::kObject;
  o.dtype = DType::kUInt8;
  o.shape = {5};
  ChunkRecord oc;
  oc.region = FlatRange{0, 5};
  oc.shard = 1;
  oc.data_offset = 12288;
  oc.stored_length = 5;
  o.chunks = {oc};
  EntryRecord s;  // 0-d scalar
  s.name = "step";
  s.dtype = DType::kInt64;
  ChunkRecord sc;
  sc.region.emplace<Box>();  // 0-d: the empty box, built in place
  sc.shard = 0;
  sc.data_offset = 12288;
  sc.stored_length = 8;
  s.chunks = {sc};
  m.entries = {w, f, o, s};
  return m;
}

// Recomputes the manifest checksum after a test edited the bytes.
inline void ResealManifest(std::string* b) {
  size_t tail = b->size() - 16;
  StoreFixed64(b->data() + tail, Checksum(b->data(), tail));
}

// Byte offset of the first section header in a manifest.
inline constexpr size_t kFirstSection = 32;

}  // namespace ckpt::format::testing

#endif  // CKPT_TESTS_FORMAT_SAMPLE_H_

// Test checkpoints for ckpt-inspect and ckpt-validate, written at run time
// with the format codecs (format/), byte for byte as spec/FORMAT.md says:
// shard files with header, aligned payloads, index with block tables and
// tail; the manifest; `latest`.
//
// Why not ckpt::Writer: these tests need exact control (fixed ids and
// creation time, so that expected-output files need no placeholders but the
// temporary directory; any layout, including irregular and partial ones;
// hooks that make the index disagree with the manifest). Checkpoints saved
// by the real Writer are validated in validate_test.cc as well.
#ifndef CKPT_TESTS_TOOLS_INSPECT_FIXTURE_H_
#define CKPT_TESTS_TOOLS_INSPECT_FIXTURE_H_

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "ckpt/format/block_codec.h"
#include "ckpt/format/checksum.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/shard.h"
#include "ckpt/types.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "testing/cli.h"
#include "testing/expected_output.h"
#include "testing/files.h"

namespace ckpt::tools::testing {

struct FixturePiece {
  Region region;
  uint32_t shard = 0;
};

struct FixtureTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  std::vector<FixturePiece> pieces;  // what is stored, in this order
  bool object = false;               // an object: dtype uint8, shape {size}
  bool partial = false;
  format::Codec codec = format::Codec::kNone;
  uint64_t block_size = 4096;
  std::string data;  // the whole tensor (global row-major bytes)
};

struct FixtureSpec {
  uint64_t step = 7;
  uint32_t world = 4;
  uint32_t alignment = 64;
  format::CheckpointId id = {0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17,
                             0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f};
  int64_t created_unix_ns = 1795219200000000000;  // 2026-11-21T00:00:00Z
  format::Metadata metadata = {{"run", "fixture"}};
  std::vector<FixtureTensor> tensors;
  bool write_latest = true;
  // Called on each shard's index before it is encoded (to make it disagree
  // with the manifest).
  std::function<void(uint32_t shard, format::ShardIndex* index)> edit_index;
};

// Whole files and expected outputs: tests/testing/files.h and
// expected_output.h, under the names these suites use.
inline void WriteBytes(const std::string& path, const std::string& bytes) {
  ::ckpt::testing::WriteFileBytes(path, bytes);
}
inline std::string ReadBytes(const std::string& path) {
  return ::ckpt::testing::ReadFileBytes(path);
}
using ::ckpt::testing::ExpectOutput;

// Writes checkpoint spec.step under `root` and returns its directory.
inline std::string WriteCheckpoint(const std::string& root,
                                   const FixtureSpec& spec) {
  const std::string dir = root + "/" + format::StepDirName(spec.step);
  std::filesystem::create_directories(dir);
  format::Manifest m;
  m.info.id = spec.id;
  m.info.step = spec.step;
  m.info.world_size = spec.world;
  m.info.created_unix_ns = spec.created_unix_ns;
  m.info.fingerprint[0] = 0xf0;
  m.info.writer = "ckpt test fixture";
  m.metadata = spec.metadata;
  std::vector<std::string> files(spec.world);
  std::vector<format::ShardIndex> index(spec.world);
  for (uint32_t s = 0; s < spec.world; ++s) {
    format::ShardHeader h;
    h.checkpoint_id = spec.id;
    h.shard_id = s;
    h.alignment = spec.alignment;
    files[s] = format::EncodeShardHeader(h);
    index[s].info = m.info;
    index[s].metadata = m.metadata;
  }
  std::vector<const FixtureTensor*> sorted;
  for (const FixtureTensor& t : spec.tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const FixtureTensor* a, const FixtureTensor* b) {
              return a->name < b->name;
            });
  format::BlockEncoder encoder(3);
  for (const FixtureTensor* t : sorted) {
    format::EntryRecord e;
    e.name = t->name;
    e.kind =
        t->object ? format::EntryKind::kObject : format::EntryKind::kTensor;
    e.dtype = t->object ? DType::kUInt8 : t->dtype;
    e.shape = t->object ? Shape{t->data.size()} : t->shape;
    e.flags = t->partial ? format::kEntryFlagPartial : 0;
    std::vector<format::EntryRecord> per_shard(spec.world);
    for (const FixturePiece& p : t->pieces) {
      std::string raw =
          ckpt::testing::Extract(t->data, e.dtype, e.shape, p.region);
      format::ChunkRecord c;
      c.region = p.region;
      c.shard = p.shard;
      c.codec = t->codec;
      c.block_size = t->block_size;
      std::string& file = files[p.shard];
      if (!raw.empty()) {
        file.resize((file.size() + spec.alignment - 1) / spec.alignment *
                        spec.alignment,
                    '\0');
        c.data_offset = file.size();
      }
      for (uint64_t b = 0; b < raw.size(); b += t->block_size) {
        std::string block = raw.substr(b, t->block_size), stored = block;
        if (t->codec == format::Codec::kZstd)
          (void)encoder.EncodeZstd(block, &stored);
        c.blocks.push_back({stored.size(), format::Checksum(stored)});
        c.stored_length += stored.size();
        file += stored;
      }
      per_shard[p.shard].chunks.push_back(c);
      c.blocks.clear();
      e.chunks.push_back(c);
    }
    for (uint32_t s = 0; s < spec.world; ++s) {
      // Entries without any chunk are listed by shard 0 (§5.7).
      if (per_shard[s].chunks.empty() && !(e.chunks.empty() && s == 0))
        continue;
      format::EntryRecord ie = e;
      ie.chunks = std::move(per_shard[s].chunks);
      index[s].entries.push_back(std::move(ie));
    }
    m.entries.push_back(std::move(e));
  }
  for (uint32_t s = 0; s < spec.world; ++s) {
    index[s].required_features = format::RequiredFeaturesOf(index[s].entries);
    if (spec.edit_index) spec.edit_index(s, &index[s]);
    std::string idx = format::EncodeShardIndex(index[s]);
    format::ShardTail tail{files[s].size(), idx.size(), format::Checksum(idx)};
    files[s] += idx + format::EncodeShardTail(tail);
    m.shards.push_back({s, format::ShardFileName(s), files[s].size()});
    WriteBytes(dir + "/" + format::ShardFileName(s), files[s]);
  }
  WriteBytes(dir + "/" + format::kManifestFileName, format::EncodeManifest(m));
  if (spec.write_latest) {
    WriteBytes(root + "/" + format::kLatestFileName,
               format::EncodeLatest(format::StepDirName(spec.step)));
  }
  return dir;
}

// Element encoders for building tensors.
template <typename T>
std::string Elements(uint64_t n, const std::function<T(uint64_t)>& f) {
  std::string out(n * sizeof(T), '\0');
  for (uint64_t i = 0; i < n; ++i) {
    T v = f(i);
    std::memcpy(&out[i * sizeof(T)], &v, sizeof(T));
  }
  return out;
}

// bfloat16 of a float32 value that bfloat16 represents exactly.
inline uint16_t ToBFloat16(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return static_cast<uint16_t>(u >> 16);
}

// float16 of a normal value that float16 represents exactly.
inline uint16_t ToFloat16(double v) {
  if (v == 0) return 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  int e;
  double m = std::frexp(std::fabs(v), &e);  // v = m * 2^e, m in [0.5, 1)
  return static_cast<uint16_t>(sign | ((e - 1 + 15) << 10) |
                               static_cast<uint16_t>((m * 2 - 1) * 1024));
}

inline std::vector<FixturePiece> Rows(const Shape& shape, uint32_t parts) {
  std::vector<FixturePiece> out;
  const uint64_t step = shape[0] / parts;
  for (uint32_t r = 0; r < parts; ++r) {
    Box b = FullBox(shape);
    b.offset[0] = r * step;
    b.size[0] = step;
    out.push_back({b, r});
  }
  return out;
}

// The checkpoint of the expected-output tests: every dtype, every layout.
inline FixtureSpec StandardSpec() {
  FixtureSpec s;
  auto add = [&](FixtureTensor t) { s.tensors.push_back(std::move(t)); };
  {
    FixtureTensor t{"embed.w", DType::kBFloat16, {16, 8}};
    t.pieces = Rows(t.shape, 4);  // dim0 x4
    t.data = Elements<uint16_t>(128, [](uint64_t i) {
      return ToBFloat16(static_cast<float>(static_cast<int>(i % 13) - 6) *
                        0.5f);
    });
    add(t);
  }
  {
    FixtureTensor t{"layers.0.attn.w", DType::kFloat32, {8, 8}};
    for (uint32_t r = 0; r < 4; ++r) {  // dim0 x2 dim1 x2
      t.pieces.push_back({Box{{(r / 2) * 4, (r % 2) * 4}, {4, 4}}, r});
    }
    t.data = Elements<float>(64, [](uint64_t i) { return i * 0.25f - 8; });
    add(t);
  }
  {
    FixtureTensor t{"layers.0.attn.w.exp_avg", DType::kFloat32, {8, 8}};
    auto parts = ckpt::testing::UnevenSplit(64, 4);  // flat x4 uneven
    for (uint32_t r = 0; r < 4; ++r)
      t.pieces.push_back({FlatRange{parts[r].first, parts[r].second}, r});
    t.data = Elements<float>(64, [](uint64_t i) { return (i % 5) * 0.001f; });
    add(t);
  }
  {
    FixtureTensor t{"layers.0.mlp.w", DType::kFloat16, {4, 12}};
    for (uint32_t r = 0; r < 3; ++r)
      t.pieces.push_back({Box{{0, r * 4}, {4, 4}}, r});  // dim1 x3
    t.data = Elements<uint16_t>(
        48, [](uint64_t i) { return ToFloat16((int(i) - 24) * 0.125); });
    add(t);
  }
  {
    // A data-parallel replica: saved once, by one rank.
    FixtureTensor t{"layers.0.norm.w", DType::kFloat32, {8}};
    t.pieces = {{FullBox(t.shape), 1}};
    t.data = Elements<float>(8, [](uint64_t) { return 1.0f; });
    add(t);
  }
  {
    // Multi-block zstd chunks (8 KiB each, 4 KiB blocks).
    FixtureTensor t{"lm_head.w", DType::kFloat32, {64, 64}};
    t.pieces = Rows(t.shape, 2);
    t.pieces[1].shard = 2;
    t.codec = format::Codec::kZstd;
    t.data = Elements<float>(
        4096, [](uint64_t i) { return static_cast<float>(i % 4); });
    add(t);
  }
  {
    FixtureTensor t{"step", DType::kInt64, {}};
    t.pieces = {{FullBox(t.shape), 0}};
    t.data = Elements<int64_t>(1, [](uint64_t) { return int64_t{7}; });
    add(t);
  }
  {
    FixtureTensor t{"mask", DType::kBool, {10}};
    t.pieces = {{FullBox(t.shape), 3}};
    t.data = Elements<uint8_t>(
        10, [](uint64_t i) { return static_cast<uint8_t>(i % 3 == 0); });
    add(t);
  }
  {
    FixtureTensor t{"scales", DType::kFloat8E4M3FN, {4, 4}};
    t.pieces = {{FullBox(t.shape), 2}};
    // 0x38 = 1.0, 0x40 = 2.0, 0xb8 = -1.0, 0x7e = 448.
    t.data = Elements<uint8_t>(16, [](uint64_t i) {
      const uint8_t v[] = {0x38, 0x40, 0xb8, 0x7e};
      return v[i % 4];
    });
    add(t);
  }
  {
    FixtureTensor t{"grads8", DType::kFloat8E5M2, {8}};
    t.pieces = {{FlatRange{0, 4}, 0}, {FlatRange{4, 4}, 1}};  // flat x2 even
    // 0x3c = 1.0, 0xc0 = -2.0, 0x44 = 4.0, 0x00 = 0.
    t.data = Elements<uint8_t>(8, [](uint64_t i) {
      const uint8_t v[] = {0x3c, 0xc0, 0x44, 0x00};
      return v[i % 4];
    });
    add(t);
  }
  {
    FixtureTensor t{"tokens", DType::kInt32, {6}};
    t.pieces = {{FullBox(t.shape), 1}};
    t.data = Elements<int32_t>(
        6, [](uint64_t i) { return static_cast<int32_t>(i * 100) - 200; });
    add(t);
  }
  {
    FixtureTensor t{"empty", DType::kFloat32, {0, 4}};
    add(t);
  }
  {
    FixtureTensor t{"sparse", DType::kFloat32, {10}};
    t.partial = true;
    t.pieces = {{FlatRange{0, 5}, 3}};
    t.data =
        Elements<float>(10, [](uint64_t i) { return static_cast<float>(i); });
    add(t);
  }
  {
    FixtureTensor t{"irregular.w", DType::kFloat32, {4, 4}};
    t.pieces = {{Box{{0, 0}, {2, 4}}, 0},
                {Box{{2, 0}, {2, 2}}, 1},
                {Box{{2, 2}, {2, 2}}, 2}};
    t.data = Elements<float>(
        16, [](uint64_t i) { return static_cast<float>(i) / 16; });
    add(t);
  }
  {
    FixtureTensor t;
    t.name = "rng.rank0";
    t.object = true;
    t.data = "rng-state-0";
    t.pieces = {{FlatRange{0, t.data.size()}, 0}};
    add(t);
  }
  {
    FixtureTensor t;
    t.name = "rng.rank1";
    t.object = true;
    t.data = "rng-state-1";
    t.pieces = {{FlatRange{0, t.data.size()}, 1}};
    add(t);
  }
  return s;
}

// File offset of the first stored byte of chunk `chunk` of entry `name`.
inline uint64_t ChunkOffset(const std::string& dir, const std::string& name,
                            size_t chunk) {
  auto m = format::DecodeManifest(ReadBytes(dir + "/MANIFEST"));
  for (const auto& e : m->entries) {
    if (e.name == name) return e.chunks.at(chunk).data_offset;
  }
  ADD_FAILURE() << "no entry " << name;
  return 0;
}

inline void FlipByte(const std::string& path, uint64_t offset) {
  std::string bytes = ReadBytes(path);
  bytes.at(offset) ^= 0x5a;
  WriteBytes(path, bytes);
}

// The result of running a tool binary.
struct RunResult {
  int code = -1;
  std::string out, err;
};

// Runs `command` (a tool binary and its arguments, split at spaces; no
// shell: the paths tests use have no spaces) with stdout and stderr
// captured in `tmp`.
inline RunResult Run(const std::string& command, const std::string& tmp) {
  std::vector<std::string> args =
      absl::StrSplit(command, ' ', absl::SkipEmpty());
  const std::string binary = args.empty() ? "" : args.front();
  if (!args.empty()) args.erase(args.begin());
  ckpt::testing::CliResult c = ckpt::testing::RunCli(binary, args, tmp);
  EXPECT_NE(c.exit_code, -1) << c.err;
  std::filesystem::remove(tmp + "/cli.stdout");
  std::filesystem::remove(tmp + "/cli.stderr");
  return RunResult{c.exit_code, c.out, c.err};
}

// `text` with the run's temporary directory replaced by "<TMP>".
inline std::string Normalize(const std::string& text, const std::string& tmp) {
  return ::ckpt::testing::ReplaceTmp(text, tmp);
}

}  // namespace ckpt::tools::testing

#endif  // CKPT_TESTS_TOOLS_INSPECT_FIXTURE_H_

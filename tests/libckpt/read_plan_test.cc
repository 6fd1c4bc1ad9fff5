// The block-read plan (libckpt/read/read_plan.h): pure functions, tested
// on hand-made manifests and block tables, without any file.
#include "read/read_plan.h"

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/geometry_reference.h"
#include "testing/status_matchers.h"

namespace ckpt::internal {
namespace {

using ::ckpt::testing::StatusIs;
using format::BlockRecord;
using format::ChunkRecord;
using format::EntryRecord;
using format::Manifest;
using ::testing::ElementsAre;

// A manifest of one float32 entry "w" of `shape`, chunk i holding
// regions[i] in shard shards[i]; and the block tables of those chunks, with
// block b of chunk c stored in (c + b) % 3 + 1 fewer bytes than raw when
// `compressed` (so that stored offsets differ from raw ones).
struct Fixture {
  Manifest manifest;
  std::map<std::pair<uint32_t, uint32_t>, ChunkRecord> indexed;

  Fixture(Shape shape, std::vector<Region> regions,
          std::vector<uint32_t> shards, uint64_t block_size, bool compressed) {
    manifest.info.world_size = 4;
    EntryRecord e;
    e.name = "w";
    e.dtype = DType::kFloat32;
    e.shape = shape;
    std::map<uint32_t, uint64_t> end;  // next free offset per shard
    for (size_t c = 0; c < regions.size(); ++c) {
      ChunkRecord rec;
      rec.region = regions[c];
      rec.shard = shards[c];
      rec.block_size = block_size;
      rec.codec = compressed ? format::Codec::kZstd : format::Codec::kNone;
      const uint64_t raw = RegionElements(regions[c]) * 4;
      ChunkRecord with_blocks = rec;
      uint64_t stored = 0;
      for (uint64_t b = 0; b * block_size < raw; ++b) {
        uint64_t size = std::min(block_size, raw - b * block_size);
        if (compressed) size -= (c + b) % 3 + 1;
        with_blocks.blocks.push_back(BlockRecord{size, 0});
        stored += size;
      }
      rec.data_offset = with_blocks.data_offset = 64 + end[rec.shard];
      rec.stored_length = with_blocks.stored_length = stored;
      end[rec.shard] += stored;
      e.chunks.push_back(rec);
      indexed[{0, static_cast<uint32_t>(c)}] = with_blocks;
    }
    manifest.entries.push_back(e);
  }

  BlockTableLookup Lookup() const {
    return [this](uint32_t e, uint32_t c) { return &indexed.at({e, c}); };
  }
};

TEST(PairRequests, FlatRequestAcrossTwoChunks) {
  Fixture f({100}, {FlatRange{0, 60}, FlatRange{60, 40}}, {0, 1}, 16, false);
  auto pieces = PairRequests(f.manifest, {PlanRequest{0, FlatRange{50, 20}}});
  ASSERT_THAT(pieces, ::ckpt::testing::IsOk());
  ASSERT_EQ(pieces->size(), 2u);
  EXPECT_THAT((*pieces)[0].copies, ElementsAre(Copy{0, 50 * 4, 0, 10 * 4}));
  EXPECT_THAT((*pieces)[1].copies, ElementsAre(Copy{0, 0, 10 * 4, 10 * 4}));
  EXPECT_THAT(ShardsOf(f.manifest, *pieces), ElementsAre(0u, 1u));
}

TEST(PairRequests, EmptyRegionNeedsNoChunk) {
  Fixture f({100}, {FlatRange{0, 100}}, {0}, 16, false);
  auto pieces = PairRequests(f.manifest, {PlanRequest{0, FlatRange{7, 0}}});
  ASSERT_THAT(pieces, ::ckpt::testing::IsOk());
  EXPECT_TRUE(pieces->empty());
}

TEST(PairRequests, UncoveredRegionIsDataLossNamingEntryAndCount) {
  // A partial entry: elements [60, 100) were not saved.
  Fixture f({100}, {FlatRange{0, 60}}, {0}, 16, false);
  EXPECT_THAT(
      PairRequests(f.manifest, {PlanRequest{0, FlatRange{50, 20}}}),
      StatusIs(absl::StatusCode::kDataLoss,
               "entry 'w': requested region flat[50:70) is not covered by "
               "the checkpoint: 10 of 20 elements missing"));
}

TEST(PlanBlockReads, ReadsOnlyTheBlocksARequestTouches) {
  // Blocks of 16 bytes = 4 elements; elements [9, 15) lie in blocks 2 and 3.
  Fixture f({100}, {FlatRange{0, 100}}, {0}, 16, true);
  auto pieces =
      PairRequests(f.manifest, {PlanRequest{0, FlatRange{9, 6}}}).value();
  ReadPlan plan = PlanBlockReads(f.manifest, pieces, f.Lookup(), 1 << 20);
  ASSERT_EQ(plan.shards.size(), 1u);
  ASSERT_EQ(plan.shards[0].reads.size(), 1u);
  const BlockRead& r = plan.shards[0].reads[0];
  const ChunkRecord& c = f.indexed.at({0, 0});
  EXPECT_EQ(r.b0, 2u);
  EXPECT_EQ(r.b1, 4u);
  EXPECT_EQ(r.offset,
            c.data_offset + c.blocks[0].stored_size + c.blocks[1].stored_size);
  EXPECT_EQ(r.length, c.blocks[2].stored_size + c.blocks[3].stored_size);
  EXPECT_EQ(r.raw_begin, 32u);
  EXPECT_EQ(r.raw_end, 64u);
  EXPECT_THAT(r.copies, ElementsAre(Copy{0, 36, 0, 24}));
  EXPECT_EQ(plan.stored_bytes, r.length);
}

TEST(PlanBlockReads, ABlockTwoRequestsNeedIsReadOnce) {
  Fixture f({100}, {FlatRange{0, 100}}, {0}, 16, false);
  auto pieces = PairRequests(f.manifest, {PlanRequest{0, FlatRange{0, 6}},
                                          PlanRequest{0, FlatRange{5, 3}}})
                    .value();
  ReadPlan plan = PlanBlockReads(f.manifest, pieces, f.Lookup(), 1 << 20);
  ASSERT_EQ(plan.shards.size(), 1u);
  ASSERT_EQ(plan.shards[0].reads.size(), 1u);
  const BlockRead& r = plan.shards[0].reads[0];
  EXPECT_EQ(r.b0, 0u);
  EXPECT_EQ(r.b1, 2u);
  EXPECT_THAT(r.copies, ElementsAre(Copy{0, 0, 0, 24}, Copy{1, 20, 0, 12}));
}

TEST(PlanBlockReads, LongSpansAreCutIntoBoundedReadsThatSplitCopies) {
  // 100 elements = 25 blocks of 16 bytes; reads of at most 64 bytes = 4
  // blocks.
  Fixture f({100}, {FlatRange{0, 100}}, {0}, 16, false);
  auto pieces =
      PairRequests(f.manifest, {PlanRequest{0, FlatRange{2, 30}}}).value();
  ReadPlan plan = PlanBlockReads(f.manifest, pieces, f.Lookup(), 64);
  const std::vector<BlockRead>& reads = plan.shards.at(0).reads;
  ASSERT_EQ(reads.size(), 2u);  // blocks [0, 4) and [4, 8)
  EXPECT_EQ(reads[0].b1, 4u);
  EXPECT_EQ(reads[1].b0, 4u);
  EXPECT_EQ(reads[1].b1, 8u);
  EXPECT_THAT(reads[0].copies, ElementsAre(Copy{0, 8, 0, 56}));
  EXPECT_THAT(reads[1].copies, ElementsAre(Copy{0, 64, 56, 64}));
}

TEST(PlanBlockReads, SeparateSpansOfAChunkAreSeparateReads) {
  // A column of a 2-d chunk: one element per row, rows 64 bytes apart.
  Fixture f({4, 16}, {Box{{0, 0}, {4, 16}}}, {0}, 16, false);
  auto pieces =
      PairRequests(f.manifest, {PlanRequest{0, Box{{0, 1}, {4, 1}}}}).value();
  ReadPlan plan = PlanBlockReads(f.manifest, pieces, f.Lookup(), 1 << 20);
  const std::vector<BlockRead>& reads = plan.shards.at(0).reads;
  ASSERT_EQ(reads.size(), 4u);
  for (size_t i = 0; i < reads.size(); ++i) {
    EXPECT_EQ(reads[i].b0, 4 * i);
    EXPECT_EQ(reads[i].b1, 4 * i + 1);
    EXPECT_THAT(reads[i].copies, ElementsAre(Copy{0, 64 * i + 4, 4 * i, 4}));
  }
}

TEST(PlanBlockReads, ShardsByIdAndReadsInFileOrder) {
  // Chunks listed in the manifest out of file order, in two shards.
  Fixture f({40},
            {FlatRange{30, 10}, FlatRange{0, 10}, FlatRange{10, 10},
             FlatRange{20, 10}},
            {1, 0, 1, 0}, 8, false);
  f.indexed.at({0, 0}).data_offset = 640;  // after chunk 2 in shard 1
  f.manifest.entries[0].chunks[0].data_offset = 640;
  auto pieces =
      PairRequests(f.manifest, {PlanRequest{0, FlatRange{0, 40}}}).value();
  ReadPlan plan = PlanBlockReads(f.manifest, pieces, f.Lookup(), 1 << 20);
  ASSERT_EQ(plan.shards.size(), 2u);
  EXPECT_EQ(plan.shards[0].shard, 0u);
  EXPECT_EQ(plan.shards[1].shard, 1u);
  for (const ShardReads& sr : plan.shards) {
    for (size_t i = 1; i < sr.reads.size(); ++i) {
      EXPECT_LT(sr.reads[i - 1].offset, sr.reads[i].offset);
    }
  }
  EXPECT_EQ(plan.shards[1].reads.back().chunk, 0u);
}

// Every destination byte is written exactly once, from the right source
// byte, for random boxes over a grid of chunks (checked element by element
// against the brute-force geometry reference).
TEST(PlanBlockReads, RandomBoxesEveryDestinationByteOnceFromTheRightPlace) {
  const Shape shape = {12, 10};
  std::vector<Region> grid;
  std::vector<uint32_t> shards;
  for (uint64_t r = 0; r < 12; r += 4) {
    for (uint64_t c = 0; c < 10; c += 5) {
      grid.push_back(Box{{r, c}, {4, 5}});
      shards.push_back(static_cast<uint32_t>(grid.size() % 3));
    }
  }
  Fixture f(shape, grid, shards, 12, true);  // blocks of 3 elements
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<PlanRequest> reqs;
    for (int k = 0; k < 3; ++k) {
      uint64_t r0 = rng() % 12, c0 = rng() % 10;
      uint64_t rn = 1 + rng() % (12 - r0), cn = 1 + rng() % (10 - c0);
      reqs.push_back(PlanRequest{0, Box{{r0, c0}, {rn, cn}}});
    }
    auto pieces = PairRequests(f.manifest, reqs).value();
    ReadPlan plan = PlanBlockReads(f.manifest, pieces, f.Lookup(), 24);
    // For each request, dst element -> (chunk, src element) seen.
    std::vector<std::vector<int>> written(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      written[i].assign(RegionElements(reqs[i].region), 0);
    }
    for (const ShardReads& sr : plan.shards) {
      for (const BlockRead& r : sr.reads) {
        const Region& chunk = f.manifest.entries[0].chunks[r.chunk].region;
        EXPECT_EQ(f.manifest.entries[0].chunks[r.chunk].shard, sr.shard);
        for (const Copy& c : r.copies) {
          ASSERT_GE(c.src, r.raw_begin);
          ASSERT_LE(c.src_end(), r.raw_end);
          ASSERT_EQ(c.run % 4, 0u);
          ForEachRunIn(
              c, 0, UINT64_MAX, [&](uint64_t s, uint64_t d, uint64_t n) {
                for (uint64_t k = 0; k < n / 4; ++k) {
                  const uint64_t src = s / 4 + k, dst = d / 4 + k;
                  // The same global element on both sides.
                  uint64_t g = 0;
                  while (::ckpt::testing::LocalIndexOf(shape, chunk, g) !=
                         static_cast<int64_t>(src)) {
                    ++g;
                  }
                  EXPECT_EQ(::ckpt::testing::LocalIndexOf(
                                shape, reqs[c.request].region, g),
                            static_cast<int64_t>(dst));
                  ++written[c.request][dst];
                }
              });
        }
      }
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      for (int w : written[i])
        ASSERT_EQ(w, 1) << "trial " << trial << " request " << i;
    }
  }
}

// A column band is one copy per chunk, of a run per row at the chunk's and
// the band's row pitches, not a copy per row: a load by columns plans in
// time and memory of its chunks, not of its rows.
TEST(PairRequests, AColumnBandIsOneStridedCopyPerChunk) {
  const Shape shape = {12, 10};
  Fixture f(shape, {Box{{0, 0}, {6, 10}}, Box{{6, 0}, {6, 10}}}, {0, 1}, 64,
            false);
  auto pieces =
      PairRequests(f.manifest, {PlanRequest{0, Box{{2, 3}, {8, 4}}}}).value();
  ASSERT_EQ(pieces.size(), 2u);
  // Rows 2..5 of chunk 0 (row pitch 40 bytes) to rows 0..3 of the band (16).
  EXPECT_THAT(pieces[0].copies,
              ElementsAre(Copy::Rows(0, (2 * 10 + 3) * 4, 0, 16, 4, 40, 16)));
  EXPECT_THAT(pieces[1].copies,
              ElementsAre(Copy::Rows(0, 3 * 4, 4 * 16, 16, 4, 40, 16)));
}

// The bytes (src -> dst) of the runs of `c` that lie in [lo, hi), one by
// one: what ClipCopy's copies must give together.
std::map<uint64_t, uint64_t> BytesIn(const Copy& c, uint64_t lo, uint64_t hi) {
  std::map<uint64_t, uint64_t> out;
  for (uint64_t k = 0; k < c.rows; ++k) {
    for (uint64_t i = 0; i < c.run; ++i) {
      const uint64_t s = c.src + k * c.src_pitch + i;
      if (s >= lo && s < hi) out[s] = c.dst + k * c.dst_pitch + i;
    }
  }
  return out;
}

// ClipCopy gives exactly the bytes of a copy's runs within a range, in at
// most three copies in source order; ForEachRunIn walks the same bytes;
// ForEachBlockSpan names exactly the blocks the runs touch.
TEST(ClipCopy, GivesExactlyTheRunsInARangeInAtMostThreeCopies) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const uint64_t run = 1 + rng() % 9, rows = 1 + rng() % 7;
    const uint64_t sp = run + rng() % 12, dp = run + rng() % 5;
    const Copy c = Copy::Rows(0, rng() % 20, rng() % 20, run,
                              static_cast<uint32_t>(rows), sp, dp);
    const uint64_t lo = rng() % 100, hi = lo + rng() % 60;
    std::vector<Copy> parts;
    ClipCopy(c, lo, hi, [&](const Copy& p) { parts.push_back(p); });
    ASSERT_LE(parts.size(), 3u) << "trial " << trial;
    std::map<uint64_t, uint64_t> got, walked;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i > 0) {
        EXPECT_LT(parts[i - 1].src, parts[i].src) << "trial " << trial;
      }
      for (const auto& [s, d] : BytesIn(parts[i], 0, UINT64_MAX)) {
        EXPECT_TRUE(got.emplace(s, d).second) << "trial " << trial;
      }
    }
    EXPECT_EQ(got, BytesIn(c, lo, hi)) << "trial " << trial;
    ForEachRunIn(c, lo, hi, [&](uint64_t s, uint64_t d, uint64_t n) {
      for (uint64_t i = 0; i < n; ++i) walked.emplace(s + i, d + i);
    });
    EXPECT_EQ(walked, BytesIn(c, lo, hi)) << "trial " << trial;
    const uint64_t bs = 1 + rng() % 16;
    std::set<uint64_t> blocks, spanned;
    for (const auto& [s, d] : BytesIn(c, 0, UINT64_MAX)) blocks.insert(s / bs);
    ForEachBlockSpan(c, bs, [&](uint64_t first, uint64_t end) {
      for (uint64_t b = first; b < end; ++b) spanned.insert(b);
    });
    EXPECT_EQ(spanned, blocks) << "trial " << trial;
  }
}

// A read boundary inside a run cuts the copy into the run's two parts and
// the whole runs on either side (ClipCopy), and every byte goes once.
TEST(PlanBlockReads, ReadBoundariesCutAStridedCopyInsideARun) {
  const Shape shape = {8, 10};
  Fixture f(shape, {Box{{0, 0}, {8, 10}}}, {0}, 100, false);
  auto pieces =
      PairRequests(f.manifest, {PlanRequest{0, Box{{0, 2}, {8, 6}}}}).value();
  ASSERT_EQ(pieces.size(), 1u);
  ASSERT_EQ(pieces[0].copies.size(), 1u);
  // Blocks of 100 bytes, one per read: row 2 (bytes 80..120) straddles
  // the first boundary, its run [88, 112) is cut at 100.
  ReadPlan plan = PlanBlockReads(f.manifest, pieces, f.Lookup(), 100);
  ASSERT_EQ(plan.shards.size(), 1u);
  const std::vector<BlockRead>& reads = plan.shards[0].reads;
  ASSERT_EQ(reads.size(), 4u);
  EXPECT_THAT(reads[0].copies, ElementsAre(Copy::Rows(0, 8, 0, 24, 2, 40, 24),
                                           Copy(0, 88, 48, 12)));
  EXPECT_THAT(
      reads[1].copies,
      ElementsAre(Copy(0, 100, 60, 12), Copy::Rows(0, 128, 72, 24, 2, 40, 24)));
}

// PlanBlockReads merges the pieces' copies, which PairRequests gives in
// source order; copies in any other order are sorted instead, and the plan
// is the same. (3-d bands: a copy per plane, each of a run per row.)
TEST(PlanBlockReads, PiecesWithCopiesOutOfOrderGiveTheSamePlan) {
  const Shape shape = {4, 3, 10};
  Fixture f(shape, {Box{{0, 0, 0}, {4, 3, 10}}}, {0}, 12, false);
  const std::vector<PlanRequest> reqs = {
      PlanRequest{0, Box{{0, 0, 0}, {4, 2, 4}}},
      PlanRequest{0, Box{{0, 0, 4}, {4, 2, 3}}},
      PlanRequest{0, Box{{1, 1, 7}, {3, 2, 3}}}};
  auto pieces = PairRequests(f.manifest, reqs).value();
  auto reversed = pieces;
  for (ChunkPiece& p : reversed) std::reverse(p.copies.begin(), p.copies.end());
  ASSERT_GT(pieces[0].copies.size(), 1u);
  const ReadPlan a = PlanBlockReads(f.manifest, pieces, f.Lookup(), 24);
  const ReadPlan b = PlanBlockReads(f.manifest, reversed, f.Lookup(), 24);
  ASSERT_EQ(a.shards.size(), b.shards.size());
  for (size_t s = 0; s < a.shards.size(); ++s) {
    ASSERT_EQ(a.shards[s].reads.size(), b.shards[s].reads.size());
    for (size_t r = 0; r < a.shards[s].reads.size(); ++r) {
      const BlockRead& x = a.shards[s].reads[r];
      const BlockRead& y = b.shards[s].reads[r];
      EXPECT_EQ(std::tie(x.b0, x.b1, x.offset, x.length),
                std::tie(y.b0, y.b1, y.offset, y.length));
      EXPECT_EQ(std::vector<Copy>(x.copies.begin(), x.copies.end()),
                std::vector<Copy>(y.copies.begin(), y.copies.end()));
    }
  }
}
}  // namespace
}  // namespace ckpt::internal

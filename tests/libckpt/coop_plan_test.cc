// The cooperative load plan (libckpt/load/coop/coop_plan.h): pure functions,
// tested on hand-made manifests and block tables against brute force.
#include "load/coop/coop_plan.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::internal {
namespace {

using ::ckpt::testing::StatusIs;
using format::BlockRecord;
using format::ChunkRecord;
using format::EntryRecord;
using format::Manifest;
using ::testing::HasSubstr;

// A manifest of float32 entries of shape {rows, cols}, each stored as
// row bands (chunk c in shard c % 3), uncompressed, in blocks of
// `block_size` bytes; and the block tables.
struct Fixture {
  Manifest manifest;
  std::map<std::pair<uint32_t, uint32_t>, ChunkRecord> indexed;

  Fixture(int entries, uint64_t rows, uint64_t cols, uint64_t block_size,
          std::mt19937_64& rng) {
    std::map<uint32_t, uint64_t> end;
    for (int i = 0; i < entries; ++i) {
      EntryRecord e;
      e.name = "w" + std::to_string(i);
      e.dtype = DType::kFloat32;
      e.shape = {rows, cols};
      uint64_t r0 = 0;
      while (r0 < rows) {
        const uint64_t n = std::min<uint64_t>(rows - r0, 1 + rng() % 5);
        ChunkRecord c;
        c.region = Box{{r0, 0}, {n, cols}};
        c.shard = static_cast<uint32_t>(e.chunks.size() % 3);
        c.block_size = block_size;
        const uint64_t raw = n * cols * 4;
        ChunkRecord with = c;
        for (uint64_t b = 0; b * block_size < raw; ++b) {
          with.blocks.push_back(
              BlockRecord{std::min(block_size, raw - b * block_size), 0});
        }
        c.data_offset = with.data_offset = 64 + end[c.shard];
        c.stored_length = with.stored_length = raw;
        end[c.shard] += raw;
        indexed[{static_cast<uint32_t>(i),
                 static_cast<uint32_t>(e.chunks.size())}] = with;
        e.chunks.push_back(c);
        r0 += n;
      }
      manifest.entries.push_back(e);
    }
  }
  BlockTableLookup Lookup() const {
    return [this](uint32_t e, uint32_t c) { return &indexed.at({e, c}); };
  }
};

Box RandomBox(const Shape& s, std::mt19937_64& rng) {
  Box b;
  for (uint64_t d : s) {
    const uint64_t o = rng() % d;
    b.offset.push_back(o);
    b.size.push_back(1 + rng() % (d - o));
  }
  return b;
}

struct Planned {
  RequestGroups groups;
  CoopPlan plan;
};

// Rank r runs on node nodes[r] ("" or missing: unknown).
Planned Plan(const Fixture& f,
             const std::vector<std::vector<PlanRequest>>& per_rank,
             const CoopOptions& o = {},
             const std::vector<std::string>& nodes = {}) {
  std::vector<std::string> encoded;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    encoded.push_back(
        EncodeRankRequests(r < nodes.size() ? nodes[r] : "", per_rank[r]));
  }
  auto g = GroupRequests(f.manifest, encoded);
  EXPECT_TRUE(g.ok()) << g.status();
  auto pieces = PairRequests(f.manifest, g->unique);
  EXPECT_TRUE(pieces.ok()) << pieces.status();
  Planned p{*g, {}};
  p.plan = PlanCooperativeReads(f.manifest, p.groups, *pieces, f.Lookup(), o);
  return p;
}

TEST(GroupRequestsTest, MergesIdenticalRequestsAndListsHolders) {
  std::mt19937_64 rng(1);
  Fixture f(2, 8, 4, 16, rng);
  const PlanRequest a{0, Box{{0, 0}, {8, 4}}}, b{1, FlatRange{3, 9}};
  auto g = GroupRequests(
      f.manifest, {EncodeRankRequests("", {a, b}), EncodeRankRequests("", {b}),
                   EncodeRankRequests("", {a, a})});
  CKPT_ASSERT_OK(g);
  ASSERT_EQ(g->unique.size(), 2u);
  EXPECT_EQ(g->unique[0].region, a.region);
  EXPECT_EQ(g->unique[1].region, b.region);
  EXPECT_EQ(g->first, (std::vector<uint64_t>{0, 3, 5}));
  std::vector<std::pair<uint32_t, uint32_t>> h;
  for (const Holder& x : g->holders) h.emplace_back(x.rank, x.index);
  EXPECT_EQ(h, (std::vector<std::pair<uint32_t, uint32_t>>{
                   {0, 0}, {2, 0}, {2, 1}, {0, 1}, {1, 0}}));
}

TEST(GroupRequestsTest,
     RanksOfOneNodeShareItAndUnnamedRanksAreNodesOfTheirOwn) {
  std::mt19937_64 rng(1);
  Fixture f(1, 8, 4, 16, rng);
  const PlanRequest a{0, Box{{0, 0}, {8, 4}}};
  std::vector<std::string> encoded;
  for (const char* node : {"n1", "", "n2", "n1", "", "n2"}) {
    encoded.push_back(EncodeRankRequests(node, {a}));
  }
  auto g = GroupRequests(f.manifest, encoded);
  CKPT_ASSERT_OK(g);
  EXPECT_EQ(g->node, (std::vector<uint32_t>{0, 1, 2, 0, 3, 2}));
  EXPECT_EQ(g->nodes, 4u);
  // Replicas on different nodes still plan their requests once.
  EXPECT_EQ(g->unique.size(), 1u);
  EXPECT_EQ(g->holders.size(), 6u);
}

TEST(GroupRequestsTest, RejectsAnEntryOutsideTheManifest) {
  std::mt19937_64 rng(1);
  Fixture f(1, 8, 4, 16, rng);
  EXPECT_THAT(GroupRequests(f.manifest,
                            {EncodeRankRequests("", {}),
                             EncodeRankRequests("", {{5, FlatRange{0, 1}}})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "rank 1: request 0: entry 5 is not in the "
                       "manifest (1 entries)"));
}

TEST(GroupRequestsTest, RejectsARegionOutsideTheTensor) {
  std::mt19937_64 rng(1);
  Fixture f(1, 8, 4, 16, rng);
  EXPECT_THAT(GroupRequests(f.manifest, {EncodeRankRequests(
                                            "", {{0, Box{{7, 0}, {2, 4}}}})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "rank 0: request 0: entry 'w0'"));
}

TEST(GroupRequestsTest, TornBytesAreInternal) {
  std::mt19937_64 rng(1);
  Fixture f(1, 8, 4, 16, rng);
  std::string bytes = EncodeRankRequests("", {{0, Box{{0, 0}, {8, 4}}}});
  bytes.pop_back();
  EXPECT_THAT(GroupRequests(f.manifest, {bytes}),
              StatusIs(absl::StatusCode::kInternal,
                       "the requests of rank 0 do not decode"));
}

// Random jobs: every needed block is read exactly once, nothing else is
// read, and every byte of every rank's request is delivered exactly once,
// with the right source byte, by brute force.
TEST(PlanCooperativeReadsTest, RandomJobsReadEachNeededBlockOnceAndDeliverAll) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const uint64_t rows = 1 + rng() % 12, cols = 1 + rng() % 9;
    Fixture f(1 + rng() % 3, rows, cols, 4 * (1 + rng() % 10), rng);
    const int ranks = 1 + rng() % 6;
    std::vector<std::vector<PlanRequest>> per_rank(ranks);
    for (auto& reqs : per_rank) {
      for (int k = rng() % 4; k > 0; --k) {
        const uint32_t e = rng() % f.manifest.entries.size();
        reqs.push_back({e, RandomBox(f.manifest.entries[e].shape, rng)});
      }
    }
    CoopOptions o;
    o.max_read_bytes = 4 * (1 + rng() % 40);
    o.round_bytes = 1 + rng() % 200;
    std::vector<std::string> nodes;  // none, or ranks on 1-3 named nodes
    if (trial % 2 == 1) {
      for (int r = 0; r < ranks; ++r) {
        nodes.push_back(rng() % 4 == 0 ? "" : "n" + std::to_string(rng() % 3));
      }
    }
    Planned p = Plan(f, per_rank, o, nodes);
    // Brute force: the needed blocks, as (entry, chunk, block).
    std::set<std::tuple<uint32_t, uint32_t, uint64_t>> needed, read;
    for (const auto& reqs : per_rank) {
      for (const PlanRequest& r : reqs) {
        const EntryRecord& e = f.manifest.entries[r.entry];
        for (uint32_t c = 0; c < e.chunks.size(); ++c) {
          const uint64_t bs = e.chunks[c].block_size;
          ForEachRun(e.shape, e.chunks[c].region, r.region,
                     [&](uint64_t s, uint64_t, uint64_t k) {
                       for (uint64_t b = s * 4 / bs; b * bs < (s + k) * 4; ++b)
                         needed.insert({r.entry, c, b});
                     });
        }
      }
    }
    std::vector<uint64_t> by_rank(ranks, 0);
    // Delivered bytes: (rank, request, dst byte) -> global element byte.
    std::map<std::tuple<uint32_t, uint32_t, uint64_t>, uint64_t> got;
    for (const CoopRead& cr : p.plan.reads) {
      ASSERT_LT(cr.reader, static_cast<uint32_t>(ranks));
      ASSERT_LT(cr.round, p.plan.rounds);
      by_rank[cr.reader] += cr.read.length;
      for (uint64_t b = cr.read.b0; b < cr.read.b1; ++b) {
        ASSERT_TRUE(read.insert({cr.read.entry, cr.read.chunk, b}).second)
            << "trial " << trial << ": block read twice";
      }
      const ChunkRecord& chunk =
          f.manifest.entries[cr.read.entry].chunks[cr.read.chunk];
      ForEachDelivery(p.groups, cr.read, [&](const Holder& h, const Copy& c) {
        ASSERT_GE(c.src, cr.read.raw_begin);
        ASSERT_LE(c.src_end(), cr.read.raw_end);
        ForEachRunIn(c, 0, UINT64_MAX, [&](uint64_t s, uint64_t d, uint64_t n) {
          for (uint64_t i = 0; i < n; ++i) {
            // Source: global byte of the chunk's raw byte s + i.
            const uint64_t el = (s + i) / 4;
            const Box& box = std::get<Box>(chunk.region);
            const uint64_t g = (box.offset[0] + el / cols) * cols + el % cols;
            ASSERT_TRUE(
                got.insert({{h.rank, h.index, d + i}, g * 4 + (s + i) % 4})
                    .second)
                << "trial " << trial << ": byte delivered twice";
          }
        });
      });
    }
    EXPECT_EQ(read, needed) << "trial " << trial;
    EXPECT_EQ(by_rank, p.plan.bytes_read);
    for (int r = 0; r < ranks; ++r) {
      for (uint32_t i = 0; i < per_rank[r].size(); ++i) {
        const PlanRequest& q = per_rank[r][i];
        const Shape& s = f.manifest.entries[q.entry].shape;
        for (uint64_t l = 0; l < RegionElements(q.region); ++l) {
          for (uint64_t k = 0; k < 4; ++k) {
            auto it = got.find({r, i, l * 4 + k});
            ASSERT_NE(it, got.end()) << "trial " << trial << " rank " << r;
            const Box& b = std::get<Box>(q.region);
            const uint64_t g = (b.offset[0] + l / b.size[1]) * s[1] +
                               b.offset[1] + l % b.size[1];
            EXPECT_EQ(it->second, g * 4 + k) << "trial " << trial;
          }
        }
      }
    }
  }
}

uint64_t LargestRead(const CoopPlan& plan) {
  uint64_t largest = 0;
  for (const CoopRead& cr : plan.reads) {
    largest = std::max(largest, cr.read.length);
  }
  return largest;
}

// The bytes read by the ranks of `node`.
std::vector<uint64_t> RanksOfNode(const Planned& p, uint32_t node) {
  std::vector<uint64_t> out;
  for (uint32_t r = 0; r < p.groups.ranks; ++r) {
    if (p.groups.node[r] == node) out.push_back(p.plan.bytes_read[r]);
  }
  return out;
}

// max - min of `v`.
uint64_t Spread(const std::vector<uint64_t>& v) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *hi - *lo;
}

// The fewest bytes any rank reads.
uint64_t SmallestRead(const CoopPlan& plan) {
  return *std::min_element(plan.bytes_read.begin(), plan.bytes_read.end());
}

// `ranks` replicas, each requesting the whole of entries 0 .. 3 (64 x 64).
std::vector<std::vector<PlanRequest>> FourEntryReplicas(int ranks) {
  std::vector<std::vector<PlanRequest>> per_rank(ranks);
  for (auto& reqs : per_rank) {
    for (uint32_t e = 0; e < 4; ++e) reqs.push_back({e, Box{{0, 0}, {64, 64}}});
  }
  return per_rank;
}

// Data-parallel replicas: every rank wants everything; the bytes read are
// spread evenly (within one read) and each read goes to a rank that
// needs it.
TEST(PlanCooperativeReadsTest, ReplicasSpreadTheReadsEvenly) {
  std::mt19937_64 rng(3);
  Fixture f(4, 64, 64, 1024, rng);
  Planned p = Plan(f, FourEntryReplicas(8));
  EXPECT_EQ(p.plan.stored_bytes, 4u * 64 * 64 * 4);
  EXPECT_LE(Spread(p.plan.bytes_read), LargestRead(p.plan));
  EXPECT_GT(SmallestRead(p.plan), 0u);
}

// Regression (issue 26, object stores): spreading a small job's bytes over
// many ranks cuts reads no smaller than min_read_bytes (S3Storage's 1 MiB),
// each read being a request to the storage; only a chunk's last read is
// shorter.
TEST(PlanCooperativeReadsTest, SpreadReadsAreNotCutBelowMinReadBytes) {
  std::mt19937_64 rng(5);
  // 2 entries of 16 rows of 1 MiB (float32) in chunks of 1 to 5 rows and
  // 64 KiB blocks; 64 replicas: without a floor, reads of 128 KiB
  // (32 MiB / 256).
  Fixture f(2, 16, 1 << 18, 64 << 10, rng);
  std::vector<std::vector<PlanRequest>> per_rank(64);
  for (auto& reqs : per_rank) {
    for (uint32_t e = 0; e < 2; ++e) {
      reqs.push_back({e, Box{{0, 0}, {16, 1 << 18}}});
    }
  }
  CoopOptions o;
  o.min_read_bytes = 1 << 20;
  Planned floor = Plan(f, per_rank, o);
  ASSERT_GT(floor.plan.reads.size(), 0u);
  for (const CoopRead& cr : floor.plan.reads) {
    const format::ChunkRecord& c =
        f.manifest.entries[cr.read.entry].chunks[cr.read.chunk];
    if (cr.read.offset + cr.read.length < c.data_offset + c.stored_length) {
      EXPECT_GE(cr.read.length, 1u << 20) << "at " << cr.read.offset;
    }
  }
  EXPECT_EQ(floor.plan.stored_bytes, 32u << 20);
  Planned none = Plan(f, per_rank);  // the control: no floor
  EXPECT_LT(SmallestRead(none.plan), 1u << 20);
}

// Replicas on two nodes of 6 and 2 ranks: each node reads half of the
// bytes (a node's storage and network link are what a load is bound by),
// then its ranks share its half evenly. Without node names the node of 6
// ranks would read three quarters.
TEST(PlanCooperativeReadsTest, ReplicasSpreadTheReadsOverNodesThenRanks) {
  std::mt19937_64 rng(3);
  Fixture f(4, 64, 64, 1024, rng);
  const std::vector<std::vector<PlanRequest>> per_rank = FourEntryReplicas(8);
  const std::vector<std::string> nodes = {"a", "a", "a", "b",
                                          "a", "a", "b", "a"};
  Planned p = Plan(f, per_rank, {}, nodes);
  const uint64_t largest = LargestRead(p.plan);
  const std::vector<uint64_t> per_node = BytesReadPerNode(p.groups, p.plan);
  ASSERT_EQ(p.groups.nodes, 2u);
  ASSERT_EQ(per_node.size(), 2u);
  EXPECT_EQ(per_node[0] + per_node[1], p.plan.stored_bytes);
  EXPECT_LE(Spread(per_node), largest);
  EXPECT_LE(Spread(RanksOfNode(p, 0)), largest);
  EXPECT_LE(Spread(RanksOfNode(p, 1)), largest);
  EXPECT_GT(SmallestRead(p.plan), 0u);

  Planned unnamed = Plan(f, per_rank);  // control: ranks only
  uint64_t node_a = 0;
  for (uint32_t r = 0; r < 8; ++r) {
    if (nodes[r] == "a") node_a += unnamed.plan.bytes_read[r];
  }
  EXPECT_GT(node_a, p.plan.stored_bytes * 2 / 3);
}

// Tensor parallel 4 x data parallel 2, one replica per node: each read is
// needed by one rank of each node, yet within a node every rank reads its
// share (within one read), not only the ranks whose pieces are largest.
TEST(PlanCooperativeReadsTest, RanksOfANodeShareItsReadsEvenly) {
  std::mt19937_64 rng(6);
  Fixture f(6, 80, 64, 512, rng);  // pieces of 8, 16, 24, 32 rows
  std::vector<std::vector<PlanRequest>> per_rank(8);
  std::vector<std::string> nodes;
  for (uint64_t r = 0; r < 8; ++r) {
    const uint64_t tp = r % 4, rows = 8 + 8 * tp;  // uneven pieces
    const uint64_t first = tp == 0 ? 0 : 8 * tp + 4 * tp * (tp - 1);
    for (uint32_t e = 0; e < 6; ++e) {
      per_rank[r].push_back({e, Box{{first, 0}, {rows, 64}}});
    }
    nodes.push_back(r < 4 ? "a" : "b");
  }
  Planned p = Plan(f, per_rank, {}, nodes);
  const uint64_t largest = LargestRead(p.plan);
  EXPECT_LE(Spread(RanksOfNode(p, 0)), largest);
  EXPECT_LE(Spread(RanksOfNode(p, 1)), largest);
}

// The ranks of one node need everything, those of another nothing: the
// other node reads half for them.
TEST(PlanCooperativeReadsTest, NodesThatNeedNothingReadForTheOthers) {
  std::mt19937_64 rng(4);
  Fixture f(2, 64, 64, 1024, rng);
  std::vector<std::vector<PlanRequest>> per_rank(4);
  for (int r : {0, 1}) {
    for (uint32_t e = 0; e < 2; ++e) {
      per_rank[r].push_back({e, Box{{0, 0}, {64, 64}}});
    }
  }
  Planned p = Plan(f, per_rank, {}, {"a", "a", "b", "b"});
  const uint64_t largest = LargestRead(p.plan);
  const std::vector<uint64_t> per_node = BytesReadPerNode(p.groups, p.plan);
  EXPECT_LE(Spread(per_node), 2 * largest);
  EXPECT_LE(Spread(p.plan.bytes_read), 2 * largest);
  EXPECT_GT(per_node[1], 0u);
}

// One rank needs everything: the other ranks read for it.
TEST(PlanCooperativeReadsTest, RanksThatNeedNothingReadForTheOthers) {
  std::mt19937_64 rng(4);
  Fixture f(2, 64, 64, 1024, rng);
  std::vector<std::vector<PlanRequest>> per_rank(4);
  for (uint32_t e = 0; e < 2; ++e) {
    per_rank[0].push_back({e, Box{{0, 0}, {64, 64}}});
  }
  Planned p = Plan(f, per_rank);
  EXPECT_LE(Spread(p.plan.bytes_read), 2 * LargestRead(p.plan));
  EXPECT_GT(SmallestRead(p.plan), 0u);
}

// A rank that needs a block reads it when that keeps the balance: rows
// loaded by 4 ranks, each read goes to one of the ranks it feeds.
TEST(PlanCooperativeReadsTest, ReadsGoToARankThatNeedsThem) {
  std::mt19937_64 rng(5);
  Fixture f(1, 40, 16, 64, rng);
  std::vector<std::vector<PlanRequest>> per_rank(4);
  for (uint64_t r = 0; r < 4; ++r) {
    per_rank[r].push_back({0, Box{{r * 10, 0}, {10, 16}}});
  }
  Planned p = Plan(f, per_rank);
  for (const CoopRead& cr : p.plan.reads) {
    bool needs = false;
    ForEachDelivery(p.groups, cr.read, [&](const Holder& h, const Copy&) {
      needs = needs || h.rank == cr.reader;
    });
    EXPECT_TRUE(needs) << "read at offset " << cr.read.offset;
  }
}

// Issue 24: rows saved in chunks loaded as row bands by 3 ranks of one
// node: a read that one rank alone needs is that rank's (its bytes never
// go through the communicator), however the node's reads could be spread;
// only reads that several ranks need are placed for balance, and a read
// is cut where blocks of one rank meet blocks several ranks need. Each
// block is still read once.
TEST(PlanCooperativeReadsTest, AReadOneRankNeedsIsThatRanks) {
  std::mt19937_64 rng(7);
  Fixture f(4, 64, 64, 1024, rng);
  const uint64_t first[] = {0, 21, 42, 64};
  std::vector<std::vector<PlanRequest>> per_rank(3);
  for (uint32_t r = 0; r < 3; ++r) {
    for (uint32_t e = 0; e < 4; ++e) {
      per_rank[r].push_back(
          {e, Box{{first[r], 0}, {first[r + 1] - first[r], 64}}});
    }
  }
  Planned p = Plan(f, per_rank, {}, {"a", "a", "a"});
  EXPECT_EQ(p.plan.stored_bytes, 4u * 64 * 64 * 4);
  int sole = 0, shared = 0;
  for (const CoopRead& cr : p.plan.reads) {
    std::set<uint32_t> holders;
    ForEachDelivery(p.groups, cr.read, [&](const Holder& h, const Copy&) {
      holders.insert(h.rank);
    });
    if (holders.size() == 1) {
      ++sole;
      EXPECT_EQ(cr.reader, *holders.begin()) << "at " << cr.read.offset;
    } else {
      ++shared;
      // Reads are cut where one rank's blocks meet shared ones: every
      // block of a shared read feeds several ranks.
      const uint64_t bs = cr.read.indexed->block_size;
      for (uint64_t b = cr.read.b0; b < cr.read.b1; ++b) {
        std::set<uint32_t> of_block;
        ForEachDelivery(p.groups, cr.read, [&](const Holder& h, const Copy& c) {
          ForEachRunIn(
              c, b * bs, (b + 1) * bs,
              [&](uint64_t, uint64_t, uint64_t) { of_block.insert(h.rank); });
        });
        EXPECT_GE(of_block.size(), 2u)
            << "block " << b << " of the read at " << cr.read.offset;
      }
    }
  }
  EXPECT_GT(sole, 0);
  EXPECT_GT(shared, 0);
  EXPECT_LE(Spread(p.plan.bytes_read), 2 * LargestRead(p.plan));
}

// Rounds: no rank sends or receives more than the budget in one round,
// unless a single read alone exceeds it.
TEST(PlanCooperativeReadsTest, RoundsStayWithinTheBudget) {
  std::mt19937_64 rng(9);
  Fixture f(3, 32, 32, 256, rng);
  const int ranks = 5;
  std::vector<std::vector<PlanRequest>> per_rank(ranks);
  for (auto& reqs : per_rank) {
    for (uint32_t e = 0; e < 3; ++e) {
      reqs.push_back({e, Box{{0, 0}, {32, 32}}});
    }
  }
  CoopOptions o;
  o.max_read_bytes = 256;
  o.round_bytes = 2500;
  Planned p = Plan(f, per_rank, o);
  EXPECT_GT(p.plan.rounds, 1u);
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> sent, got;
  std::map<std::pair<uint32_t, uint32_t>, int> reads_in;
  for (const CoopRead& cr : p.plan.reads) {
    ForEachDelivery(p.groups, cr.read, [&](const Holder& h, const Copy& c) {
      if (h.rank == cr.reader) return;
      sent[{cr.round, cr.reader}] += c.bytes();
      got[{cr.round, h.rank}] += c.bytes();
    });
  }
  for (const auto& [key, n] : sent) EXPECT_LE(n, 2500u);
  for (const auto& [key, n] : got) EXPECT_LE(n, 2500u);
}

}  // namespace
}  // namespace ckpt::internal

#include "load/coop/coop_plan.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/status_macros.h"
#include "util/region_codec.h"

namespace ckpt::internal {
namespace {

absl::Status EntryNotInManifest(const format::Manifest& m, uint64_t entry,
                                uint32_t rank, uint64_t i) {
  return absl::InvalidArgumentError(
      absl::StrCat("rank ", rank, ": request ", i, ": entry ", entry,
                   " is not in the manifest (", m.entries.size(), " entries)"));
}

// Request `i` of rank `rank`: its entry, then its region (util/
// region_codec.h, as many dimensions as the entry has). InvalidArgument for
// an entry that is not in `m`.
absl::StatusOr<PlanRequest> ReadRequest(const format::Manifest& m,
                                        uint32_t rank, uint64_t i,
                                        format::ByteReader* r) {
  PlanRequest out;
  CKPT_ASSIGN_OR_RETURN(uint64_t entry,
                        r->ReadVarintAtMost("entry", UINT32_MAX));
  if (entry >= m.entries.size()) return EntryNotInManifest(m, entry, rank, i);
  out.entry = static_cast<uint32_t>(entry);
  CKPT_ASSIGN_OR_RETURN(out.region,
                        ReadRegion(r, m.entries[out.entry].shape.size()));
  return out;
}

absl::Status CheckRequest(const format::Manifest& m, const PlanRequest& p,
                          uint32_t rank, uint64_t i) {
  if (p.entry >= m.entries.size()) {
    return EntryNotInManifest(m, p.entry, rank, i);
  }
  absl::Status s = ValidateRegion(p.region, m.entries[p.entry].shape);
  if (s.ok()) return s;
  return absl::InvalidArgumentError(
      absl::StrCat("rank ", rank, ": request ", i, ": entry '",
                   m.entries[p.entry].name, "': ", s.message()));
}

// Bytes read per bin (a node or a rank) and the reads of each bin, the
// most recently given last.
struct Bins {
  std::vector<uint64_t> load;
  std::vector<std::vector<uint32_t>> reads;
};

// Moves reads out of the bins of `members` that read more than `limit`
// bytes (the last of theirs first) to the least loaded bin of `members`
// while that lowers the giver's load; moved(read, to) is told each move.
template <typename Moved>
void Rebalance(uint64_t limit, const std::vector<uint32_t>& members,
               const std::vector<CoopRead>& reads, Bins* bins, Moved&& moved) {
  std::set<std::pair<uint64_t, uint32_t>> by_load;
  for (uint32_t b : members) by_load.insert({bins->load[b], b});
  for (uint32_t b : members) {
    std::vector<uint32_t>& mine = bins->reads[b];
    while (bins->load[b] > limit && !mine.empty()) {
      const uint32_t i = mine.back();
      const uint64_t n = reads[i].read.length;
      const auto [least, to] = *by_load.begin();
      if (least + n >= bins->load[b]) break;
      by_load.erase({bins->load[b], b});
      by_load.erase({least, to});
      bins->load[b] -= n;
      bins->load[to] += n;
      by_load.insert({bins->load[b], b});
      by_load.insert({bins->load[to], to});
      mine.pop_back();
      bins->reads[to].push_back(i);
      moved(i, to);
    }
  }
}

// The rank of `members` that reads the fewest bytes (the lowest on ties).
uint32_t LeastLoaded(const std::vector<uint32_t>& members,
                     const std::vector<uint64_t>& load) {
  return *std::min_element(
      members.begin(), members.end(), [&](uint32_t a, uint32_t b) {
        return std::make_pair(load[a], a) < std::make_pair(load[b], b);
      });
}

// Indexes of `reads`, the largest read first (stable).
std::vector<uint32_t> LargestFirst(const std::vector<CoopRead>& reads) {
  std::vector<uint32_t> order(reads.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return reads[a].read.length > reads[b].read.length;
  });
  return order;
}

// The rank that alone needs `read` (every delivery is to it), or nullopt
// when several ranks need it.
std::optional<uint32_t> SoleHolder(const RequestGroups& g,
                                   const BlockRead& read) {
  std::optional<uint32_t> only;
  bool several = false;
  ForEachDelivery(g, read, [&](const Holder& h, const Copy&) {
    if (!only.has_value()) only = h.rank;
    several = several || h.rank != *only;
  });
  if (several) return std::nullopt;
  return only;
}

// Step 1 of PlanCooperativeReads' contract: each read that one rank alone
// needs to that rank; then each other read, largest first, to a holder on
// the least loaded node, the least loaded rank there. Fills the nodes' and
// the ranks' loads, and the nodes' bins with the shared reads alone (the
// reads that later steps move first); returns the largest read.
uint64_t AssignToHolders(const RequestGroups& g, std::vector<CoopRead>* reads,
                         const std::vector<bool>& sole, Bins* nodes,
                         Bins* ranks) {
  uint64_t largest = 0;
  auto take = [&](uint32_t i, uint32_t reader) {
    CoopRead& cr = (*reads)[i];
    cr.reader = reader;
    const uint32_t node = g.node[reader];
    nodes->load[node] += cr.read.length;
    if (!sole[i]) nodes->reads[node].push_back(i);
    ranks->load[reader] += cr.read.length;
    largest = std::max(largest, cr.read.length);
  };
  const std::vector<uint32_t> order = LargestFirst(*reads);
  for (uint32_t i : order) {
    if (sole[i]) take(i, *SoleHolder(g, (*reads)[i].read));
  }
  for (uint32_t i : order) {
    if (sole[i]) continue;
    std::tuple<uint64_t, uint64_t, uint32_t> best{UINT64_MAX, UINT64_MAX, 0};
    ForEachDelivery(g, (*reads)[i].read, [&](const Holder& h, const Copy&) {
      best = std::min(best, std::make_tuple(nodes->load[g.node[h.rank]],
                                            ranks->load[h.rank], h.rank));
    });
    take(i, std::get<2>(best));
  }
  return largest;
}

// Assigns each read to a rank (CoopRead::reader) as the contract of
// PlanCooperativeReads says; returns the bytes per rank.
std::vector<uint64_t> AssignReaders(const RequestGroups& g,
                                    std::vector<CoopRead>* reads) {
  Bins nodes{std::vector<uint64_t>(g.nodes, 0),
             std::vector<std::vector<uint32_t>>(g.nodes)};
  Bins ranks{std::vector<uint64_t>(g.ranks, 0),
             std::vector<std::vector<uint32_t>>(g.ranks)};
  std::vector<std::vector<uint32_t>> ranks_of(g.nodes);
  for (uint32_t r = 0; r < g.ranks; ++r) ranks_of[g.node[r]].push_back(r);
  std::vector<uint32_t> all_nodes(g.nodes);
  std::iota(all_nodes.begin(), all_nodes.end(), 0);
  std::vector<bool> sole(reads->size());
  for (size_t i = 0; i < reads->size(); ++i) {
    sole[i] = SoleHolder(g, (*reads)[i].read).has_value();
  }
  const uint64_t largest = AssignToHolders(g, reads, sole, &nodes, &ranks);
  uint64_t total = 0;
  for (uint64_t n : nodes.load) total += n;
  const uint64_t node_limit = total / std::max<uint32_t>(1, g.nodes) + largest;
  auto to_node = [&](uint32_t i, uint32_t to) {
    CoopRead& cr = (*reads)[i];
    const uint32_t r = LeastLoaded(ranks_of[to], ranks.load);
    ranks.load[cr.reader] -= cr.read.length;
    ranks.load[r] += cr.read.length;
    cr.reader = r;
  };
  // Shared reads first; then, only where a node still reads more than the
  // limit, reads that one rank alone needs (which then cost an exchange).
  Rebalance(node_limit, all_nodes, *reads, &nodes, to_node);
  for (auto& mine : nodes.reads) mine.clear();
  for (uint32_t i : LargestFirst(*reads)) {  // smallest last
    if (sole[i]) nodes.reads[g.node[(*reads)[i].reader]].push_back(i);
  }
  Rebalance(node_limit, all_nodes, *reads, &nodes, to_node);
  if (g.nodes == g.ranks) return ranks.load;  // one rank each
  auto within = [&](uint32_t i, uint32_t to) { (*reads)[i].reader = to; };
  for (int pass = 0; pass < 2; ++pass) {
    for (auto& mine : ranks.reads) mine.clear();
    for (uint32_t i : LargestFirst(*reads)) {  // smallest last
      if (sole[i] == (pass == 1)) ranks.reads[(*reads)[i].reader].push_back(i);
    }
    for (uint32_t n = 0; n < g.nodes; ++n) {
      const uint64_t mean = nodes.load[n] / ranks_of[n].size();
      Rebalance(pass == 0 ? mean : mean + largest, ranks_of[n], *reads, &ranks,
                within);
    }
  }
  return ranks.load;
}

// Puts each read of rank s, in plan order, into the first round that is
// no earlier than s's previous send nor than any of its receivers' previous
// receipt, and in which the bytes s sends and each receiver gets stay
// within `budget` (a read that exceeds it alone opens a round). Rounds only
// grow per rank, on both sides, so that each read costs O(its holders).
// Returns the number of rounds.
uint32_t AssignRounds(const RequestGroups& g, uint64_t budget,
                      std::vector<CoopRead>* reads) {
  std::vector<uint32_t> cur(g.ranks, 0), last(g.ranks, 0);
  std::vector<uint64_t> sent(g.ranks, 0), got(g.ranks, 0), amount(g.ranks, 0);
  std::vector<uint32_t> to;  // receivers of the current read
  uint32_t rounds = 0;
  for (CoopRead& cr : *reads) {
    const uint32_t s = cr.reader;
    uint64_t total = 0;
    to.clear();
    ForEachDelivery(g, cr.read, [&](const Holder& h, const Copy& c) {
      if (h.rank == s) return;
      if (amount[h.rank] == 0) to.push_back(h.rank);
      amount[h.rank] += c.bytes();
      total += c.bytes();
    });
    uint32_t k = cur[s];
    if (sent[s] > 0 && sent[s] + total > budget) k = cur[s] + 1;
    for (uint32_t d : to) {
      const bool full = got[d] > 0 && got[d] + amount[d] > budget;
      k = std::max(k, last[d] + (full ? 1 : 0));
    }
    if (k != cur[s]) sent[s] = 0;
    cur[s] = k;
    sent[s] += total;
    for (uint32_t d : to) {
      if (k != last[d]) got[d] = 0;
      last[d] = k;
      got[d] += amount[d];
      amount[d] = 0;
    }
    cr.round = k;
    rounds = std::max(rounds, k + 1);
  }
  return rounds;
}

std::vector<CoopRead> Flatten(ReadPlan plan) {
  std::vector<CoopRead> out;
  for (ShardReads& sr : plan.shards) {
    for (BlockRead& r : sr.reads) {
      CoopRead cr;
      cr.shard = sr.shard;
      cr.read = std::move(r);
      out.push_back(std::move(cr));
    }
  }
  return out;
}

constexpr int64_t kNoHolder = -1, kSeveralHolders = -2;

// Per block of read `r` (of n blocks): the rank that alone needs it, or
// kSeveralHolders (kNoHolder: none needs it).
void ClassifyBlocks(const RequestGroups& g, const BlockRead& r, uint64_t n,
                    std::vector<int64_t>* cls) {
  const uint64_t bs = r.indexed->block_size;
  cls->assign(n, kNoHolder);
  for (const Copy& c : r.copies) {
    ForEachBlockSpan(c, bs, [&](uint64_t first, uint64_t end) {
      for (uint64_t h = g.first[c.request]; h < g.first[c.request + 1]; ++h) {
        const int64_t rank = g.holders[h].rank;
        for (uint64_t b = first - r.b0; b < end - r.b0; ++b) {
          if ((*cls)[b] == kNoHolder) {
            (*cls)[b] = rank;
          } else if ((*cls)[b] != rank) {
            (*cls)[b] = kSeveralHolders;
          }
        }
      }
    });
  }
}

// Blocks [begin, b) of `cr`'s read (of n blocks) as a read of their own,
// at stored offset `offset`, with the copies that fall in them.
CoopRead PartOf(const CoopRead& cr, uint64_t begin, uint64_t b, uint64_t n,
                uint64_t offset) {
  const BlockRead& r = cr.read;
  const uint64_t bs = r.indexed->block_size;
  CoopRead piece;
  piece.shard = cr.shard;
  BlockRead& p = piece.read;
  p.entry = r.entry;
  p.chunk = r.chunk;
  p.indexed = r.indexed;
  p.b0 = r.b0 + begin;
  p.b1 = r.b0 + b;
  p.offset = offset;
  for (uint64_t k = p.b0; k < p.b1; ++k) {
    p.length += r.indexed->blocks[k].stored_size;
  }
  p.raw_begin = p.b0 * bs;
  p.raw_end = b == n ? r.raw_end : p.b1 * bs;
  for (const Copy& c : r.copies) {
    ClipCopy(c, p.raw_begin, p.raw_end,
             [&](const Copy& part) { p.copies.push_back(part); });
  }
  return piece;
}

// `reads` with each read cut where the ranks that need its blocks change
// between one rank alone and several (or another rank alone): a read of
// blocks that one rank needs next to blocks of a boundary that several
// share becomes two, so that the first is that rank's own (AssignReaders)
// and only the boundary's blocks are exchanged. Whole blocks, in order;
// copies cut at the new raw bounds.
std::vector<CoopRead> SplitByHolders(const RequestGroups& g,
                                     std::vector<CoopRead> reads) {
  std::vector<CoopRead> out;
  out.reserve(reads.size());
  std::vector<int64_t> cls;  // per block of a read (ClassifyBlocks)
  for (CoopRead& cr : reads) {
    const uint64_t n = cr.read.b1 - cr.read.b0;
    if (n > 1) ClassifyBlocks(g, cr.read, n, &cls);
    // One class for the whole read (every block of a resharded TP layout
    // is shared, every one of a same-layout load has one rank): as it is.
    if (n <= 1 || std::all_of(cls.begin(), cls.end(),
                              [&](int64_t k) { return k == cls[0]; })) {
      out.push_back(std::move(cr));
      continue;
    }
    uint64_t begin = 0;
    uint64_t offset = cr.read.offset;
    for (uint64_t b = 1; b <= n; ++b) {
      if (b < n && cls[b] == cls[begin]) continue;
      out.push_back(PartOf(cr, begin, b, n, offset));
      offset += out.back().read.length;
      begin = b;
    }
  }
  return out;
}

// The node of a rank that sent `name`: a new one for "" or a new name.
uint32_t NodeId(absl::string_view name,
                absl::flat_hash_map<absl::string_view, uint32_t>* ids,
                uint32_t* nodes) {
  if (!name.empty()) {
    auto [it, fresh] = ids->emplace(name, *nodes);
    if (!fresh) return it->second;
  }
  return (*nodes)++;
}

// Decodes one rank's requests (the rest of `bytes`, which `r` reads):
// appends the unique id of each to `uid` and each request not seen before
// (`ids`: its encoding -> unique id) to g->unique. Returns the count;
// InvalidArgument for a request that does not fit `manifest`, DataLoss for
// bytes that do not decode.
absl::StatusOr<uint32_t> DecodeRequests(
    const format::Manifest& manifest, uint32_t rank, absl::string_view bytes,
    format::ByteReader* r,
    absl::flat_hash_map<absl::string_view, uint32_t>* ids, RequestGroups* g,
    std::vector<uint32_t>* uid) {
  CKPT_ASSIGN_OR_RETURN(uint64_t n, r->ReadVarintAtMost("count", bytes.size()));
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t begin = r->offset();
    CKPT_ASSIGN_OR_RETURN(PlanRequest p, ReadRequest(manifest, rank, i, r));
    const absl::string_view key(bytes.data() + begin, r->offset() - begin);
    auto [it, inserted] =
        ids->emplace(key, static_cast<uint32_t>(g->unique.size()));
    if (inserted) {
      CKPT_RETURN_IF_ERROR(CheckRequest(manifest, p, rank, i));
      g->unique.push_back(std::move(p));
    }
    uid->push_back(it->second);
  }
  if (!r->empty()) return absl::DataLossError("trailing bytes");
  return static_cast<uint32_t>(n);
}

}  // namespace

std::string EncodeRankRequests(absl::string_view node_name,
                               const std::vector<PlanRequest>& requests) {
  std::string out;
  format::PutString(&out, node_name);
  format::PutVarint(&out, requests.size());
  for (const PlanRequest& p : requests) {
    format::PutVarint(&out, p.entry);
    PutRegion(&out, p.region);
  }
  return out;
}

absl::StatusOr<RequestGroups> GroupRequests(
    const format::Manifest& manifest, const std::vector<std::string>& encoded) {
  RequestGroups g;
  g.ranks = static_cast<uint32_t>(encoded.size());
  absl::flat_hash_map<absl::string_view, uint32_t> ids;
  std::vector<uint32_t> uid;  // unique id of every request, rank by rank
  std::vector<uint32_t> count_of_rank(encoded.size());
  // Data-parallel replicas send identical requests: decode each distinct
  // list once.
  absl::flat_hash_map<absl::string_view, uint32_t> same;  // bytes -> rank
  absl::flat_hash_map<absl::string_view, uint32_t> node_ids;
  std::vector<uint64_t> begin_of_rank(encoded.size());
  for (uint32_t rank = 0; rank < encoded.size(); ++rank) {
    auto undecodable = [&](const absl::Status& s) {
      return absl::InternalError(absl::StrCat("the requests of rank ", rank,
                                              " do not decode: ", s.message()));
    };
    format::ByteReader r(encoded[rank]);
    auto node = r.ReadString("node name", encoded[rank].size());
    if (!node.ok()) return undecodable(node.status());
    g.node.push_back(NodeId(*node, &node_ids, &g.nodes));
    const absl::string_view bytes =
        absl::string_view(encoded[rank]).substr(r.offset());
    begin_of_rank[rank] = uid.size();
    auto [it, fresh] = same.emplace(bytes, rank);
    if (!fresh) {
      const uint32_t twin = it->second;
      count_of_rank[rank] = count_of_rank[twin];
      const uint64_t b = begin_of_rank[twin];
      for (uint64_t k = 0; k < count_of_rank[twin]; ++k) {
        uid.push_back(uid[b + k]);
      }
      continue;
    }
    absl::StatusOr<uint32_t> n =
        DecodeRequests(manifest, rank, encoded[rank], &r, &ids, &g, &uid);
    if (!n.ok()) {
      return absl::IsInvalidArgument(n.status()) ? n.status()
                                                 : undecodable(n.status());
    }
    count_of_rank[rank] = *n;
  }
  g.named_nodes = static_cast<uint32_t>(node_ids.size());
  g.first.assign(g.unique.size() + 1, 0);
  for (uint32_t u : uid) ++g.first[u + 1];
  for (size_t u = 0; u < g.unique.size(); ++u) g.first[u + 1] += g.first[u];
  std::vector<uint64_t> next(g.first.begin(), g.first.end() - 1);
  g.holders.resize(uid.size());
  size_t k = 0;
  for (uint32_t rank = 0; rank < encoded.size(); ++rank) {
    for (uint32_t i = 0; i < count_of_rank[rank]; ++i) {
      g.holders[next[uid[k++]]++] = Holder{rank, i};
    }
  }
  return g;
}

CoopPlan PlanCooperativeReads(const format::Manifest& manifest,
                              const RequestGroups& groups,
                              const std::vector<ChunkPiece>& pieces,
                              const BlockTableLookup& lookup,
                              const CoopOptions& options) {
  CoopPlan plan;
  ReadPlan reads =
      PlanBlockReads(manifest, pieces, lookup, options.max_read_bytes);
  // Enough reads to spread: about four per rank, if blocks allow.
  const uint64_t spread = std::max<uint64_t>(
      reads.stored_bytes / (4 * std::max<uint64_t>(1, groups.ranks)),
      options.min_read_bytes);
  if (spread < options.max_read_bytes) {
    reads =
        PlanBlockReads(manifest, pieces, lookup, std::max<uint64_t>(1, spread));
  }
  plan.stored_bytes = reads.stored_bytes;
  plan.reads = SplitByHolders(groups, Flatten(std::move(reads)));
  plan.bytes_read = AssignReaders(groups, &plan.reads);
  plan.rounds = AssignRounds(groups, options.round_bytes, &plan.reads);
  return plan;
}

std::vector<uint64_t> BytesReadPerNode(const RequestGroups& groups,
                                       const CoopPlan& plan) {
  std::vector<uint64_t> out(groups.nodes, 0);
  for (uint32_t r = 0; r < plan.bytes_read.size(); ++r) {
    out[groups.node[r]] += plan.bytes_read[r];
  }
  return out;
}

}  // namespace ckpt::internal

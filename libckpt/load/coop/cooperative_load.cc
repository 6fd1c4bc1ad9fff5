// The ranks exchange their requests, share the shard indexes, compute the
// same plan (coop_plan.h) and read every needed block once between them,
// exchanging the bytes with AllToAll (or, for ranks of one address space
// loading into host memory, writing them straight into each other's
// destinations: direct_delivery.cc).
#include "load/coop/cooperative_load.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/status_macros.h"
#include "load/coop/device_exchange.h"
#include "load/coop/shared_arena.h"
#include "util/parallel_for.h"
#include "util/rank_status.h"

namespace ckpt::internal {

namespace {

// `s`, the status of rank `root` of `n` (-1: of the collective itself),
// prefixed "rank R of N: ".
absl::Status OfRank(const absl::Status& s, int root, size_t n) {
  if (root < 0) return s;
  return absl::Status(
      s.code(), absl::StrCat("rank ", root, " of ", n, ": ", s.message()));
}

}  // namespace

absl::Status CooperativeLoad::Agree(const absl::Status& local) {
  int root = -1;
  absl::Status s = AgreeOnFirstError(*src_.comm, local, nullptr, &root);
  return OfRank(s, root, src_.comm->size());
}

absl::StatusOr<std::vector<std::string>> CooperativeLoad::GatherOrAgree(
    const absl::StatusOr<std::string>& mine) {
  int root = -1;
  absl::StatusOr<std::vector<std::string>> all =
      AllGatherOrFirstError(*src_.comm, mine, &root);
  if (all.ok()) return all;
  return OfRank(all.status(), root, src_.comm->size());
}

void CooperativeLoad::FinishReport(const Prepared& p, const ReadExecutor& run,
                                   LoadReport* report) {
  for (const LoadRequest& r : p.reqs) {
    report->bytes_loaded += RegionElements(r.region) * DTypeSize(r.dtype);
  }
  report->bytes_read = run.bytes_read();
  report->blocks_verified = run.blocks_verified();
  std::sort(report->loaded.begin(), report->loaded.end());
}

namespace {

// Whether every rank may read what it needs alone: when the stored chunks
// that two or more ranks need (a request several ranks hold, a chunk the
// new layout cuts) hold at most 1/kAloneSlack of the stored bytes the job
// reads, counting each extra rank, e.g. a load in the layout of the save
// whose only shared chunks are replicated scalars (an optimizer's step).
constexpr uint64_t kAloneSlack = 100;

bool RanksMayReadAlone(const format::Manifest& manifest, const RequestGroups& g,
                       const std::vector<ChunkPiece>& pieces) {
  // (entry, chunk) -> the ranks that need it, as a small sorted list.
  absl::flat_hash_map<std::pair<uint32_t, uint32_t>, std::vector<uint32_t>>
      ranks;
  for (const ChunkPiece& piece : pieces) {
    std::vector<uint32_t>& r = ranks[{piece.entry, piece.chunk}];
    for (uint64_t h = g.first[piece.request]; h < g.first[piece.request + 1];
         ++h) {
      auto at = std::lower_bound(r.begin(), r.end(), g.holders[h].rank);
      if (at == r.end() || *at != g.holders[h].rank) {
        r.insert(at, g.holders[h].rank);
      }
    }
  }
  uint64_t total = 0, extra = 0;
  for (const auto& [key, r] : ranks) {
    const uint64_t bytes =
        manifest.entries[key.first].chunks[key.second].stored_length;
    total += bytes;
    extra += bytes * (r.size() - 1);
  }
  return extra * kAloneSlack <= total;
}

// [u32 shard][u64 file size][string head][string tail][string index]...
void PutShardMeta(std::string* out, uint32_t id, const ShardMetaBytes& m) {
  format::PutFixed32(out, id);
  format::PutFixed64(out, m.file_size);
  format::PutString(out, m.head);
  format::PutString(out, m.tail);
  format::PutString(out, m.index);
}

absl::StatusOr<std::vector<std::pair<uint32_t, ShardMetaBytes>>>
DecodeShardMetas(absl::string_view bytes) {
  std::vector<std::pair<uint32_t, ShardMetaBytes>> out;
  format::ByteReader r(bytes);
  while (!r.empty()) {
    ShardMetaBytes m;
    CKPT_ASSIGN_OR_RETURN(uint32_t id, r.Read32("shard"));
    CKPT_ASSIGN_OR_RETURN(m.file_size, r.Read64("file size"));
    for (std::string* s : {&m.head, &m.tail, &m.index}) {
      CKPT_ASSIGN_OR_RETURN(absl::string_view v,
                            r.ReadString("bytes", bytes.size()));
      s->assign(v.data(), v.size());
    }
    out.emplace_back(id, std::move(m));
  }
  return out;
}

// The shards whose indexes the plan needs: those of the pieces, and all
// when a requested entry has no chunk (CheckChunkless reads them all).
std::vector<uint32_t> NeededShards(const format::Manifest& m,
                                   const RequestGroups& g,
                                   const std::vector<ChunkPiece>& pieces) {
  for (const PlanRequest& p : g.unique) {
    if (!m.entries[p.entry].chunks.empty()) continue;
    std::vector<uint32_t> all;
    for (const format::ShardInfo& s : m.shards) all.push_back(s.shard_id);
    return all;
  }
  return ShardsOf(m, pieces);
}

// This rank's part of one exchange round: its reads, and the reads of
// other ranks that send it bytes, by sending rank; plan indexes in plan
// order (the order in which the sender lays out the bytes).
struct Round {
  std::vector<uint32_t> reads;
  std::vector<std::vector<uint32_t>> incoming;  // [sender]
};

std::vector<Round> RoundsOf(const RequestGroups& g, const CoopPlan& plan,
                            uint32_t me) {
  std::vector<Round> rounds(plan.rounds);
  for (Round& r : rounds) r.incoming.resize(g.ranks);
  for (uint32_t i = 0; i < plan.reads.size(); ++i) {
    const CoopRead& cr = plan.reads[i];
    if (cr.reader == me) {
      rounds[cr.round].reads.push_back(i);
      continue;
    }
    bool for_me = false;
    ForEachDelivery(g, cr.read, [&](const Holder& h, const Copy&) {
      for_me = for_me || h.rank == me;
    });
    if (for_me) rounds[cr.round].incoming[cr.reader].push_back(i);
  }
  return rounds;
}

// Whether some rank sends bytes to another in each round of `plan` (the
// same on every rank): a round in which none does needs no exchange, and
// every rank skips its agreement and AllToAll alike.
std::vector<bool> RoundsThatExchange(const RequestGroups& g,
                                     const CoopPlan& plan) {
  std::vector<bool> out(plan.rounds, false);
  for (const CoopRead& cr : plan.reads) {
    if (out[cr.round]) continue;
    ForEachDelivery(g, cr.read, [&](const Holder& h, const Copy&) {
      if (h.rank != cr.reader) out[cr.round] = true;
    });
  }
  return out;
}

// Device data plane (device_exchange.h): the bytes for holder `h` travel in
// device memory. Exchanged bytes are counted by "lane": lane d for rank
// d's bytes through host memory, lane ranks + d for those through device
// memory (none without `dx`).
bool ViaDevice(const DeviceExchange* dx, const Holder& h) {
  return dx != nullptr && dx->OnDevice(h);
}
uint32_t Lane(const RequestGroups& g, const DeviceExchange* dx, uint32_t rank,
              const Holder& h) {
  return (ViaDevice(dx, h) ? g.ranks : 0) + rank;
}

// Bytes this rank sends to each rank over the whole load, by lane.
std::vector<uint64_t> TotalSends(const RequestGroups& g, const CoopPlan& plan,
                                 uint32_t me, const DeviceExchange* dx) {
  std::vector<uint64_t> to(2 * g.ranks, 0);
  for (const CoopRead& cr : plan.reads) {
    if (cr.reader != me) continue;
    ForEachDelivery(g, cr.read, [&](const Holder& h, const Copy& c) {
      if (h.rank != me) to[Lane(g, dx, h.rank, h)] += c.bytes();
    });
  }
  return to;
}

// The reads of one round as ReadExecutor executes them: copies to this rank's
// own requests keep their destination (Holder::index); copies for rank d
// go to request `slots + lane`, the send buffer of that lane, at
// consecutive offsets. Returns the reads and the bytes for each lane.
std::pair<std::vector<BlockRead>, std::vector<uint64_t>> RoundReads(
    const RequestGroups& g, const CoopPlan& plan, const Round& round,
    uint32_t me, uint32_t slots, const DeviceExchange* dx) {
  std::vector<BlockRead> reads;
  std::vector<uint64_t> off(2 * g.ranks, 0);
  for (uint32_t i : round.reads) {
    const BlockRead& src = plan.reads[i].read;
    BlockRead r = src;
    r.copies.clear();
    ForEachDelivery(g, src, [&](const Holder& h, const Copy& c) {
      Copy& out = r.copies.emplace_back(c);
      if (h.rank == me) {
        out.request = h.index;
      } else {  // the runs packed one after another in the lane's buffer
        const uint32_t lane = Lane(g, dx, h.rank, h);
        out.request = slots + lane;
        out.dst = off[lane];
        out.dst_pitch = c.rows > 1 ? c.run : 0;
        off[lane] += c.bytes();
      }
    });
    reads.push_back(std::move(r));
  }
  return {std::move(reads), std::move(off)};
}

// A read of another rank with bytes for this rank: where they are in the
// bytes received from its reader.
struct Incoming {
  uint32_t sender = 0;
  uint32_t read = 0;    // plan index
  uint64_t offset = 0;  // in what `sender` sends this rank
};

// The reads of `round` that send this rank bytes, and (in `sizes`) how
// many bytes each rank sends it, by lane (offsets: in host memory).
std::vector<Incoming> IncomingOf(const RequestGroups& g, const CoopPlan& plan,
                                 const Round& round, uint32_t me,
                                 const DeviceExchange* dx,
                                 std::vector<uint64_t>* sizes) {
  std::vector<Incoming> out;
  sizes->assign(2 * g.ranks, 0);
  for (uint32_t s = 0; s < g.ranks; ++s) {
    for (uint32_t i : round.incoming[s]) {
      out.push_back(Incoming{s, i, (*sizes)[s]});
      ForEachDelivery(g, plan.reads[i].read,
                      [&](const Holder& h, const Copy& c) {
                        if (h.rank == me)
                          (*sizes)[Lane(g, dx, s, h)] += c.bytes();
                      });
    }
  }
  return out;
}

// Writes the bytes of one incoming read (at `bytes`, in the order its
// reader laid them out) to this rank's destinations; those that travel in
// device memory are DeviceExchange::Deliver's.
absl::Status Unpack(const RequestGroups& g, const BlockRead& read, uint32_t me,
                    const char* bytes, ReadExecutor* run,
                    const DeviceExchange* dx) {
  absl::Status st;
  ReadExecutor::Tally written(run);
  ForEachDelivery(g, read, [&](const Holder& h, const Copy& c) {
    if (h.rank != me || ViaDevice(dx, h) || !st.ok()) return;
    ForEachRunIn(c, 0, UINT64_MAX, [&](uint64_t, uint64_t dst, uint64_t n) {
      if (st.ok()) st = run->Deliver(h.index, dst, bytes, n, &written);
      bytes += n;  // the runs come packed, in order
    });
  });
  return st;
}

// A buffer reused from round to round, grown when a round needs more.
class Arena {
 public:
  char* Get(uint64_t n) {
    if (n > size_) {
      data_.reset(new char[n]);
      size_ = n;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<char[]> data_;
  uint64_t size_ = 0;
};

uint64_t Sum(const std::vector<uint64_t>& v, size_t begin, size_t end) {
  return std::accumulate(v.begin() + begin, v.begin() + end, uint64_t{0});
}

// The device lanes (n .. 2n) of per-lane byte counts.
std::vector<uint64_t> DeviceLanes(const std::vector<uint64_t>& lanes,
                                  uint32_t n) {
  return std::vector<uint64_t>(lanes.begin() + n, lanes.end());
}

// `p`'s requests, then one flat uint8 "request" per lane (of `lanes`, n
// ranks): the bytes this rank sends rank d over the whole load (total[d]),
// which each round points at its send buffer (lanes n.. : staged for the
// device send buffer).
Prepared WithSendSlots(const Prepared& p, const std::vector<uint64_t>& total,
                       uint32_t lanes, uint32_t n) {
  Prepared ext = p;
  for (uint32_t d = 0; d < lanes; ++d) {
    LoadRequest slot;
    slot.name = absl::StrCat(
        d < n ? "(bytes for rank " : "(device bytes for rank ", d % n, ")");
    slot.dtype = DType::kUInt8;
    slot.region = FlatRange{0, total[d]};
    ext.reqs.push_back(std::move(slot));
  }
  return ext;
}

// One round on this rank: its reads as ReadExecutor runs them (RoundReads) and
// their shards, the bytes it sends and receives by lane, where the bytes
// of each incoming read are, and the AllToAll buffers.
struct RoundIo {
  std::vector<BlockRead> reads;
  std::vector<uint32_t> shards;        // [read]
  std::vector<uint64_t> sends, sizes;  // [lane]
  std::vector<Incoming> incoming;
  std::vector<SendBuffer> send;
  std::vector<RecvBuffer> recv;
  std::vector<const char*> from;  // [sender]: where its bytes for me are
};

// `round` on this rank, its buffers not yet placed (PlaceInArenas,
// PlaceShared).
RoundIo RoundIoOf(const RequestGroups& g, const CoopPlan& plan,
                  const Round& round, uint32_t me, uint32_t slots,
                  const DeviceExchange* dx) {
  RoundIo io;
  std::tie(io.reads, io.sends) = RoundReads(g, plan, round, me, slots, dx);
  for (uint32_t i : round.reads) io.shards.push_back(plan.reads[i].shard);
  io.incoming = IncomingOf(g, plan, round, me, dx, &io.sizes);
  return io;
}

// Points the host send slots of `ext` and io->send at `send_base`, each
// lane's bytes after those of the lanes below it (the layout PeerOffsets
// assumes).
void PlaceSends(char* send_base, uint32_t n, uint32_t slots, RoundIo* io,
                Prepared* ext) {
  for (uint32_t d = 0; d < n; ++d) {
    ext->reqs[slots + d].data = send_base;
    io->send.push_back(SendBuffer{send_base, io->sends[d]});
    send_base += io->sends[d];
  }
}

// The AllToAll exchange: sends in `out`, receives in `in`.
void PlaceInArenas(uint32_t n, uint32_t slots, Arena* out, Arena* in,
                   RoundIo* io, Prepared* ext) {
  PlaceSends(out->Get(Sum(io->sends, 0, n)), n, slots, io, ext);
  char* recv_base = in->Get(Sum(io->sizes, 0, n));
  for (uint32_t d = 0; d < n; ++d) {
    io->from.push_back(recv_base);
    io->recv.push_back(RecvBuffer{recv_base, io->sizes[d]});
    recv_base += io->sizes[d];
  }
}

// The shared-memory exchange: sends in this rank's half `half` of
// `shared`, and the bytes of each sender s read where they lie in its
// half, at offset[s].
void PlaceShared(const SharedArenas& shared, uint32_t half,
                 const std::vector<uint64_t>& offset, uint32_t n,
                 uint32_t slots, RoundIo* io, Prepared* ext) {
  PlaceSends(shared.Mine(half), n, slots, io, ext);
  for (uint32_t s = 0; s < n; ++s) {
    io->from.push_back(shared.Of(s, half) + offset[s]);
  }
}

// The most this rank sends other ranks in one round of `plan` (host
// memory; the shared-memory exchange has no device lanes).
uint64_t MaxRoundSend(const RequestGroups& g, const CoopPlan& plan,
                      uint32_t me) {
  std::vector<uint64_t> sends(plan.rounds, 0);
  for (const CoopRead& cr : plan.reads) {
    if (cr.reader != me) continue;
    ForEachDelivery(g, cr.read, [&](const Holder& h, const Copy& c) {
      if (h.rank != me) sends[cr.round] += c.bytes();
    });
  }
  return sends.empty() ? 0 : *std::max_element(sends.begin(), sends.end());
}

// [round][sender]: where the bytes for this rank start in what the sender
// sends in that round (after its bytes for lower ranks: PlaceSends).
std::vector<std::vector<uint64_t>> PeerOffsets(const RequestGroups& g,
                                               const CoopPlan& plan,
                                               uint32_t me) {
  std::vector<std::vector<uint64_t>> out(plan.rounds,
                                         std::vector<uint64_t>(g.ranks, 0));
  for (const CoopRead& cr : plan.reads) {
    ForEachDelivery(g, cr.read, [&](const Holder& h, const Copy& c) {
      if (h.rank != cr.reader && h.rank < me) {
        out[cr.round][cr.reader] += c.bytes();
      }
    });
  }
  return out;
}

// The shared arenas of a load whose ranks exchange bytes in host memory
// between processes, or null: the exchange then goes through AllToAll.
// Collective when some round exchanges and the ranks name at most one
// node (every rank knows both from the plan: ranks that name two machines
// cannot share memory, and none creates a segment); `wanted` is
// LoadOptions::shared_memory_exchange, and a load with device lanes (`dx`)
// offers none.
absl::StatusOr<std::unique_ptr<SharedArenas>> MaybeSharedArenas(
    Communicator* comm, const RequestGroups& g, const CoopPlan& plan,
    const std::vector<bool>& exchanges, const DeviceExchange* dx, bool wanted) {
  if (g.named_nodes > 1 ||
      std::find(exchanges.begin(), exchanges.end(), true) == exchanges.end()) {
    return nullptr;
  }
  return SharedArenas::Create(comm, MaxRoundSend(g, plan, comm->rank()),
                              wanted && dx == nullptr);
}

// How a round's host bytes travel: through AllToAll between this rank's
// send and receive arenas, or through the shared arenas (each receiver
// reading the senders' halves at PeerOffsets).
class HostExchange {
 public:
  // Collective as MaybeSharedArenas.
  static absl::StatusOr<HostExchange> Create(Communicator* comm,
                                             const RequestGroups& g,
                                             const CoopPlan& plan,
                                             const std::vector<bool>& exchanges,
                                             const DeviceExchange* dx,
                                             bool wanted) {
    HostExchange x;
    CKPT_ASSIGN_OR_RETURN(
        x.shared_, MaybeSharedArenas(comm, g, plan, exchanges, dx, wanted));
    if (x.shared_) x.offsets_ = PeerOffsets(g, plan, comm->rank());
    return x;
  }
  bool shared() const { return shared_ != nullptr; }
  // Lays out round k's buffers (n ranks; send slots from `slots` of ext).
  void Place(uint32_t k, uint32_t n, uint32_t slots, RoundIo* io,
             Prepared* ext) {
    if (shared_) {
      PlaceShared(*shared_, half_, offsets_[k], n, slots, io, ext);
    } else {
      PlaceInArenas(n, slots, &out_, &in_, io, ext);
    }
  }
  // After the round's agreement, which is the whole exchange with shared
  // arenas (past it, every rank's bytes lie in its half): the next round
  // takes the other half.
  absl::Status Exchange(Communicator* comm, const RoundIo& io) {
    if (shared_) {
      half_ ^= 1;
      return absl::OkStatus();
    }
    return comm->AllToAll(io.send, io.recv, MemoryKind::kHost);
  }

 private:
  std::unique_ptr<SharedArenas> shared_;
  std::vector<std::vector<uint64_t>> offsets_;  // [round][sender]
  uint32_t half_ = 0;
  Arena out_, in_;
};

// The device send and receive buffers of a round; points the device send
// slots of `ext` at the staged send buffer.
absl::Status StageDeviceSends(DeviceExchange* dx, const RoundIo& io, uint32_t n,
                              uint32_t slots, Prepared* ext) {
  CKPT_ASSIGN_OR_RETURN(char* staged, dx->Prepare(Sum(io.sends, n, 2 * n),
                                                  Sum(io.sizes, n, 2 * n)));
  for (uint32_t d = 0; d < n; ++d) {
    ext->reqs[slots + n + d].data = staged;
    staged += io.sends[n + d];
  }
  return absl::OkStatus();
}

// After a round's exchange: the received bytes to this rank's
// destinations (host by Unpack, device by DeviceExchange::Deliver).
absl::Status Receive(const RequestGroups& g, const CoopPlan& plan,
                     const Round& round, const RoundIo& io, uint32_t me,
                     int threads, DeviceExchange* dx, const Prepared& ext,
                     ReadExecutor* run) {
  CKPT_RETURN_IF_ERROR(
      ParallelFor(threads, io.incoming.size(), [&](int, size_t k) {
        const Incoming& in = io.incoming[k];
        return Unpack(g, plan.reads[in.read].read, me,
                      io.from[in.sender] + in.offset, run, dx);
      }));
  if (dx == nullptr) return absl::OkStatus();
  return dx->Deliver(g, plan, round.incoming, ext.reqs, run);
}

}  // namespace

absl::StatusOr<std::string> CooperativeLoad::OwnShardMetas(
    const std::vector<uint32_t>& own) {
  CKPT_RETURN_IF_ERROR(src_.shards->Open(own, threads_));
  std::string mine;
  for (uint32_t id : own) {
    CKPT_ASSIGN_OR_RETURN(const OpenShard* s, src_.shards->Get(id));
    PutShardMeta(&mine, id, s->file.meta);
  }
  return mine;
}

absl::Status CooperativeLoad::ShareShards(const std::vector<uint32_t>& ids,
                                          absl::Status* adopted) {
  Communicator* comm = src_.comm;
  const size_t n = comm->size(), me = comm->rank();
  std::vector<uint32_t> own;  // spread over ranks: shard ids[i] on rank i % n
  for (size_t i = me; i < ids.size(); i += n) own.push_back(ids[i]);
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> all,
                        GatherOrAgree(OwnShardMetas(own)));
  for (size_t r = 0; r < n && adopted->ok(); ++r) {
    if (r == me) continue;
    auto metas = DecodeShardMetas(all[r]);
    if (!metas.ok()) {
      *adopted = absl::InternalError(
          absl::StrCat("the shard indexes sent by rank ", r,
                       " do not decode: ", metas.status().message()));
      break;
    }
    for (auto& [id, meta] : *metas) {
      adopted->Update(src_.shards->Adopt(id, std::move(meta)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CooperativeLoad::EncodedRequests(
    const absl::StatusOr<Prepared>& p) {
  if (!p.ok()) return p.status();
  std::vector<PlanRequest> reqs;
  for (size_t i = 0; i < p->reqs.size(); ++i) {
    reqs.push_back(PlanRequest{p->entry[i], p->reqs[i].region});
  }
  return EncodeRankRequests(src_.comm->NodeName(), reqs);
}

absl::StatusOr<LoadReport> CooperativeLoad::Run(
    const absl::StatusOr<Prepared>& p, const LoadOptions& options,
    LoadReport report) {
  Communicator* comm = src_.comm;
  const format::Manifest& manifest = *src_.manifest;
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> all,
                        GatherOrAgree(EncodedRequests(p)));
  // From here every rank computes the same from the same inputs: an error
  // is the same on every rank.
  CKPT_ASSIGN_OR_RETURN(RequestGroups groups, GroupRequests(manifest, all));
  all = {};
  CKPT_ASSIGN_OR_RETURN(std::vector<ChunkPiece> pieces,
                        PairRequests(manifest, groups.unique));
  if (src_.load_alone && RanksMayReadAlone(manifest, groups, pieces)) {
    // Every rank reads what it needs alone (a load in the layout of the
    // save, or one that merges whole shards): no shard index, plan or
    // byte travels between the ranks; one agreement on the outcome.
    absl::StatusOr<LoadReport> alone = src_.load_alone(*p, std::move(report));
    CKPT_RETURN_IF_ERROR(Agree(alone.status()));
    return alone;
  }
  absl::Status adopted;
  CKPT_RETURN_IF_ERROR(
      ShareShards(NeededShards(manifest, groups, pieces), &adopted));
  absl::StatusOr<StagingPool*> pool = ReadyToRead(*p, adopted);
  CKPT_RETURN_IF_ERROR(Agree(pool.status()));
  auto lookup = [&](uint32_t entry, uint32_t chunk) {
    const uint32_t shard = manifest.entries[entry].chunks[chunk].shard;
    const OpenShard* s = *src_.shards->Get(shard);  // adopted by ShareShards
    return s->indexed.at(ChunkKey(entry, chunk));
  };
  CoopOptions co;
  co.max_read_bytes = kTaskBytes;
  co.min_read_bytes = src_.min_read_bytes;
  co.round_bytes = std::max<uint64_t>(1, options.exchange_bytes_per_round);
  const CoopPlan plan =
      PlanCooperativeReads(manifest, groups, pieces, lookup, co);
  if (comm->SharesAddressSpace()) {
    CKPT_ASSIGN_OR_RETURN(std::optional<AllDestinations> all,
                          ShareDestinations(*p));
    if (all.has_value()) {
      return RunDirect(*p, *all, groups, plan, std::move(report));
    }
  }
  return RunExchange(*p, groups, plan, options, *pool, std::move(report));
}

absl::StatusOr<StagingPool*> CooperativeLoad::ReadyToRead(
    const Prepared& p, const absl::Status& adopted) {
  CKPT_RETURN_IF_ERROR(adopted);
  CKPT_RETURN_IF_ERROR(src_.shards->CheckChunkless(p.entry, threads_));
  if (std::none_of(p.reqs.begin(), p.reqs.end(), [](const LoadRequest& r) {
        return r.memory == MemoryKind::kCuda;
      })) {
    return nullptr;
  }
  return src_.upload_pool();
}

absl::Status CooperativeLoad::RunReads(ReadExecutor* run,
                                       const std::vector<BlockRead>& reads,
                                       const std::vector<uint32_t>& shards) {
  return ParallelFor(threads_, reads.size(), [&](int t, size_t i) {
    CKPT_ASSIGN_OR_RETURN(ShardHandles::Lease file,
                          src_.shards->GetForReading(shards[i]));
    const OpenShard* s = *src_.shards->Get(shards[i]);  // opened or adopted
    return run->Run(t, *s, file.file(), src_.manifest->entries[reads[i].entry],
                    reads[i]);
  });
}

absl::StatusOr<LoadReport> CooperativeLoad::RunExchange(
    const Prepared& p, const RequestGroups& groups, const CoopPlan& plan,
    const LoadOptions& options, StagingPool* pool, LoadReport report) {
  Communicator* comm = src_.comm;
  const int threads = threads_;
  const uint32_t me = comm->rank(), n = comm->size();
  const uint32_t slots = static_cast<uint32_t>(p.reqs.size());
  // Device data plane: null unless the communicator and every rank can.
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<DeviceExchange> dx,
                        DeviceExchange::Create(comm, src_.device_memory,
                                               options.device_ready, p.reqs));
  Prepared ext = WithSendSlots(p, TotalSends(groups, plan, me, dx.get()),
                               dx ? 2 * n : n, n);
  ReadExecutor run(ext, src_.device_memory, pool, options.device_ready,
                   threads);
  run.CompleteEmpty();
  absl::Status pending;  // a local failure to report at the next agreement
  const std::vector<Round> rounds = RoundsOf(groups, plan, me);
  const std::vector<bool> exchanges = RoundsThatExchange(groups, plan);
  CKPT_ASSIGN_OR_RETURN(
      HostExchange host,
      HostExchange::Create(comm, groups, plan, exchanges, dx.get(),
                           options.shared_memory_exchange));
  for (uint32_t k = 0; k < rounds.size(); ++k) {
    RoundIo io = RoundIoOf(groups, plan, rounds[k], me, slots, dx.get());
    host.Place(k, n, slots, &io, &ext);
    report.bytes_received += Sum(io.sizes, 0, 2 * n);
    if (dx != nullptr && pending.ok()) {
      pending = StageDeviceSends(dx.get(), io, n, slots, &ext);
    }
    if (pending.ok()) pending = RunReads(&run, io.reads, io.shards);
    if (dx != nullptr && pending.ok()) pending = dx->Upload();
    // No rank sends anything this round (every rank knows it from the
    // plan): no agreement, no exchange; a failure waits for the next
    // agreement (that of the next exchange, or the last).
    if (!exchanges[k]) continue;
    CKPT_RETURN_IF_ERROR(Agree(pending));
    CKPT_RETURN_IF_ERROR(host.Exchange(comm, io));
    if (dx != nullptr) {
      CKPT_RETURN_IF_ERROR(dx->Exchange(comm, DeviceLanes(io.sends, n),
                                        DeviceLanes(io.sizes, n)));
    }
    pending =
        Receive(groups, plan, rounds[k], io, me, threads, dx.get(), ext, &run);
  }
  report.shared_memory_exchange = host.shared();
  if (pending.ok()) pending = run.CheckAllWritten();
  CKPT_RETURN_IF_ERROR(Agree(pending));
  FinishReport(p, run, &report);
  return report;
}

}  // namespace ckpt::internal

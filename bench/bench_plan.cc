// ckpt-bench-plan: cost of save planning, on a plan-cache miss and hit.
//
//   ckpt-bench-plan --ranks 8 --tensors 100000
//     R in-process ranks each register T tensors (tiny data: planning is
//     what is timed) and save three times into a fresh root under --dir.
//     The first save plans (miss); the next two reuse the plan (hit). Each
//     figure is the slowest rank's SaveResult::plan_seconds, median over
//     --repeats jobs. A job restarts with fresh writers and
//     reuse_recorded_plan off, so its first save is a true miss.
//
//   ckpt-bench-plan --synthetic-ranks 4096 --tensors 1000
//     Times the coordinator's planning of a synthetic 4096-rank job in one
//     process (one core): internal::PlanOnCoordinator, which decodes every
//     rank's message, checks the union, de-duplicates replicas, balances,
//     and encodes the result.
//     The job is tensor parallel x data parallel (TP 8; the rest replicas)
//     with per-rank RNG objects.
//
//   ckpt-bench-plan --synthetic-ranks 16384 --tensors 1000 --load
//     Times the plan of a cooperative load of such a job, as every rank
//     computes it (see RunLoadPlan), and reports the bytes read per rank.
//
// The last line printed is one JSON object.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/format/plan_record.h"
#include "ckpt/in_process.h"
#include "ckpt/writer.h"
#include "load/coop/coop_plan.h"
#include "save/save_messages.h"
#include "save/save_plan.h"

namespace {

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// CPU time of this thread: unlike wall time, not inflated by other jobs on
// a shared machine.
double ThreadCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Tensor i of a rank's model: a quarter each row-split (TP), column-split
// (TP), uneven-flat (FSDP) and replicated (DP); 16x8 float32 each.
struct Piece {
  ckpt::Shape shape;
  ckpt::Region region;
  bool replica;
};
Piece PieceOf(uint64_t i, int rank, int world) {
  const ckpt::Shape shape = {16, 8};
  switch (i % 4) {
    case 0: {  // rows
      uint64_t b = 16 * rank / world, e = 16 * (rank + 1) / world;
      return {shape, ckpt::Box{{b, 0}, {e - b, 8}}, false};
    }
    case 1: {  // columns
      uint64_t b = 8 * rank / world, e = 8 * (rank + 1) / world;
      return {shape, ckpt::Box{{0, b}, {16, e - b}}, false};
    }
    case 2: {  // uneven flat
      auto cut = [&](int r) {
        return uint64_t{128} * r * r / (uint64_t(world) * world);
      };
      return {shape, ckpt::FlatRange{cut(rank), cut(rank + 1) - cut(rank)},
              false};
    }
    default:
      return {shape, ckpt::FullBox(shape), true};
  }
}

// One rank of RunInProcess's job: registers its pieces, then saves three
// times into `root`, recording each save's planning time and cache outcome.
absl::Status SaveThreeTimes(ckpt::Communicator& comm, int ranks,
                            uint64_t tensors, const std::string& root,
                            const std::vector<char>& data,
                            std::vector<std::vector<double>>* plan_ms,
                            std::vector<std::vector<bool>>* hits) {
  ckpt::Writer::Options wo;
  wo.comm = &comm;
  auto writer = ckpt::Writer::Create(wo);
  if (!writer.ok()) return writer.status();
  for (uint64_t i = 0; i < tensors; ++i) {
    Piece p = PieceOf(i, comm.rank(), ranks);
    ckpt::TensorOptions o;
    o.replica = p.replica;
    absl::Status s = (*writer)->AddTensor(
        absl::StrFormat("layers.%d.t%d", i / 16, i % 16), ckpt::DType::kFloat32,
        p.shape, p.region, data.data(), o);
    if (!s.ok()) return s;
  }
  absl::Status s =
      (*writer)->SetObject(absl::StrFormat("rng.rank%d", comm.rank()), "state");
  if (!s.ok()) return s;
  ckpt::SaveOptions so;
  so.reuse_recorded_plan = false;
  so.io_threads = 1;
  so.alignment = 1;
  for (int k = 0; k < 3; ++k) {
    // Ranks reach a save together in a trainer; skew from the previous
    // save's end is not planning cost.
    absl::Status b = comm.Barrier();
    if (!b.ok()) return b;
    auto r = (*writer)->Save(root, k + 1, so);
    if (!r.ok()) return r.status();
    (*plan_ms)[k][comm.rank()] = r->plan_seconds * 1e3;
    (*hits)[k][comm.rank()] = r->plan_cache_hit;
  }
  return absl::OkStatus();
}

// One repeat of RunInProcess: the slowest rank's planning time of the first
// save (a miss) into *miss, of the two others (hits) into *hit. False, with
// a message, when a save fails or the cache does not behave.
bool TimeInProcessRepeat(int ranks, uint64_t tensors, const std::string& root,
                         std::vector<double>* miss, std::vector<double>* hit) {
  const std::vector<char> data(16 * 8 * 4, 1);
  std::filesystem::remove_all(root);
  ckpt::InProcessWorld world(ranks);
  std::vector<std::vector<double>> plan_ms(3, std::vector<double>(ranks));
  std::vector<std::vector<bool>> hits(3, std::vector<bool>(ranks));
  absl::Status st = ckpt::RunRanks(world, [&](ckpt::Communicator& comm) {
    return SaveThreeTimes(comm, ranks, tensors, root, data, &plan_ms, &hits);
  });
  std::filesystem::remove_all(root);
  if (!st.ok()) {
    std::cerr << "ckpt-bench-plan: " << st << "\n";
    return false;
  }
  for (int k = 0; k < 3; ++k) {
    bool all_hit =
        std::all_of(hits[k].begin(), hits[k].end(), [](bool b) { return b; });
    if (all_hit != (k > 0)) {
      std::cerr << "ckpt-bench-plan: unexpected cache outcome at save " << k + 1
                << "\n";
      return false;
    }
    double slowest = *std::max_element(plan_ms[k].begin(), plan_ms[k].end());
    (k == 0 ? miss : hit)->push_back(slowest);
  }
  return true;
}

// The planning cost of a save on `ranks` in-process ranks with `tensors`
// tensors each, on a plan-cache miss and on hits (medians over `repeats`).
int RunInProcess(int ranks, uint64_t tensors, int repeats,
                 const std::string& dir_arg) {
  std::string base = dir_arg;
  if (base.empty())
    base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
  std::vector<double> miss, hit;
  for (int rep = 0; rep < repeats; ++rep) {
    std::string root =
        absl::StrFormat("%s/ckpt-bench-plan-%d-%d", base, getpid(), rep);
    if (!TimeInProcessRepeat(ranks, tensors, root, &miss, &hit)) return 2;
    std::printf("repeat %d: miss %.1f ms, hits %.2f / %.2f ms\n", rep,
                miss.back(), hit[hit.size() - 2], hit.back());
  }
  double m = Median(miss), h = Median(hit);
  std::printf(
      "ranks %d, tensors per rank %llu: miss %.1f ms, hit %.2f ms (%.2f%% of a "
      "miss)\n",
      ranks, static_cast<unsigned long long>(tensors), m, h, 100 * h / m);
  std::printf(
      "{\"ranks\": %d, \"tensors\": %llu, \"repeats\": %d, \"miss_ms\": %.3f, "
      "\"hit_ms\": %.3f, "
      "\"hit_over_miss\": %.5f}\n",
      ranks, static_cast<unsigned long long>(tensors), repeats, m, h, h / m);
  return 0;
}

// What rank r of the synthetic job sends the coordinator: its encoded
// RankPlan. Rank r is TP rank r % kTp of data-parallel group r / kTp;
// every DP group holds the same pieces (replicas). Tensors alternate row
// and column splits; each rank has its own RNG object.
constexpr int kTp = 8;
std::string SyntheticRankPlan(int r, uint64_t tensors) {
  using ckpt::internal::LocalItem;
  ckpt::internal::RankPlan rp;
  rp.fingerprint[0] = static_cast<uint8_t>(r);
  rp.plan.reserve(tensors + 1);
  const int tp = r % kTp;
  for (uint64_t i = 0; i < tensors; ++i) {
    LocalItem it;
    it.name = absl::StrFormat("model.layers.%d.param%d", i / 10, i % 10);
    it.dtype = ckpt::DType::kBFloat16;
    it.shape = {4096, 1024};
    if (i % 2 == 0) {
      it.region = ckpt::Box{{uint64_t(tp) * 512, 0}, {512, 1024}};
    } else {
      it.region = ckpt::Box{{0, uint64_t(tp) * 128}, {4096, 128}};
    }
    it.replica = true;
    rp.plan.push_back(std::move(it));
  }
  LocalItem rng;
  rng.name = absl::StrFormat("rng.rank%d", r);
  rng.kind = ckpt::format::EntryKind::kObject;
  rng.dtype = ckpt::DType::kUInt8;
  rng.shape = {5056};
  rng.region = ckpt::FlatRange{0, 5056};
  rp.plan.push_back(std::move(rng));
  return ckpt::internal::EncodeRankPlan(rp);
}

// The PLAN record of a synthetic job's plan: every unique piece written
// once (8 pieces per tensor plus the objects). The most writes of one rank
// in *max_writes; false, with a message, otherwise.
bool CheckSyntheticRecord(const std::string& body, int ranks, uint64_t tensors,
                          uint64_t* max_writes) {
  auto record = ckpt::format::DecodePlanRecord(body);
  if (!record.ok()) {
    std::cerr << "ckpt-bench-plan: " << record.status() << "\n";
    return false;
  }
  uint64_t writes = 0;
  *max_writes = 0;
  for (const auto& rk : record->ranks) {
    writes += rk.writes.size();
    *max_writes = std::max<uint64_t>(*max_writes, rk.writes.size());
  }
  if (writes != tensors * kTp + ranks) {
    std::cerr << "ckpt-bench-plan: plan assigns " << writes
              << " writes, expected " << tensors * kTp + ranks << "\n";
    return false;
  }
  return true;
}

// Times internal::PlanOnCoordinator, the coordinator's whole planning of a
// save (decode every message, check, de-duplicate, balance, encode the
// record), over the messages of a synthetic job (made afresh, untimed, for
// each repeat: the coordinator consumes them).
int RunSynthetic(int ranks, uint64_t tensors, int repeats) {
  if (ranks % kTp != 0) {
    std::cerr << "ckpt-bench-plan: --synthetic-ranks must be a multiple of 8\n";
    return 2;
  }
  std::vector<double> times, cpu_times;
  uint64_t encoded_bytes = 0;
  size_t record_bytes = 0;
  for (int rep = 0; rep < repeats; ++rep) {
    std::vector<std::string> messages(ranks);
    encoded_bytes = 0;
    for (int r = 0; r < ranks; ++r) {
      messages[r] = SyntheticRankPlan(r, tensors);
      encoded_bytes += messages[r].size();
    }
    auto t = Clock::now();
    double cpu0 = ThreadCpuMs();
    auto planned = ckpt::internal::PlanOnCoordinator(std::move(messages));
    times.push_back(MsSince(t));
    cpu_times.push_back(ThreadCpuMs() - cpu0);
    if (!planned.ok()) {
      std::cerr << "ckpt-bench-plan: " << planned.status() << "\n";
      return 2;
    }
    record_bytes = planned->body.size();
    uint64_t max_writes = 0;
    if (!CheckSyntheticRecord(planned->body, ranks, tensors, &max_writes)) {
      return 2;
    }
    std::printf(
        "repeat %d: %.0f ms, cpu %.0f ms (most writes on one rank: %llu)\n",
        rep, times.back(), cpu_times.back(),
        static_cast<unsigned long long>(max_writes));
  }
  double ms = Median(times), cpu_ms = Median(cpu_times);
  std::printf(
      "synthetic %d ranks x %llu tensors (%llu local items, %.1f MiB of local "
      "plans): "
      "plan %.0f ms, PLAN record %.1f KiB\n",
      ranks, static_cast<unsigned long long>(tensors),
      static_cast<unsigned long long>(uint64_t(ranks) * (tensors + 1)),
      encoded_bytes / 1048576.0, ms, record_bytes / 1024.0);
  std::printf(
      "{\"synthetic_ranks\": %d, \"tensors\": %llu, \"repeats\": %d, "
      "\"plan_ms\": %.3f, "
      "\"plan_cpu_ms\": %.3f}\n",
      ranks, static_cast<unsigned long long>(tensors), repeats, ms, cpu_ms);
  return 0;
}

// --load: the plan of a cooperative load (libckpt/load/coop/coop_plan.h) of a
// synthetic job as every rank computes it: `ranks` ranks, tensor parallel
// (TP 8) x data parallel, load the checkpoint that such a job saved, each
// rank its own TP piece of every tensor (so each piece is wanted by
// ranks / 8 replicas). Tensors are 8192 x 4096 bfloat16 (64 MiB),
// alternating row and column splits, stored in 1 MiB blocks, piece p of
// tensor i in shard (8 i + p) % ranks. Timed: decoding and grouping every
// rank's requests, pairing them with the chunks, planning and assigning
// the reads; reported with the bytes each rank and each node reads (ranks
// r / per_node share a node; per_node 0: nodes unknown).
namespace load_plan {

namespace fmt = ckpt::format;
constexpr uint64_t kR = 8192, kC = 4096, kBlock = 1 << 20;

// The TP piece `tp` of tensor `i`: rows for even tensors, columns for odd.
ckpt::Box Piece(uint64_t i, int tp) {
  if (i % 2 == 0) return ckpt::Box{{tp * kR / kTp, 0}, {kR / kTp, kC}};
  return ckpt::Box{{0, tp * kC / kTp}, {kR, kC / kTp}};
}

// The inputs of the plan: the manifest of the saved checkpoint, the block
// tables of its chunks, and every rank's encoded requests.
struct Inputs {
  fmt::Manifest manifest;
  std::map<std::pair<uint32_t, uint32_t>, fmt::ChunkRecord> indexed;
  std::vector<std::string> encoded;  // [rank]
};

void AddTensors(int ranks, uint64_t tensors, Inputs* in) {
  std::vector<uint64_t> end(ranks, 0);
  for (uint64_t i = 0; i < tensors; ++i) {
    fmt::EntryRecord e;
    e.name = absl::StrFormat("model.layers.%d.param%d", i / 10, i % 10);
    e.dtype = ckpt::DType::kBFloat16;
    e.shape = {kR, kC};
    for (int tp = 0; tp < kTp; ++tp) {
      fmt::ChunkRecord c;
      c.region = Piece(i, tp);
      c.shard = static_cast<uint32_t>((kTp * i + tp) % ranks);
      c.block_size = kBlock;
      c.data_offset = 64 + end[c.shard];
      c.stored_length = kR * kC * 2 / kTp;
      end[c.shard] += c.stored_length;
      fmt::ChunkRecord with = c;
      for (uint64_t b = 0; b * kBlock < c.stored_length; ++b) {
        with.blocks.push_back(fmt::BlockRecord{kBlock, 0});
      }
      in->indexed[{static_cast<uint32_t>(i), static_cast<uint32_t>(tp)}] = with;
      e.chunks.push_back(c);
    }
    in->manifest.entries.push_back(std::move(e));
  }
}

void AddRequests(int ranks, uint64_t tensors, int per_node, Inputs* in) {
  in->encoded.resize(ranks);
  for (int r = 0; r < ranks; ++r) {
    std::vector<ckpt::internal::PlanRequest> reqs;
    for (uint64_t i = 0; i < tensors; ++i) {
      reqs.push_back({static_cast<uint32_t>(i), Piece(i, r % kTp)});
    }
    const std::string node =
        per_node > 0 ? absl::StrCat("node", r / per_node) : "";
    in->encoded[r] = ckpt::internal::EncodeRankRequests(node, reqs);
  }
}

// What the repeats measured: times, and the last plan with the bytes it
// reads per node.
struct Timings {
  std::vector<double> times, cpu_times;
  ckpt::internal::CoopPlan plan;
  std::vector<uint64_t> node_bytes;
};

// Plans `repeats` times as every rank would; false, with a message, on an
// error.
bool TimePlans(const Inputs& in, int repeats, Timings* t) {
  auto lookup = [&](uint32_t e, uint32_t c) { return &in.indexed.at({e, c}); };
  for (int rep = 0; rep < repeats; ++rep) {
    auto start = Clock::now();
    double cpu0 = ThreadCpuMs();
    auto groups = ckpt::internal::GroupRequests(in.manifest, in.encoded);
    if (!groups.ok()) {
      std::cerr << "ckpt-bench-plan: " << groups.status() << "\n";
      return false;
    }
    auto pieces = ckpt::internal::PairRequests(in.manifest, groups->unique);
    if (!pieces.ok()) {
      std::cerr << "ckpt-bench-plan: " << pieces.status() << "\n";
      return false;
    }
    t->plan = ckpt::internal::PlanCooperativeReads(
        in.manifest, *groups, *pieces, lookup,
        ckpt::internal::CoopOptions{});  // the Reader's defaults
    t->times.push_back(MsSince(start));
    t->cpu_times.push_back(ThreadCpuMs() - cpu0);
    std::printf("repeat %d: %.0f ms, cpu %.0f ms\n", rep, t->times.back(),
                t->cpu_times.back());
    t->node_bytes = ckpt::internal::BytesReadPerNode(*groups, t->plan);
  }
  return true;
}

void Report(int ranks, uint64_t tensors, int repeats, int per_node,
            const Timings& t) {
  const ckpt::internal::CoopPlan& plan = t.plan;
  const auto [lo, hi] =
      std::minmax_element(plan.bytes_read.begin(), plan.bytes_read.end());
  const double mean = double(plan.stored_bytes) / ranks;
  const auto [nlo, nhi] =
      std::minmax_element(t.node_bytes.begin(), t.node_bytes.end());
  const size_t nodes = t.node_bytes.size();
  const double nmean = double(plan.stored_bytes) / nodes;
  const double ms = Median(t.times), cpu_ms = Median(t.cpu_times);
  std::printf(
      "cooperative load plan, %d ranks x %llu tensors (%llu requests, %.1f "
      "GiB stored, %zu reads, %u rounds): %.0f ms; bytes read per rank min "
      "%.1f / mean %.1f / max %.1f MiB, max/mean %.3f; per node (%zu) min "
      "%.1f / mean %.1f / max %.1f MiB, max/mean %.3f\n",
      ranks, static_cast<unsigned long long>(tensors),
      static_cast<unsigned long long>(uint64_t(ranks) * tensors),
      plan.stored_bytes / double(1ull << 30), plan.reads.size(), plan.rounds,
      ms, *lo / 1048576.0, mean / 1048576.0, *hi / 1048576.0, *hi / mean, nodes,
      *nlo / 1048576.0, nmean / 1048576.0, *nhi / 1048576.0, *nhi / nmean);
  std::printf(
      "{\"load\": true, \"synthetic_ranks\": %d, \"tensors\": %llu, "
      "\"repeats\": %d, \"plan_ms\": %.3f, \"plan_cpu_ms\": %.3f, "
      "\"stored_bytes\": %llu, \"reads\": %zu, \"rounds\": %u, "
      "\"bytes_read_per_rank\": {\"min\": %llu, \"mean\": %.1f, \"max\": "
      "%llu}, \"max_over_mean\": %.4f, \"ranks_per_node\": %d, "
      "\"nodes\": %zu, \"bytes_read_per_node\": {\"min\": %llu, "
      "\"mean\": %.1f, \"max\": %llu}, \"node_max_over_mean\": %.4f}\n",
      ranks, static_cast<unsigned long long>(tensors), repeats, ms, cpu_ms,
      static_cast<unsigned long long>(plan.stored_bytes), plan.reads.size(),
      plan.rounds, static_cast<unsigned long long>(*lo), mean,
      static_cast<unsigned long long>(*hi), *hi / mean, per_node, nodes,
      static_cast<unsigned long long>(*nlo), nmean,
      static_cast<unsigned long long>(*nhi), *nhi / nmean);
}

}  // namespace load_plan

int RunLoadPlan(int ranks, uint64_t tensors, int repeats, int per_node) {
  using load_plan::kC;
  using load_plan::kR;
  if (ranks % kTp != 0) {
    std::cerr << "ckpt-bench-plan: --synthetic-ranks must be a multiple of 8\n";
    return 2;
  }
  load_plan::Inputs in;
  load_plan::AddTensors(ranks, tensors, &in);
  load_plan::AddRequests(ranks, tensors, per_node, &in);
  load_plan::Timings t;
  if (!load_plan::TimePlans(in, repeats, &t)) return 2;
  // Each stored byte is read once.
  if (t.plan.stored_bytes != tensors * kR * kC * 2) {
    std::cerr << "ckpt-bench-plan: the plan reads " << t.plan.stored_bytes
              << " bytes, the checkpoint stores " << tensors * kR * kC * 2
              << "\n";
    return 2;
  }
  load_plan::Report(ranks, tensors, repeats, per_node, t);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ckpt-bench-plan: save planning cost on a plan-cache miss and hit"};
  app.name("ckpt-bench-plan");
  int ranks = 8, synthetic = 0, repeats = 3;
  uint64_t tensors = 1000;
  std::string dir;
  app.add_option("--ranks", ranks, "in-process ranks")
      ->check(CLI::Range(1, 1024));
  app.add_option("--tensors", tensors, "tensors per rank")
      ->check(CLI::Range(1, 10000000));
  app.add_option("--synthetic-ranks", synthetic,
                 "time the coordinator's planning of a synthetic job of this "
                 "many ranks")
      ->check(CLI::Range(8, 1 << 20));
  app.add_option("--repeats", repeats,
                 "jobs (or plannings) to take the median of")
      ->check(CLI::Range(1, 100));
  app.add_option("--dir", dir,
                 "where the in-process saves go (default /dev/shm)");
  bool load = false;
  app.add_flag("--load", load,
               "with --synthetic-ranks: time the plan of a cooperative load "
               "instead of a save");
  int per_node = 8;
  app.add_option("--ranks-per-node", per_node,
                 "with --load: ranks r / N share node N (0: nodes unknown, "
                 "every rank its own)")
      ->check(CLI::Range(0, 1 << 20));
  CLI11_PARSE(app, argc, argv);
  if (load && synthetic > 0) {
    return RunLoadPlan(synthetic, tensors, repeats, per_node);
  }
  return synthetic > 0 ? RunSynthetic(synthetic, tensors, repeats)
                       : RunInProcess(ranks, tensors, repeats, dir);
}

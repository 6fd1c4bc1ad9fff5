// Multi-rank scenarios with in-process ranks (one thread per rank): a
// transformer saved on 1..8 ranks and loaded on every other world size,
// FSDP flat shards with their optimizer state, tensor x data parallelism
// with replica de-duplication and balanced writes, a fault on one rank, and
// registrations that disagree between ranks. Every load is compared byte
// by byte with a brute-force extraction from the global reference tensor.
#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "ckpt/reader.h"
#include "ckpt/testing/fault_injection.h"
#include "ckpt/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::Extract;
using ::ckpt::testing::IsOk;
using ::ckpt::testing::Layout;
using ::ckpt::testing::Numel;
using ::ckpt::testing::Piece;
using ::ckpt::testing::PieceOf;
using ::ckpt::testing::ReferenceBytes;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::UnevenSplit;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// Shared machinery.

struct Tensor {
  std::string name;
  DType dtype;
  Shape shape;
  std::string global;  // reference bytes of the whole tensor
  uint64_t bytes() const { return global.size(); }
};

using Objects = std::map<std::string, std::string>;

struct Model {
  std::vector<Tensor> tensors;
  Objects objects;  // every object saved, by name

  void Add(const std::string& name, DType dtype, const Shape& shape) {
    tensors.push_back(
        {name, dtype, shape, ReferenceBytes(dtype, shape, tensors.size() + 1)});
  }
};

// What rank `rank` of `world` registers of tensor `i`; nullopt: nothing.
using SavePieceFn =
    std::function<std::optional<Piece>(size_t i, int rank, int world)>;
// Which objects rank `rank` sets.
using RankObjectsFn = std::function<Objects(int rank)>;
// What rank `rank` of `world` loads of tensor `i` (may be empty).
using LoadRegionFn = std::function<Region(size_t i, int rank, int world)>;

// Saves `model` from `world` in-process ranks; returns every rank's result.
// `storages[r]`, when given, is rank r's storage.
std::vector<absl::StatusOr<SaveResult>> SaveOnRanks(
    const std::string& root, uint64_t step, const Model& model, int world,
    const SavePieceFn& piece, const RankObjectsFn& objects,
    const SaveOptions& options, const std::vector<Storage*>& storages = {}) {
  InProcessWorld w(world);
  std::vector<absl::StatusOr<SaveResult>> results(
      world, absl::UnknownError("not run"));
  // Registered pieces must stay alive and unchanged during Save.
  std::vector<std::vector<std::string>> bufs(
      world, std::vector<std::string>(model.tensors.size()));
  (void)RunRanks(w, [&](Communicator& comm) -> absl::Status {
    const int rank = comm.rank();
    results[rank] = [&]() -> absl::StatusOr<SaveResult> {
      Writer::Options wo;
      wo.comm = &comm;
      if (!storages.empty()) wo.storage = storages[rank];
      CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
      for (size_t i = 0; i < model.tensors.size(); ++i) {
        const Tensor& t = model.tensors[i];
        std::optional<Piece> p = piece(i, rank, world);
        if (!p) continue;
        std::string& buf = bufs[rank][i];
        buf = Extract(t.global, t.dtype, t.shape, p->region);
        TensorOptions to;
        to.replica = p->replica;
        CKPT_RETURN_IF_ERROR(writer->AddTensor(t.name, t.dtype, t.shape,
                                               p->region, buf.data(), to));
      }
      for (auto& [name, bytes] : objects(rank)) {
        CKPT_RETURN_IF_ERROR(writer->SetObject(name, bytes));
      }
      return writer->Save(root, step, options);
    }();
    return results[rank].status();
  });
  return results;
}

// Every rank of `world` opens its own Reader on `path` and loads, in one
// strict Load (every entry requested, objects included), region(i, rank)
// of every tensor. OK iff every rank's bytes equal the reference.
absl::Status LoadOnRanks(const std::string& path, const Model& model, int world,
                         const LoadRegionFn& region, const std::string& label) {
  InProcessWorld w(world);
  return RunRanks(w, [&](Communicator& comm) -> absl::Status {
    const int rank = comm.rank();
    const std::string where = absl::StrCat(label, " rank ", rank, "/", world);
    CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(path));
    std::vector<Region> regions;
    std::vector<std::string> bufs(model.tensors.size());
    std::vector<LoadRequest> reqs;
    for (size_t i = 0; i < model.tensors.size(); ++i) {
      const Tensor& t = model.tensors[i];
      regions.push_back(region(i, rank, world));
      bufs[i].assign(RegionElements(regions[i]) * DTypeSize(t.dtype), '\xEE');
      reqs.push_back({t.name, t.dtype, t.shape, regions[i], bufs[i].data()});
    }
    std::vector<std::string> objs(model.objects.size());
    size_t k = 0;
    for (const auto& [name, bytes] : model.objects) {
      LoadRequest r;
      r.name = name;
      r.object = &objs[k++];
      reqs.push_back(std::move(r));
    }
    auto report = reader->Load(reqs);
    if (!report.ok()) return Annotate(report.status(), where);
    for (size_t i = 0; i < model.tensors.size(); ++i) {
      const Tensor& t = model.tensors[i];
      if (bufs[i] != Extract(t.global, t.dtype, t.shape, regions[i])) {
        return absl::InternalError(absl::StrCat(
            where, ": tensor '", t.name, "' region ",
            RegionToString(regions[i]), " differs from the reference"));
      }
    }
    k = 0;
    for (const auto& [name, bytes] : model.objects) {
      if (objs[k] != bytes) {
        return absl::InternalError(absl::StrCat(
            where, ": object '", name, "' is \"", absl::CEscape(objs[k]),
            "\", want \"", absl::CEscape(bytes), "\""));
      }
      ++k;
    }
    return absl::OkStatus();
  });
}

// Names in `dir`, sorted, without the writers' lock files.
std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n == ".ckpt-save.lock" || n == ".ckpt-commit.lock") continue;
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Every result is OK; returns how many were.
int CountOk(const std::vector<absl::StatusOr<SaveResult>>& results) {
  int n = 0;
  for (const auto& r : results) n += r.ok();
  return n;
}

// Objects "rng.rank<r>" on every rank, plus `extra` on rank 0.
RankObjectsFn RngPerRank(Objects extra = {}) {
  return [extra](int rank) {
    Objects o = rank == 0 ? extra : Objects{};
    o["rng.rank" + std::to_string(rank)] =
        "rng-state-of-rank-" + std::to_string(rank);
    return o;
  };
}
Objects RngObjects(int world, Objects extra = {}) {
  for (int r = 0; r < world; ++r) {
    extra["rng.rank" + std::to_string(r)] =
        "rng-state-of-rank-" + std::to_string(r);
  }
  return extra;
}

// ---------------------------------------------------------------------------
// 1. A transformer saved on W ranks, loaded on every other world size.

Model SmallTransformer() {
  const uint64_t vocab = 40, hidden = 16, ffn = 24;
  Model m;
  m.Add("embed.w", DType::kBFloat16, {vocab, hidden});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    m.Add(p + "attn_norm.w", DType::kFloat32, {hidden});
    m.Add(p + "attn.qkv.w", DType::kBFloat16, {3 * hidden, hidden});
    m.Add(p + "attn.qkv.b", DType::kBFloat16, {3 * hidden});
    m.Add(p + "attn.out.w", DType::kBFloat16, {hidden, hidden});
    m.Add(p + "mlp_norm.w", DType::kFloat32, {hidden});
    m.Add(p + "mlp.gate_up.w", DType::kFloat16,
          {2, ffn, hidden});  // fused, 3-d
    m.Add(p + "mlp.down.w", DType::kBFloat16, {hidden, ffn});
  }
  m.Add("final_norm.w", DType::kFloat32, {hidden});
  m.Add("lm_head.w", DType::kFloat32, {vocab, hidden});
  m.Add("logit_scale", DType::kFloat64, {});  // a scalar
  return m;
}

// Layout of tensor i under `variant`: consecutive tensors use different
// layouts, and two variants in [0, 6) never give a tensor the same one.
Layout MixedLayout(size_t i, int variant) {
  return testing::kAllLayouts[(i + variant) % std::size(testing::kAllLayouts)];
}

// Communicator::Gather's default (built on AllGather), as the in-process
// and user adapters that do not override it run it: the root gets every
// contribution in rank order, the others nothing; a bad root fails on every
// rank without a collective.
TEST(MultiRankTest, DefaultGatherDeliversToTheRootOnly) {
  auto contribution = [](int rank) {
    return std::string(rank * 3, static_cast<char>('a' + rank));
  };
  auto check = [&](Communicator& comm) -> absl::Status {
    for (int root = 0; root < comm.size(); ++root) {
      CKPT_ASSIGN_OR_RETURN(std::vector<std::string> got,
                            comm.Gather(contribution(comm.rank()), root));
      std::vector<std::string> want;
      if (comm.rank() == root) {
        for (int r = 0; r < comm.size(); ++r) want.push_back(contribution(r));
      }
      if (got != want) {
        return absl::InternalError(absl::StrCat("rank ", comm.rank(), ", root ",
                                                root, ": got ", got.size(),
                                                " contributions"));
      }
    }
    absl::Status bad = comm.Gather("x", comm.size()).status();
    if (bad.code() != absl::StatusCode::kInvalidArgument ||
        !absl::StrContains(bad.message(), "is not a rank")) {
      return absl::InternalError(absl::StrCat("bad root: ", bad.ToString()));
    }
    return absl::OkStatus();
  };
  for (int world_size : {1, 3}) {
    InProcessWorld world(world_size);
    EXPECT_THAT(RunRanks(world, check), IsOk()) << world_size << " ranks";
  }
}

TEST(MultiRankTest, TransformerSavedOnEachWorldSizeLoadsExactlyOnEveryOther) {
  const std::vector<int> worlds = {1, 2, 3, 4, 8};
  Model model = SmallTransformer();
  const uint64_t tensor_bytes = [&] {
    uint64_t n = 0;
    for (const Tensor& t : model.tensors) n += t.bytes();
    return n;
  }();
  for (size_t si = 0; si < worlds.size(); ++si) {
    const int save_world = worlds[si];
    SCOPED_TRACE(absl::StrCat("saved on ", save_world, " ranks"));
    TempDir dir;
    model.objects =
        RngObjects(save_world, {{"trainer_state", "epoch=3;samples=12345"}});
    SaveOptions so;
    so.block_size = 4096;
    so.io_threads = 2;
    auto results = SaveOnRanks(
        dir.path(), 100, model, save_world,
        [&](size_t i, int rank, int world) -> std::optional<Piece> {
          return PieceOf(MixedLayout(i, si), model.tensors[i].shape, rank,
                         world);
        },
        RngPerRank({{"trainer_state", "epoch=3;samples=12345"}}), so);
    for (int r = 0; r < save_world; ++r)
      ASSERT_THAT(results[r], IsOk()) << "rank " << r;
    // Replicas are written once: the stored payload is the unique bytes.
    uint64_t object_bytes = 0;
    for (const auto& [name, bytes] : model.objects)
      object_bytes += bytes.size();
    EXPECT_EQ(results[0]->logical_bytes, tensor_bytes + object_bytes);
    EXPECT_EQ(results[0]->stored_bytes, tensor_bytes + object_bytes);
    {
      CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir.path()));
      EXPECT_EQ(reader->manifest().info.world_size,
                static_cast<uint32_t>(save_world));
      EXPECT_EQ(reader->manifest().info.step, 100u);
    }
    for (size_t li = 0; li < worlds.size(); ++li) {
      if (li == si) continue;
      const int load_world = worlds[li];
      CKPT_EXPECT_OK(LoadOnRanks(
          dir.path(), model, load_world,
          [&](size_t i, int rank, int world) {
            return PieceOf(MixedLayout(i, li), model.tensors[i].shape, rank,
                           world)
                .region;
          },
          absl::StrCat("saved on ", save_world, ", loaded on ", load_world)));
    }
  }
}

// ---------------------------------------------------------------------------
// 2. FSDP: flat parameters split unevenly, optimizer state sharded alike.

struct FsdpParam {
  std::string name;
  Shape shape;
  uint64_t flat_offset;  // in the concatenated flat parameter
};

std::vector<FsdpParam> FsdpParams() {
  std::vector<FsdpParam> ps = {{"embed.w", {40, 16}, 0},
                               {"layers.0.attn.qkv.w", {48, 16}, 0},
                               {"layers.0.attn.out.w", {16, 16}, 0},
                               {"layers.0.mlp.up.w", {128, 16}, 0},
                               {"layers.0.mlp.up.b", {128}, 0},
                               {"layers.0.mlp.down.w", {16, 128}, 0},
                               {"layers.0.norm.w", {16}, 0}};
  uint64_t off = 0;
  for (FsdpParam& p : ps) {
    p.flat_offset = off;
    off += Numel(p.shape);
  }
  return ps;
}

uint64_t FsdpTotal(const std::vector<FsdpParam>& ps) {
  return ps.back().flat_offset + Numel(ps.back().shape);
}

// The model holds, for every parameter p (in this order): p, then
// optimizer.exp_avg.p and optimizer.exp_avg_sq.p; so tensor i belongs to
// parameter i / 3.
Model FsdpModel(const std::vector<FsdpParam>& ps) {
  Model m;
  for (const FsdpParam& p : ps) {
    m.Add(p.name, DType::kBFloat16, p.shape);
    m.Add("optimizer.exp_avg." + p.name, DType::kFloat32, p.shape);
    m.Add("optimizer.exp_avg_sq." + p.name, DType::kFloat32, p.shape);
  }
  m.objects = {{"step", "1234"}};
  return m;
}

// The part of parameter p inside rank's slice [begin, begin + len) of the
// flat parameter, as a flat range of p; nullopt if they do not intersect.
std::optional<FlatRange> FlatPart(const FsdpParam& p, uint64_t begin,
                                  uint64_t len) {
  const uint64_t lo = std::max(begin, p.flat_offset);
  const uint64_t hi = std::min(begin + len, p.flat_offset + Numel(p.shape));
  if (lo >= hi) return std::nullopt;
  return FlatRange{lo - p.flat_offset, hi - lo};
}

// FSDP's own split for a new world: ceil(total / world) per rank, the last
// rank short.
std::pair<uint64_t, uint64_t> EvenSlice(uint64_t total, int rank, int world) {
  const uint64_t per = (total + world - 1) / world;
  const uint64_t begin = std::min(total, per * rank);
  return {begin, std::min(total, begin + per) - begin};
}

TEST(MultiRankTest,
     FsdpUnevenFlatShardsWithOptimizerStateReshardToTwoAndThreeRanks) {
  const std::vector<FsdpParam> ps = FsdpParams();
  const uint64_t total = FsdpTotal(ps);
  Model model = FsdpModel(ps);
  TempDir dir;
  // Uneven slices of the flat parameter (weights 1:2:3:4): boundaries fall
  // inside parameters, and some ranks hold nothing of some parameters (they
  // then register nothing for them, as FSDP does).
  auto results = SaveOnRanks(
      dir.path(), 7, model, 4,
      [&](size_t i, int rank, int world) -> std::optional<Piece> {
        auto [begin, len] = UnevenSplit(total, world)[rank];
        auto part = FlatPart(ps[i / 3], begin, len);
        if (!part) return std::nullopt;
        return Piece{*part, false};
      },
      [](int rank) {
        return rank == 0 ? Objects{{"step", "1234"}} : Objects{};
      },
      SaveOptions{});
  for (int r = 0; r < 4; ++r) ASSERT_THAT(results[r], IsOk()) << "rank " << r;

  // Re-split for the new world: every rank requests every entry, an empty
  // range where its slice misses the parameter.
  auto fsdp_load = [&](size_t i, int rank, int world) -> Region {
    auto [begin, len] = EvenSlice(total, rank, world);
    auto part = FlatPart(ps[i / 3], begin, len);
    return part ? Region(*part) : Region(FlatRange{0, 0});
  };
  CKPT_EXPECT_OK(
      LoadOnRanks(dir.path(), model, 2, fsdp_load, "fsdp 4 -> fsdp 2"));
  CKPT_EXPECT_OK(
      LoadOnRanks(dir.path(), model, 3, fsdp_load, "fsdp 4 -> fsdp 3"));
  // ...and as n-d row boxes (tensor parallelism, or a non-FSDP trainer).
  CKPT_EXPECT_OK(LoadOnRanks(
      dir.path(), model, 2,
      [&](size_t i, int rank, int world) {
        return PieceOf(Layout::kRows, model.tensors[i].shape, rank, world)
            .region;
      },
      "fsdp 4 -> rows 2"));

  // The optimizer state is stored sharded exactly like its parameter.
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir.path()));
  auto chunk_regions = [&](const std::string& name) {
    std::vector<std::string> out;
    const format::EntryRecord* e = reader->Find(name);
    if (e == nullptr) return out;
    for (const auto& c : e->chunks) out.push_back(RegionToString(c.region));
    std::sort(out.begin(), out.end());
    return out;
  };
  for (const FsdpParam& p : ps) {
    std::vector<std::string> regions = chunk_regions(p.name);
    EXPECT_FALSE(regions.empty()) << p.name;
    EXPECT_EQ(chunk_regions("optimizer.exp_avg." + p.name), regions) << p.name;
    EXPECT_EQ(chunk_regions("optimizer.exp_avg_sq." + p.name), regions)
        << p.name;
  }

  // docs/FAILURE-MODES.md §5: state described by its local size (64) cannot
  // be loaded on another world size. Optimizer state is stored under its
  // parameter's global shape (128), so a trainer that asks for its local
  // flat size instead is told which entry and both shapes, before any I/O.
  const std::string name = "optimizer.exp_avg.layers.0.mlp.up.b";
  ASSERT_NE(reader->Find(name), nullptr);
  EXPECT_EQ(reader->Find(name)->shape, (Shape{128}));
  std::string buf(64 * 4, '\0');
  LoadOptions subset;
  subset.allow_unrequested = true;
  EXPECT_THAT(
      reader->Load(
          {{name, DType::kFloat32, {64}, FlatRange{0, 64}, buf.data()}},
          subset),
      StatusIs(absl::StatusCode::kInvalidArgument,
               name + ": global shape [128] in checkpoint, [64] requested"));
  // The same request with the global shape loads the first half exactly.
  CKPT_ASSERT_OK(reader->Load(
      {{name, DType::kFloat32, {128}, FlatRange{0, 64}, buf.data()}}, subset));
  const Tensor& t = model.tensors[4 * 3 + 1];
  ASSERT_EQ(t.name, name);
  EXPECT_EQ(buf, Extract(t.global, t.dtype, t.shape, FlatRange{0, 64}));
}

// ---------------------------------------------------------------------------
// 3. Tensor parallel x data parallel: replicas de-duplicated, writes balanced.

constexpr int kTp = 4, kDp = 2;

enum class TpSplit { kRows, kCols, kReplicated };

// Column-parallel weights split dim 0, row-parallel ones the last dim, norms
// are replicated on every rank; all splits are even (as tensor-parallel
// layers require).
Model TpModel(std::vector<TpSplit>* splits) {
  const uint64_t h = 32;
  Model m;
  auto add = [&](const std::string& name, Shape shape, TpSplit s) {
    m.Add(name, DType::kFloat32, shape);
    splits->push_back(s);
  };
  add("embed.w", {64, h}, TpSplit::kRows);  // vocab-parallel
  for (int l = 0; l < 4; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "attn_norm.w", {h}, TpSplit::kReplicated);
    add(p + "attn.qkv.w", {3 * h, h}, TpSplit::kRows);
    add(p + "attn.out.w", {h, h}, TpSplit::kCols);
    add(p + "mlp_norm.w", {h}, TpSplit::kReplicated);
    add(p + "mlp.up.w", {4 * h, h}, TpSplit::kRows);
    add(p + "mlp.down.w", {h, 4 * h}, TpSplit::kCols);
  }
  add("final_norm.w", {h}, TpSplit::kReplicated);
  return m;
}

// Rank = dp * kTp + tp. Every DP copy is registered as a replica.
Piece TpPiece(TpSplit split, const Shape& shape, int rank) {
  const int tp = rank % kTp;
  Box b = FullBox(shape);
  if (split != TpSplit::kReplicated) {
    const size_t d = split == TpSplit::kRows ? 0 : shape.size() - 1;
    b.size[d] = shape[d] / kTp;
    b.offset[d] = b.size[d] * tp;
  }
  return Piece{b, true};
}

TEST(MultiRankTest,
     TensorTimesDataParallelWritesEachReplicaOnceAndBalancesWrites) {
  std::vector<TpSplit> splits;
  Model model = TpModel(&splits);
  const int world = kTp * kDp;
  model.objects = RngObjects(world);
  TempDir dir;
  auto results = SaveOnRanks(
      dir.path(), 1, model, world,
      [&](size_t i, int rank, int) -> std::optional<Piece> {
        return TpPiece(splits[i], model.tensors[i].shape, rank);
      },
      RngPerRank(), SaveOptions{});
  for (int r = 0; r < world; ++r)
    ASSERT_THAT(results[r], IsOk()) << "rank " << r;

  uint64_t unique = 0, largest_chunk = 0;
  for (size_t i = 0; i < model.tensors.size(); ++i) {
    const Tensor& t = model.tensors[i];
    unique += t.bytes();
    largest_chunk = std::max(largest_chunk, splits[i] == TpSplit::kReplicated
                                                ? t.bytes()
                                                : t.bytes() / kTp);
  }
  for (const auto& [name, bytes] : model.objects) unique += bytes.size();
  // Every rank reports the same totals; each unique byte is stored once
  // (without de-duplication it would be kDp times as many).
  uint64_t sum_local = 0, max_local = 0, min_local = UINT64_MAX;
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(results[r]->stored_bytes, unique) << "rank " << r;
    EXPECT_EQ(results[r]->logical_bytes, unique) << "rank " << r;
    sum_local += results[r]->local_stored_bytes;
    max_local = std::max(max_local, results[r]->local_stored_bytes);
    min_local = std::min(min_local, results[r]->local_stored_bytes);
  }
  EXPECT_EQ(sum_local, unique);
  // Balance. The two DP copies of a TP shard are its only candidates and
  // every DP pair holds the same set of chunks (per pair: 4096 B x 8,
  // 3072 B x 4, 2048 B, 1024 B x 4), which largest-first greedy splits
  // evenly (25600 B each); the 9 norms (128 B, held by all 8 ranks) then go
  // one per rank and the 9th to one of them. Every rank also writes its own
  // 19-byte rng object. All chunk sizes are multiples of 128 B, so no
  // assignment can do better than ranks differing by one norm. Without
  // de-duplication or balancing ("first holder writes"), the DP-0 ranks
  // would write everything: 2x the mean.
  const uint64_t norm_bytes = 32 * 4;
  const double mean = static_cast<double>(unique) / world;
  EXPECT_LE(max_local - min_local, norm_bytes)
      << "max " << max_local << ", min " << min_local << ", mean " << mean;
  EXPECT_LE(max_local, mean + norm_bytes);
  EXPECT_LE(max_local, 1.5 * mean);
  EXPECT_GT(largest_chunk, norm_bytes);  // the bound above is not vacuous

  // The manifest holds one chunk per TP shard: no replica twice.
  {
    CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir.path()));
    for (size_t i = 0; i < model.tensors.size(); ++i) {
      const format::EntryRecord* e = reader->Find(model.tensors[i].name);
      ASSERT_NE(e, nullptr) << model.tensors[i].name;
      EXPECT_EQ(e->chunks.size(),
                splits[i] == TpSplit::kReplicated ? 1u : size_t{kTp})
          << model.tensors[i].name;
    }
  }

  for (int load_world : {2, 6}) {
    CKPT_EXPECT_OK(LoadOnRanks(
        dir.path(), model, load_world,
        [&](size_t i, int rank, int w) {
          return PieceOf(MixedLayout(i, 1), model.tensors[i].shape, rank, w)
              .region;
        },
        absl::StrCat("tp4xdp2 -> ", load_world)));
  }
}

// ---------------------------------------------------------------------------
// 4. A fault on one rank: nothing committed, the earlier step intact.

Model SmallSharded() {
  Model m;
  m.Add("w", DType::kFloat32, {64, 32});
  m.Add("b", DType::kBFloat16, {32});
  m.Add("norm", DType::kFloat32, {32});
  return m;
}

std::optional<Piece> SmallShardedPiece(size_t i, int rank, int world) {
  static constexpr Layout kLayouts[] = {Layout::kRows, Layout::kFlatUneven,
                                        Layout::kReplicated};
  return PieceOf(kLayouts[i], i == 0 ? Shape{64, 32} : Shape{32}, rank, world);
}

// Saves step 1 on 4 ranks, then step 2 with rank 2's storage failing the
// first call of `op` on its shard file: every rank must return the same
// error naming rank 2 and the file, and the root must look as before.
void ExpectFaultOnRankTwoCommitsNothing(StorageOp op, int64_t nth,
                                        absl::Status fault,
                                        const std::string& syscall) {
  constexpr int kWorld = 4;
  Model model = SmallSharded();
  model.objects = RngObjects(kWorld);
  TempDir dir;
  auto first = SaveOnRanks(dir.path(), 1, model, kWorld, SmallShardedPiece,
                           RngPerRank(), {});
  ASSERT_EQ(CountOk(first), kWorld) << first[0].status();
  const std::vector<std::string> before = Names(dir.path());
  ASSERT_EQ(before, (std::vector<std::string>{"latest", "step-00000001"}));

  std::vector<std::unique_ptr<FaultInjectingStorage>> owned;
  std::vector<Storage*> storages;
  for (int r = 0; r < kWorld; ++r) {
    owned.push_back(std::make_unique<FaultInjectingStorage>(DefaultStorage()));
    storages.push_back(owned.back().get());
  }
  owned[2]->OnlyPathsContaining("shard-00002.ckpt");
  owned[2]->FailAt(op, nth, fault);
  // Step 2 holds other values, so a load of step 1 that read step 2's bytes
  // would fail.
  Model changed = model;
  for (Tensor& t : changed.tensors) t.global[0] ^= 0x5A;
  auto results = SaveOnRanks(dir.path(), 2, changed, kWorld, SmallShardedPiece,
                             RngPerRank(), {}, storages);
  EXPECT_EQ(owned[2]->injected(), 1);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_THAT(results[r],
                StatusIs(fault.code(), "rank 2: injected fault: " + syscall))
        << "rank " << r;
    EXPECT_THAT(std::string(results[r].status().message()),
                HasSubstr("shard-00002.ckpt"))
        << "rank " << r;
    EXPECT_EQ(results[r].status(), results[0].status()) << "rank " << r;
  }
  // No step-00000002, no temporary directory, `latest` unchanged.
  EXPECT_EQ(Names(dir.path()), before);
  CKPT_ASSERT_OK_AND_ASSIGN(std::string latest,
                            DefaultStorage()->ReadFile(dir / "latest"));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string latest_dir,
                            format::DecodeLatest(latest));
  EXPECT_EQ(latest_dir, "step-00000001");
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir.path()));
  EXPECT_EQ(reader->manifest().info.step, 1u);
  CKPT_EXPECT_OK(LoadOnRanks(
      dir.path(), model, 3,
      [&](size_t i, int rank, int world) {
        return PieceOf(Layout::kCols, model.tensors[i].shape, rank, world)
            .region;
      },
      "step 1 after the failed step 2"));
}

TEST(MultiRankTest, ShardWriteFailureOnOneRankCommitsNothing) {
  // The 2nd write is payload (the 1st is the shard header).
  ExpectFaultOnRankTwoCommitsNothing(
      StorageOp::kWrite, 2,
      absl::ResourceExhaustedError("No space left on device"), "pwrite ");
}

TEST(MultiRankTest, ShardFsyncFailureOnOneRankCommitsNothing) {
  ExpectFaultOnRankTwoCommitsNothing(
      StorageOp::kSync, 1, absl::InternalError("Input/output error"), "fsync ");
}

TEST(MultiRankTest, ShardCloseFailureOnOneRankCommitsNothing) {
  ExpectFaultOnRankTwoCommitsNothing(StorageOp::kClose, 1,
                                     absl::InternalError("Input/output error"),
                                     "close ");
}

TEST(MultiRankTest, ShardOpenFailureOnOneRankCommitsNothing) {
  ExpectFaultOnRankTwoCommitsNothing(
      StorageOp::kOpen, 1, absl::PermissionDeniedError("Permission denied"),
      "open ");
}

// ---------------------------------------------------------------------------
// 5. Registrations that disagree between ranks.

// Runs a save on 4 ranks where rank r registers what `reg(writer, r)` does;
// every rank must fail with InvalidArgument and the same message containing
// every one of `substrs`, and the root must stay empty.
void ExpectEveryRankRejects(
    const std::function<absl::Status(Writer&, int)>& reg,
    const std::vector<std::string>& substrs) {
  constexpr int kWorld = 4;
  TempDir dir;
  InProcessWorld w(kWorld);
  std::vector<absl::Status> results(kWorld);
  (void)RunRanks(w, [&](Communicator& comm) -> absl::Status {
    results[comm.rank()] = [&]() -> absl::Status {
      Writer::Options wo;
      wo.comm = &comm;
      CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
      CKPT_RETURN_IF_ERROR(reg(*writer, comm.rank()));
      return writer->Save(dir.path(), 1, {}).status();
    }();
    return results[comm.rank()];
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kInvalidArgument)
        << "rank " << r << ": " << results[r];
    for (const std::string& s : substrs) {
      EXPECT_THAT(std::string(results[r].message()), HasSubstr(s))
          << "rank " << r;
    }
    EXPECT_EQ(results[r], results[0]) << "rank " << r;
  }
  EXPECT_TRUE(Names(dir.path()).empty());
}

// Rows [4r, 4r + 4) of a [16, 8] float32 tensor "x" (data is not read).
const float kZeros[16 * 8] = {};
Box RowsOf(int rank) { return Box{{4u * rank, 0}, {4, 8}}; }

TEST(MultiRankTest, DtypeDifferingOnOneRankIsRejectedOnEveryRank) {
  ExpectEveryRankRejects(
      [](Writer& w, int r) {
        return w.AddTensor("x", r == 3 ? DType::kBFloat16 : DType::kFloat32,
                           {16, 8}, RowsOf(r), kZeros);
      },
      {"entry 'x'", "dtype", "rank 0 has float32", "rank 3 has bfloat16"});
}

TEST(MultiRankTest, GlobalShapeDifferingOnOneRankIsRejectedOnEveryRank) {
  ExpectEveryRankRejects(
      [](Writer& w, int r) {
        return w.AddTensor("x", DType::kFloat32,
                           r == 1 ? Shape{17, 8} : Shape{16, 8}, RowsOf(r),
                           kZeros);
      },
      {"entry 'x'", "global shape", "rank 0 has [16, 8]",
       "rank 1 has [17, 8]"});
}

TEST(MultiRankTest, OverlappingNonReplicaPiecesAreRejectedOnEveryRank) {
  // Rank 2 holds rows [7, 12) instead of [8, 12): row 7 is also rank 1's.
  ExpectEveryRankRejects(
      [](Writer& w, int r) {
        Box b = r == 2 ? Box{{7, 0}, {5, 8}} : RowsOf(r);
        return w.AddTensor("x", DType::kFloat32, {16, 8}, b, kZeros);
      },
      {"entry 'x'", "overlap", "[7:8, 0:8]", "on rank 1", "on rank 2"});
}

TEST(MultiRankTest,
     SamePieceOnTwoRanksWithoutReplicaFlagIsRejectedOnEveryRank) {
  // Ranks 1 and 3 both hold rows [4, 8), neither as a replica; nobody holds
  // rows [12, 16).
  ExpectEveryRankRejects(
      [](Writer& w, int r) {
        return w.AddTensor("x", DType::kFloat32, {16, 8},
                           RowsOf(r == 3 ? 1 : r), kZeros);
      },
      {"entry 'x'", "ranks 1, 3", "[4:8, 0:8]", "replica"});
}

TEST(MultiRankTest, GapInNonPartialTensorIsRejectedOnEveryRank) {
  // Rank 2 holds rows [8, 11) instead of [8, 12).
  ExpectEveryRankRejects(
      [](Writer& w, int r) {
        Box b = r == 2 ? Box{{8, 0}, {3, 8}} : RowsOf(r);
        return w.AddTensor("x", DType::kFloat32, {16, 8}, b, kZeros);
      },
      {"entry 'x'", "not covered", "[11:12, 0:8]", "on rank 2"});
}

TEST(MultiRankTest, SameObjectNameOnTwoRanksIsRejectedOnEveryRank) {
  ExpectEveryRankRejects(
      [](Writer& w, int r) -> absl::Status {
        CKPT_RETURN_IF_ERROR(
            w.AddTensor("x", DType::kFloat32, {16, 8}, RowsOf(r), kZeros));
        if (r == 1 || r == 3)
          return w.SetObject("rng", "state-" + std::to_string(r));
        return absl::OkStatus();
      },
      {"object 'rng'", "ranks 1, 3"});
}

// ---------------------------------------------------------------------------
// 6. Entries held by some ranks only; a rank that holds nothing.

TEST(MultiRankTest, ObjectsAndTensorsOnSomeRanksAndARankWithNothing) {
  constexpr int kWorld = 4;
  Model model;
  model.Add("shared.w", DType::kFloat32, {12, 6});         // rows on ranks 0..2
  model.Add("only_on_1.w", DType::kBFloat16, {5, 7});      // whole, rank 1 only
  model.objects = {{"dataloader", "shard=7;offset=4096"},  // rank 2 only
                   {"rng.rank0", "r0"},
                   {"rng.rank1", "r1"},
                   {"rng.rank2", "r2"}};
  TempDir dir;
  auto results = SaveOnRanks(
      dir.path(), 3, model, kWorld,
      [&](size_t i, int rank, int) -> std::optional<Piece> {
        if (rank == 3) return std::nullopt;  // rank 3 registers nothing at all
        if (i == 0)
          return PieceOf(Layout::kRows, model.tensors[0].shape, rank, 3);
        if (rank == 1) return Piece{FullBox(model.tensors[1].shape), false};
        return std::nullopt;
      },
      [&](int rank) {
        Objects o;
        if (rank == 3) return o;
        o["rng.rank" + std::to_string(rank)] =
            model.objects.at("rng.rank" + std::to_string(rank));
        if (rank == 2) o["dataloader"] = model.objects.at("dataloader");
        return o;
      },
      SaveOptions{});
  for (int r = 0; r < kWorld; ++r)
    ASSERT_THAT(results[r], IsOk()) << "rank " << r;
  EXPECT_EQ(results[3]->local_stored_bytes, 0u);
  EXPECT_GT(results[1]->local_stored_bytes, model.tensors[1].bytes());
  {
    CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir.path()));
    EXPECT_EQ(reader->manifest().info.world_size, 4u);
    EXPECT_EQ(reader->manifest().entries.size(), 6u);
    CKPT_ASSERT_OK_AND_ASSIGN(std::string dl, reader->ReadObject("dataloader"));
    EXPECT_EQ(dl, "shard=7;offset=4096");
  }
  for (int load_world : {1, 3, 4}) {
    CKPT_EXPECT_OK(LoadOnRanks(
        dir.path(), model, load_world,
        [&](size_t i, int rank, int w) {
          return PieceOf(i == 0 ? Layout::kCols : Layout::kFlatUneven,
                         model.tensors[i].shape, rank, w)
              .region;
        },
        absl::StrCat("loaded on ", load_world)));
  }
}

// Regression: an object's bytes short enough for std::string's inline
// buffer (<= 15 bytes: a step counter, a small RNG seed) must survive
// registrations made after it on the same rank.
TEST(MultiRankTest,
     ShortObjectsKeepTheirBytesWhenMoreEntriesAreRegisteredAfterThem) {
  constexpr int kWorld = 4;
  Model model;
  model.Add("w", DType::kFloat32, {8, 4});
  model.objects = {{"step", "1234"}};
  for (int r = 0; r < kWorld; ++r)
    model.objects["rng.rank" + std::to_string(r)] = "seed" + std::to_string(r);
  TempDir dir;
  InProcessWorld w(kWorld);
  std::vector<std::string> bufs(kWorld);
  CKPT_ASSERT_OK(RunRanks(w, [&](Communicator& comm) -> absl::Status {
    const int rank = comm.rank();
    Writer::Options wo;
    wo.comm = &comm;
    CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
    // Objects first, then a tensor and more objects: the writer's table of
    // registrations grows after the short objects are in it.
    if (rank == 0) CKPT_RETURN_IF_ERROR(writer->SetObject("step", "1234"));
    const std::string rng = "rng.rank" + std::to_string(rank);
    CKPT_RETURN_IF_ERROR(writer->SetObject(rng, model.objects.at(rng)));
    const Tensor& t = model.tensors[0];
    Piece p = PieceOf(Layout::kRows, t.shape, rank, kWorld);
    bufs[rank] = Extract(t.global, t.dtype, t.shape, p.region);
    CKPT_RETURN_IF_ERROR(writer->AddTensor(t.name, t.dtype, t.shape, p.region,
                                           bufs[rank].data()));
    for (int k = 0; k < 8; ++k) {
      CKPT_RETURN_IF_ERROR(
          writer->SetObject(absl::StrCat("scratch.", rank, ".", k), "x"));
      CKPT_RETURN_IF_ERROR(
          writer->Remove(absl::StrCat("scratch.", rank, ".", k)));
    }
    CKPT_RETURN_IF_ERROR(writer->AddTensor(
        absl::StrCat("late.", rank), DType::kUInt8, {1}, FlatRange{0, 1}, "L"));
    return writer->Save(dir.path(), 1, {}).status();
  }));
  for (int r = 0; r < kWorld; ++r) {
    model.Add(absl::StrCat("late.", r), DType::kUInt8, {1});
    model.tensors.back().global = "L";
  }
  CKPT_EXPECT_OK(LoadOnRanks(
      dir.path(), model, 2,
      [&](size_t i, int rank, int world) {
        return PieceOf(Layout::kFlatUneven, model.tensors[i].shape, rank, world)
            .region;
      },
      "short objects"));
}

// Regression: removing an entry registered before two objects must not
// make one object's bytes come from the other.
TEST(MultiRankTest, ObjectsKeepTheirBytesWhenAnEarlierEntryIsRemoved) {
  constexpr int kWorld = 2;
  Model model;
  model.objects = {{"a.rank0", "a0"},
                   {"b.rank0", "b0"},
                   {"a.rank1", "a1"},
                   {"b.rank1", "b1"}};
  TempDir dir;
  InProcessWorld w(kWorld);
  CKPT_ASSERT_OK(RunRanks(w, [&](Communicator& comm) -> absl::Status {
    const std::string r = std::to_string(comm.rank());
    Writer::Options wo;
    wo.comm = &comm;
    CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
    CKPT_RETURN_IF_ERROR(writer->SetObject("scratch.rank" + r, "gone"));
    CKPT_RETURN_IF_ERROR(writer->SetObject("a.rank" + r, "a" + r));
    CKPT_RETURN_IF_ERROR(writer->SetObject("b.rank" + r, "b" + r));
    CKPT_RETURN_IF_ERROR(writer->Remove("scratch.rank" + r));
    return writer->Save(dir.path(), 1, {}).status();
  }));
  CKPT_EXPECT_OK(LoadOnRanks(
      dir.path(), model, 1,
      [](size_t, int, int) {
        return Region(FlatRange{0, 0});
      },
      "objects after Remove"));
}

}  // namespace
}  // namespace ckpt

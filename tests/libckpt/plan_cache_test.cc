// The constant-structure plan cache (docs/FAILURE-MODES.md §4): a cached plan
// is reused only when every rank's structure is unchanged, and a save never
// drops data, whatever changes between saves.
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_format.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/plan_record.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "ckpt/reader.h"
#include "ckpt/writer.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::Extract;
using ::ckpt::testing::kAllLayouts;
using ::ckpt::testing::Layout;
using ::ckpt::testing::LayoutName;
using ::ckpt::testing::PieceOf;
using ::ckpt::testing::ReferenceBytes;
using ::ckpt::testing::TempDir;

// What the job registers at one save: tensors (with a layout over the
// ranks) and objects (each on one rank).
struct TensorSpec {
  DType dtype = DType::kFloat32;
  Shape shape;
  Layout layout = Layout::kRows;
  uint64_t seed = 0;             // values; not structure
  std::set<int> replica_absent;  // ranks that hold no replica (replicated only)
};
struct ObjectSpec {
  int rank = 0;
  std::string bytes;  // size is not structure
};
struct State {
  std::map<std::string, TensorSpec> tensors;
  std::map<std::string, ObjectSpec> objects;
};

// Structure as the cache must see it (values and object sizes excluded).
std::string Signature(const State& s, int world) {
  std::string out = absl::StrCat("world=", world, ";");
  for (const auto& [n, t] : s.tensors) {
    absl::StrAppend(&out, n, ":", DTypeName(t.dtype), ShapeToString(t.shape),
                    LayoutName(t.layout), "/");
    for (int r : t.replica_absent) absl::StrAppend(&out, r, ",");
    out += ";";
  }
  for (const auto& [n, o] : s.objects)
    absl::StrAppend(&out, n, "@", o.rank, ";");
  return out;
}

std::string Global(const TensorSpec& t) {
  return ReferenceBytes(t.dtype, t.shape, t.seed);
}

// Registers rank `rank`'s part of `s`; `bufs` keeps the pieces alive.
absl::Status Register(Writer& w, const State& s, int rank, int world,
                      std::vector<std::string>* bufs) {
  w.Clear();
  bufs->clear();
  bufs->reserve(s.tensors.size());
  for (const auto& [name, t] : s.tensors) {
    if (t.replica_absent.count(rank)) continue;
    auto piece = PieceOf(t.layout, t.shape, rank, world);
    bufs->push_back(Extract(Global(t), t.dtype, t.shape, piece.region));
    TensorOptions o;
    o.replica = piece.replica;
    CKPT_RETURN_IF_ERROR(w.AddTensor(name, t.dtype, t.shape, piece.region,
                                     bufs->back().data(), o));
  }
  for (const auto& [name, o] : s.objects) {
    if (o.rank == rank) CKPT_RETURN_IF_ERROR(w.SetObject(name, o.bytes));
  }
  return absl::OkStatus();
}

// Loads checkpoint `dir` whole, in one process, requesting exactly the
// entries of `s` (strict: a missing or an extra entry fails), and compares.
absl::Status LoadsExactly(const std::string& dir, const State& s) {
  CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(dir));
  std::vector<LoadRequest> reqs;
  std::vector<std::string> got(s.tensors.size() + s.objects.size());
  size_t i = 0;
  for (const auto& [name, t] : s.tensors) {
    got[i].resize(Global(t).size());
    reqs.push_back({name, t.dtype, t.shape, FullBox(t.shape), got[i].data()});
    ++i;
  }
  for (const auto& [name, o] : s.objects) {
    LoadRequest r;
    r.name = name;
    r.object = &got[i++];
    reqs.push_back(std::move(r));
  }
  CKPT_RETURN_IF_ERROR(reader->Load(reqs).status());
  i = 0;
  for (const auto& [name, t] : s.tensors) {
    if (got[i++] != Global(t))
      return absl::DataLossError(absl::StrCat(dir, ": ", name, " differs"));
  }
  for (const auto& [name, o] : s.objects) {
    if (got[i++] != o.bytes)
      return absl::DataLossError(absl::StrCat(dir, ": ", name, " differs"));
  }
  return absl::OkStatus();
}

// Runs saves of `states` (one per step, from `first_step`) on `world`
// in-process ranks, each rank keeping one Writer for all of them (a job
// that does not restart). Returns plan_cache_hit of each save.
absl::StatusOr<std::vector<bool>> RunJob(const std::string& root, int world,
                                         const std::vector<State>& states,
                                         uint64_t first_step,
                                         const SaveOptions& so = {}) {
  InProcessWorld w(world);
  std::vector<std::vector<bool>> hits(world);
  CKPT_RETURN_IF_ERROR(RunRanks(w, [&](Communicator& comm) -> absl::Status {
    Writer::Options wo;
    wo.comm = &comm;
    CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
    std::vector<std::string> bufs;
    for (size_t k = 0; k < states.size(); ++k) {
      CKPT_RETURN_IF_ERROR(
          Register(*writer, states[k], comm.rank(), world, &bufs));
      CKPT_ASSIGN_OR_RETURN(SaveResult r,
                            writer->Save(root, first_step + k, so));
      hits[comm.rank()].push_back(r.plan_cache_hit);
    }
    return absl::OkStatus();
  }));
  for (int r = 1; r < world; ++r) {
    if (hits[r] != hits[0])
      return absl::InternalError("ranks disagree on plan_cache_hit");
  }
  return hits[0];
}

State BaseModel() {
  State s;
  s.tensors["emb"] = {DType::kBFloat16, {16, 8}, Layout::kRows, 1, {}};
  s.tensors["layers.0.w"] = {DType::kFloat32, {8, 12}, Layout::kCols, 2, {}};
  s.tensors["layers.0.norm"] = {
      DType::kFloat32, {8}, Layout::kReplicated, 3, {}};
  s.tensors["optimizer.exp_avg.emb"] = {
      DType::kFloat32, {16, 8}, Layout::kFlatUneven, 4, {}};
  s.objects["step"] = {0, "step-1"};
  return s;
}

std::string StepDir(const std::string& root, uint64_t step) {
  return root + "/" + absl::StrFormat("step-%08d", step);
}

TEST(PlanCache, plan_cache_hit_when_structure_unchanged_and_values_change) {
  TempDir dir;
  std::vector<State> states(3, BaseModel());
  states[1].tensors["emb"].seed = 11;  // new values, same structure
  states[2].tensors["emb"].seed = 12;
  states[2].objects["step"].bytes =
      "a longer step record";  // object size is not structure
  CKPT_ASSERT_OK_AND_ASSIGN(auto hits, RunJob(dir.path(), 3, states, 1));
  EXPECT_EQ(hits, (std::vector<bool>{false, true, true}));
  for (int k = 0; k < 3; ++k)
    CKPT_EXPECT_OK(LoadsExactly(StepDir(dir.path(), k + 1), states[k]));
}

// The failure of docs/FAILURE-MODES.md §4: a component saves nothing in
// steady state and a record only after a fault. The record must be saved.
TEST(PlanCache, plan_cache_object_added_after_cached_plan) {
  for (int world : {1, 4}) {
    TempDir dir;
    std::vector<State> states(4, BaseModel());
    states[3].objects["fault_state.rank" + std::to_string(world - 1)] = {
        world - 1, "fault!"};
    CKPT_ASSERT_OK_AND_ASSIGN(auto hits, RunJob(dir.path(), world, states, 1));
    EXPECT_EQ(hits, (std::vector<bool>{false, true, true, false}))
        << "world " << world;
    CKPT_ASSERT_OK(LoadsExactly(StepDir(dir.path(), 4), states[3]));
    CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir.path()));
    EXPECT_EQ(reader->ReadObject("fault_state.rank" + std::to_string(world - 1))
                  .value(),
              "fault!");
  }
}

TEST(PlanCache, plan_cache_change_on_one_rank_only_replans) {
  // Rank 2 was assigned to write a replica and then stops holding it: a
  // stale plan would make it write nothing (or the wrong item).
  TempDir dir;
  State a;
  for (int i = 0; i < 6; ++i) {
    a.tensors["rep." + std::to_string(i)] = {
        DType::kFloat32, {64}, Layout::kReplicated, uint64_t(10 + i), {}};
  }
  State b = a;
  for (int i = 0; i < 6; ++i)
    b.tensors["rep." + std::to_string(i)].replica_absent = {2};
  State c = b;
  c.objects["only.rank1"] = {1, "x"};
  CKPT_ASSERT_OK_AND_ASSIGN(auto hits,
                            RunJob(dir.path(), 4, {a, a, b, b, c}, 1));
  EXPECT_EQ(hits, (std::vector<bool>{false, true, false, true, false}));
  for (int k = 0; k < 5; ++k) {
    CKPT_EXPECT_OK(LoadsExactly(StepDir(dir.path(), k + 1),
                                std::vector<State>{a, a, b, b, c}[k]));
  }
}

TEST(PlanCache, plan_cache_each_structure_change_replans) {
  State base = BaseModel();
  std::vector<std::pair<std::string, State>> changes;
  {
    State s = base;
    s.tensors["new.tensor"] = {DType::kInt64, {5, 3}, Layout::kGrid, 7, {}};
    changes.push_back({"entry added", s});
  }
  {
    State s = base;
    s.tensors.erase("layers.0.w");
    changes.push_back({"entry removed", s});
  }
  {
    State s = base;
    s.tensors["emb"].shape = {20, 8};
    changes.push_back({"shape", s});
  }
  {
    State s = base;
    s.tensors["emb"].dtype = DType::kFloat16;
    changes.push_back({"dtype", s});
  }
  {
    State s = base;
    s.tensors["emb"].layout = Layout::kCols;
    changes.push_back({"chunks", s});
  }
  {
    State s = base;
    s.objects.erase("step");
    changes.push_back({"object removed", s});
  }
  {
    State s = base;
    s.objects["step"].rank = 1;
    changes.push_back({"object moved to another rank", s});
  }
  for (const auto& [what, changed] : changes) {
    TempDir dir;
    CKPT_ASSERT_OK_AND_ASSIGN(
        auto hits, RunJob(dir.path(), 2, {base, base, changed, changed}, 1));
    EXPECT_EQ(hits, (std::vector<bool>{false, true, false, true})) << what;
    CKPT_EXPECT_OK(LoadsExactly(StepDir(dir.path(), 3), changed)) << what;
    CKPT_EXPECT_OK(LoadsExactly(StepDir(dir.path(), 4), changed)) << what;
  }
}

TEST(PlanCache, plan_cache_restarted_job_reuses_recorded_plan) {
  TempDir dir;
  State s = BaseModel();
  CKPT_ASSERT_OK_AND_ASSIGN(auto first, RunJob(dir.path(), 3, {s}, 1));
  EXPECT_EQ(first, std::vector<bool>{false});
  // A new job (new writers, no plan in memory), same structure: the plan
  // recorded in the manifest is reused on its first save.
  s.tensors["emb"].seed = 99;
  CKPT_ASSERT_OK_AND_ASSIGN(auto second, RunJob(dir.path(), 3, {s, s}, 2));
  EXPECT_EQ(second, (std::vector<bool>{true, true}));
  CKPT_EXPECT_OK(LoadsExactly(StepDir(dir.path(), 2), s));
  // Opting out replans.
  SaveOptions so;
  so.reuse_recorded_plan = false;
  CKPT_ASSERT_OK_AND_ASSIGN(auto third, RunJob(dir.path(), 3, {s}, 4, so));
  EXPECT_EQ(third, std::vector<bool>{false});
}

TEST(PlanCache, plan_cache_restarted_job_with_other_world_size_replans) {
  TempDir dir;
  State s = BaseModel();
  CKPT_ASSERT_OK(RunJob(dir.path(), 4, {s}, 1).status());
  for (int world : {2, 3, 1}) {
    static uint64_t step = 2;
    CKPT_ASSERT_OK_AND_ASSIGN(auto hits,
                              RunJob(dir.path(), world, {s, s}, step));
    EXPECT_EQ(hits, (std::vector<bool>{false, true})) << world;
    CKPT_EXPECT_OK(LoadsExactly(StepDir(dir.path(), step), s));
    step += 2;
  }
}

TEST(PlanCache, plan_cache_restarted_job_with_changed_rank_replans) {
  TempDir dir;
  State s = BaseModel();
  CKPT_ASSERT_OK(RunJob(dir.path(), 3, {s}, 1).status());
  State t = s;
  t.tensors["layers.0.norm"].replica_absent = {1};  // only rank 1 differs
  CKPT_ASSERT_OK_AND_ASSIGN(auto hits, RunJob(dir.path(), 3, {t}, 2));
  EXPECT_EQ(hits, std::vector<bool>{false});
  CKPT_EXPECT_OK(LoadsExactly(StepDir(dir.path(), 2), t));
}

TEST(PlanCache, plan_cache_recorded_plan_that_does_not_fit_is_ignored) {
  TempDir dir;
  State s = BaseModel();
  CKPT_ASSERT_OK(RunJob(dir.path(), 2, {s}, 1).status());
  // Rewrite the manifest with a PLAN whose fingerprints match but whose
  // positions are out of range, then with an undecodable PLAN.
  const std::string manifest_path = StepDir(dir.path(), 1) + "/MANIFEST";
  for (int variant = 0; variant < 2; ++variant) {
    std::string bytes = ::ckpt::testing::ReadFileBytes(manifest_path);
    CKPT_ASSERT_OK_AND_ASSIGN(format::Manifest m,
                              format::DecodeManifest(bytes));
    CKPT_ASSERT_OK_AND_ASSIGN(format::PlanRecord rec,
                              format::DecodePlanRecord(m.plan));
    if (variant == 0) {
      for (auto& r : rec.ranks) r.writes.push_back(1000);
      m.plan = format::EncodePlanRecord(rec);
    } else {
      m.plan = "garbage";
    }
    std::ofstream(manifest_path, std::ios::binary | std::ios::trunc)
        << format::EncodeManifest(m);
    CKPT_ASSERT_OK_AND_ASSIGN(auto hits,
                              RunJob(dir.path(), 2, {s}, 2 + variant));
    EXPECT_EQ(hits, std::vector<bool>{false});
    CKPT_EXPECT_OK(LoadsExactly(StepDir(dir.path(), 2 + variant), s));
    // Point latest back at step 1 for the next variant.
    std::filesystem::remove_all(StepDir(dir.path(), 2 + variant));
    std::ofstream(dir / "latest", std::ios::trunc)
        << format::EncodeLatest("step-00000001");
  }
}

// Issue 28: a PLAN rewritten with valid fingerprints and checksums but with
// positions removed (or added) must not decide what the next save of a
// restarted job writes: it replans, writes every tensor and object, and
// records the fresh plan.
TEST(PlanCache, plan_cache_tampered_recorded_plan_replans) {
  TempDir dir;
  State s = BaseModel();
  CKPT_ASSERT_OK(RunJob(dir.path(), 3, {s}, 1).status());
  const std::string manifest_path = StepDir(dir.path(), 1) + "/MANIFEST";
  const std::string original = ::ckpt::testing::ReadFileBytes(manifest_path);
  CKPT_ASSERT_OK_AND_ASSIGN(format::Manifest m0,
                            format::DecodeManifest(original));
  CKPT_ASSERT_OK_AND_ASSIGN(format::PlanRecord fresh,
                            format::DecodePlanRecord(m0.plan));
  std::vector<std::pair<std::string, format::PlanRecord>> tampered;
  format::PlanRecord rec = fresh;
  for (auto& r : rec.ranks) r.writes.pop_back();
  tampered.push_back({"last position of every rank removed", rec});
  rec = fresh;
  rec.ranks[1].writes.clear();
  tampered.push_back({"every position of rank 1 removed", rec});
  rec = fresh;
  for (auto& r : rec.ranks) {
    r.writes.resize(4);  // every rank holds 4 tensors: replicas thrice
    for (uint32_t i = 0; i < 4; ++i) r.writes[i] = i;
  }
  tampered.push_back({"every replica written by every holder", rec});
  uint64_t step = 2;
  for (const auto& [what, bad] : tampered) {
    format::Manifest m = m0;
    m.plan = format::EncodePlanRecord(bad);
    std::ofstream(manifest_path, std::ios::binary | std::ios::trunc)
        << format::EncodeManifest(m);
    CKPT_ASSERT_OK_AND_ASSIGN(auto hits, RunJob(dir.path(), 3, {s}, step));
    EXPECT_EQ(hits, std::vector<bool>{false}) << what;
    CKPT_EXPECT_OK(LoadsExactly(StepDir(dir.path(), step), s)) << what;
    CKPT_ASSERT_OK_AND_ASSIGN(
        format::Manifest saved,
        format::DecodeManifest(::ckpt::testing::ReadFileBytes(
            StepDir(dir.path(), step) + "/MANIFEST")));
    EXPECT_EQ(saved.plan, m0.plan) << what;
    // Point latest back at step 1 for the next variant.
    std::filesystem::remove_all(StepDir(dir.path(), step));
    std::ofstream(dir / "latest", std::ios::trunc)
        << format::EncodeLatest("step-00000001");
    ++step;
  }
  // The untampered record is still reused.
  std::ofstream(manifest_path, std::ios::binary | std::ios::trunc) << original;
  CKPT_ASSERT_OK_AND_ASSIGN(auto hits, RunJob(dir.path(), 3, {s}, step));
  EXPECT_EQ(hits, std::vector<bool>{true});
  CKPT_EXPECT_OK(LoadsExactly(StepDir(dir.path(), step), s));
}

// The property: many saves with random structure changes, world size
// changes and restarts; every save loads back complete and exact, and an
// unchanged structure always hits.
TEST(PlanCache, plan_cache_property_random_structure_changes) {
  std::mt19937_64 rng(20261122);
  auto pick = [&](uint64_t n) { return static_cast<uint64_t>(rng() % n); };
  const DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kInt8,
                           DType::kFloat64, DType::kBool};
  TempDir dir;
  State s = BaseModel();
  uint64_t step = 1;
  int saves = 0, hits_seen = 0, misses_seen = 0;
  std::string last_signature;
  int world = 2;
  int fresh = 0;
  for (int epoch = 0; epoch < 10; ++epoch) {
    if (epoch > 0 && pick(2) == 0)
      world = 1 + pick(4);  // restart with another size
    std::vector<State> states;
    for (int k = 0; k < 6; ++k) {
      // 0-2 mutations; 0 keeps the structure (values always change).
      for (auto& [n, t] : s.tensors) t.seed = rng();
      int mutations = pick(3);
      for (int m = 0; m < mutations; ++m) {
        std::string name =
            s.tensors.empty()
                ? ""
                : std::next(s.tensors.begin(), pick(s.tensors.size()))->first;
        switch (pick(9)) {
          case 0: {  // add a tensor
            Shape shape;
            for (uint64_t d = 0, nd = 1 + pick(3); d < nd; ++d)
              shape.push_back(1 + pick(9));
            s.tensors["t" + std::to_string(fresh++)] = {
                kDTypes[pick(5)], shape, kAllLayouts[pick(6)], rng(), {}};
            break;
          }
          case 1:  // remove a tensor
            if (!name.empty()) s.tensors.erase(name);
            break;
          case 2:  // shape change
            if (!name.empty()) s.tensors[name].shape.back() += 1;
            break;
          case 3:  // dtype change
            if (!name.empty()) s.tensors[name].dtype = kDTypes[pick(5)];
            break;
          case 4:  // chunk change
            if (!name.empty()) s.tensors[name].layout = kAllLayouts[pick(6)];
            break;
          case 5:  // an object appears on one rank (a fault-state record)
            s.objects["fault." + std::to_string(fresh++)] = {
                static_cast<int>(pick(world)), std::string(pick(40), 'f')};
            break;
          case 6:  // an object disappears
            if (!s.objects.empty())
              s.objects.erase(
                  std::next(s.objects.begin(), pick(s.objects.size())));
            break;
          case 7:  // one rank drops its replica of a replicated tensor
            for (auto& [n, t] : s.tensors) {
              if (t.layout == Layout::kReplicated && world > 1 &&
                  static_cast<int>(t.replica_absent.size()) < world - 1) {
                t.replica_absent.insert(pick(world));
                if (static_cast<int>(t.replica_absent.size()) == world)
                  t.replica_absent.clear();
                break;
              }
            }
            break;
          case 8:  // object grows (not structure)
            if (!s.objects.empty())
              std::next(s.objects.begin(), pick(s.objects.size()))
                  ->second.bytes += "+";
            break;
        }
      }
      // Keep the state valid for this world: objects on existing ranks,
      // replica_absent within range.
      for (auto& [n, o] : s.objects) o.rank %= world;
      for (auto& [n, t] : s.tensors) {
        std::set<int> keep;
        for (int r : t.replica_absent)
          if (r < world) keep.insert(r);
        if (t.layout != Layout::kReplicated ||
            static_cast<int>(keep.size()) >= world)
          keep.clear();
        t.replica_absent = keep;
      }
      states.push_back(s);
    }
    CKPT_ASSERT_OK_AND_ASSIGN(auto hits,
                              RunJob(dir.path(), world, states, step));
    for (size_t k = 0; k < states.size(); ++k) {
      std::string sig = Signature(states[k], world);
      if (sig == last_signature) {
        EXPECT_TRUE(hits[k])
            << "unchanged structure missed the cache at step " << step + k;
      }
      last_signature = sig;
      hits_seen += hits[k];
      misses_seen += !hits[k];
      CKPT_ASSERT_OK(LoadsExactly(StepDir(dir.path(), step + k), states[k]))
          << "step " << step + k << " world " << world << " hit " << hits[k];
      ++saves;
    }
    step += states.size();
  }
  EXPECT_EQ(saves, 60);
  EXPECT_GT(hits_seen, 5);
  EXPECT_GT(misses_seen, 5);
}

}  // namespace
}  // namespace ckpt

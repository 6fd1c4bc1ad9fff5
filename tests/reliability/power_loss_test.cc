// Power loss at every storage call of a save (spec/FORMAT.md §4.1).
//
// Each scenario builds a root on a PowerLossStorage, counts the N storage
// calls of one more save, and then, for every n in 1..N+1, runs that save
// on a copy of the root with the machine halted at its nth call (N+1: the
// save completes), cuts the power and checks what the disk shows. Each cut
// is checked with every volatile directory operation dropped, with every
// prefix of them kept (a journaling file system may have committed them in
// order on its own) and with each one alone kept (POSIX does not order
// them); unsynced file bytes are always lost. After every cut:
//   - `latest` names a complete checkpoint that loads exactly: the save's
//     step or the one `latest` named before (none only if the root had no
//     checkpoint yet); the save's step if Save returned OK;
//   - every step-* directory holding a MANIFEST loads exactly;
//   - every checkpoint committed before the save that keep_last does not
//     make the save delete is still there, and loads exactly; and the
//     save's own checkpoint too if Save returned OK;
//   - if Save returned OK, what it pruned stays pruned (no step directory
//     comes back, not even without its MANIFEST);
//   - the root holds nothing but checkpoints, `latest` and .tmp-* entries,
//     and the next save into it succeeds and becomes `latest`.
// With several in-process ranks the order of the ranks' calls while they
// write their shards varies from run to run; N does not, and every order
// must pass.
#include "ckpt/testing/power_loss.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/in_process.h"
#include "gtest/gtest.h"
#include "reliability/model.h"
#include "testing/status_matchers.h"

namespace ckpt::reliability {
namespace {

using ::ckpt::testing::IsOk;

constexpr int kScale = 1;  // about 200 KiB per checkpoint
constexpr char kParent[] = "/data";
constexpr char kRoot[] = "/data/ck";

struct Scenario {
  int world = 1;
  std::vector<uint64_t> prior;  // steps saved (and synced) before
  uint64_t step = 0;            // the save that loses power
  int keep_last = 0;
  bool overwrite = false;  // step is one of `prior`
  // Also keep each prefix of the pending directory operations, and each
  // one alone.
  bool reordered_dir_ops = true;
};

SaveConfig Config(const Scenario& sc) {
  SaveConfig c;
  c.scale = kScale;
  c.keep_last = sc.keep_last;
  c.io_threads = 1;
  return c;
}

// Saves `step` with `world` in-process ranks through `disk`.
absl::Status SaveOn(PowerLossStorage* disk, int world, uint64_t step,
                    const SaveConfig& c, bool overwrite = false) {
  InProcessWorld w(world);
  return RunRanks(w, [&](Communicator& comm) -> absl::Status {
    CKPT_ASSIGN_OR_RETURN(auto state, RankState::Create(&comm, c.scale, disk));
    CKPT_RETURN_IF_ERROR(state->model.Fill(*state->writer, step));
    SaveOptions o = SaveOptionsFor(step, c);
    o.overwrite = overwrite;
    return state->writer->Save(kRoot, step, o).status();
  });
}

// The checkpoints committed before the save that it must not delete.
std::vector<uint64_t> MustSurvive(const Scenario& sc) {
  std::vector<uint64_t> keep = sc.prior;
  std::sort(keep.begin(), keep.end());
  keep.erase(std::remove(keep.begin(), keep.end(), sc.step), keep.end());
  if (sc.keep_last > 0) {
    // The save keeps the newest keep_last of prior + step: at least the
    // newest keep_last - 1 of prior.
    const size_t n = static_cast<size_t>(sc.keep_last - 1);
    if (keep.size() > n) keep.erase(keep.begin(), keep.end() - n);
  }
  return keep;
}

// Checks the root on `disk` after a power cut; `done`: the save returned OK.
void CheckAfterCut(PowerLossStorage* disk, const Scenario& sc, bool done) {
  auto listing = ListRoot(kRoot, disk);
  if (!listing.ok()) {
    EXPECT_TRUE(sc.prior.empty() && !done) << listing.status();
    return;
  }
  EXPECT_TRUE(listing->other.empty()) << absl::StrJoin(listing->other, ", ");
  for (uint64_t step : listing->committed) {
    auto got = VerifyCheckpoint(JoinPath(kRoot, format::StepDirName(step)),
                                kScale, disk);
    EXPECT_THAT(got, IsOk()) << "step " << step;
  }
  const std::vector<uint64_t>& c = listing->committed;
  std::vector<uint64_t> need = MustSurvive(sc);
  if (done || sc.overwrite) need.push_back(sc.step);  // the new one or the old
  for (uint64_t step : need) {
    EXPECT_NE(std::find(c.begin(), c.end(), step), c.end())
        << "step " << step << " is lost";
  }
  if (done && sc.keep_last > 0) {
    // What a save pruned stays pruned once it returned: neither the
    // checkpoint nor its directory comes back.
    EXPECT_LE(c.size() + listing->uncommitted.size(),
              static_cast<size_t>(sc.keep_last))
        << "pruned checkpoints came back: " << absl::StrJoin(c, ", ") << "; "
        << absl::StrJoin(listing->uncommitted, ", ");
  }
  if (!listing->has_latest) {
    EXPECT_TRUE(sc.prior.empty() && !done) << "latest is lost";
    return;
  }
  auto latest = VerifyCheckpoint(kRoot, kScale, disk);
  ASSERT_THAT(latest, IsOk()) << "latest";
  const uint64_t before =
      sc.prior.empty() ? 0
                       : *std::max_element(sc.prior.begin(), sc.prior.end());
  if (done) {
    EXPECT_EQ(*latest, std::max(before, sc.step));
  } else {
    EXPECT_TRUE(*latest == before || *latest == sc.step)
        << "latest is step " << *latest;
  }
}

// The save after a power loss succeeds and becomes latest.
void CheckNextSave(PowerLossStorage* disk, const Scenario& sc) {
  uint64_t next = sc.step + 1;
  for (uint64_t p : sc.prior) next = std::max(next, p + 1);
  ASSERT_THAT(SaveOn(disk, sc.world, next, Config(sc)), IsOk());
  auto latest = VerifyCheckpoint(kRoot, kScale, disk);
  ASSERT_THAT(latest, IsOk());
  EXPECT_EQ(*latest, next);
}

// `name` with the random part of a temporary's name ("-" and 16 hex
// digits) replaced by "-*".
std::string WithoutRandomPart(std::string name) {
  for (size_t i = 0; i + 17 <= name.size(); ++i) {
    if (name[i] == '-' &&
        std::all_of(name.begin() + i + 1, name.begin() + i + 17, [](char c) {
          return std::isxdigit(static_cast<unsigned char>(c));
        })) {
      name.replace(i + 1, 16, "*");
    }
  }
  return name;
}

// What a cut left on `disk`, up to what the checks can tell apart: every
// path (temporaries without their random part) with its size, and the
// bytes of `latest`. Files are written once and either keep all their
// bytes or lose the unsynced ones, which changes their size; the ids and
// times inside MANIFEST differ from run to run and are left out, so that
// two cuts that leave the same disk are checked once.
std::string DiskState(PowerLossStorage* disk, const std::string& dir = "/") {
  std::string out;
  auto names = disk->List(dir);
  if (!names.ok()) return out;
  for (const std::string& n : *names) {
    const std::string path = JoinPath(dir, n);
    auto st = disk->Stat(path);
    if (!st.ok()) continue;
    absl::StrAppend(&out, JoinPath(dir, WithoutRandomPart(n)),
                    st->is_dir ? "/" : " ", st->size, "\n");
    if (st->is_dir) out += DiskState(disk, path);
    if (n == format::kLatestFileName) out += disk->ReadFile(path).value_or("?");
  }
  return out;
}

// Runs the scenario and prints the number of storage calls, of power cuts
// and of the distinct disks they left (each checked once).
void PowerCutEverywhere(const Scenario& sc) {
  PowerLossStorage base;
  EXPECT_THAT(base.CreateDir(kParent), IsOk());
  EXPECT_THAT(base.SyncDir("/"), IsOk());
  const SaveConfig config = Config(sc);
  for (uint64_t p : sc.prior)
    EXPECT_THAT(SaveOn(&base, sc.world, p, config), IsOk());
  auto probe = base.Fork();
  EXPECT_THAT(SaveOn(probe.get(), sc.world, sc.step, config, sc.overwrite),
              IsOk());
  const int64_t calls = probe->calls();
  int64_t cuts = 0;
  std::set<std::string> checked;  // DiskState, and whether the save returned OK
  for (int64_t n = 1; n <= calls + 1 && !::testing::Test::HasFailure(); ++n) {
    auto disk = base.Fork();
    if (n <= calls) disk->HaltAtCall(n);
    const bool done =
        SaveOn(disk.get(), sc.world, sc.step, config, sc.overwrite).ok();
    if (n > calls) {
      EXPECT_TRUE(done) << "the save without a power cut failed";
    }
    const size_t pending = sc.reordered_dir_ops ? disk->pending_dir_ops() : 0;
    // Cut c <= pending keeps the first c pending directory operations; cut
    // pending + 1 + i keeps operation i alone.
    for (size_t c = 0; c <= 2 * pending && !::testing::Test::HasFailure();
         ++c) {
      SCOPED_TRACE(absl::StrCat("power cut at call ", n, " of ", calls,
                                " (save ", done ? "returned OK" : "failed",
                                "), keeping ",
                                c <= pending ? "the first " : "only number ",
                                c <= pending ? c : c - pending - 1, " of ",
                                pending, " pending directory operations"));
      auto after = disk->Fork();
      if (c <= pending) {
        after->PowerCut(c);
      } else {
        after->PowerCutKeepingOnly(c - pending - 1);
      }
      ++cuts;
      if (!checked.insert(absl::StrCat(done, DiskState(after.get()))).second)
        continue;
      CheckAfterCut(after.get(), sc, done);
      CheckNextSave(after.get(), sc);
    }
  }
  std::cout << "power cuts: " << cuts
            << ", distinct disks checked: " << checked.size() << " (save of "
            << calls << " storage calls, " << sc.world << " rank(s))\n";
}

TEST(PowerLossTest, FirstSaveIntoANewRoot) {
  Scenario sc;
  sc.step = 1;
  PowerCutEverywhere(sc);
}

TEST(PowerLossTest, SingleRankSaveReplacesLatest) {
  Scenario sc;
  sc.prior = {1, 2};
  sc.step = 3;
  PowerCutEverywhere(sc);
}

TEST(PowerLossTest, SingleRankSaveWithKeepLastPrunes) {
  Scenario sc;
  sc.prior = {1, 2, 3};
  sc.step = 4;
  sc.keep_last = 2;
  PowerCutEverywhere(sc);
}

TEST(PowerLossTest, MultiRankSave) {
  Scenario sc;
  sc.world = 3;
  sc.prior = {1};
  sc.step = 2;  // zstd
  PowerCutEverywhere(sc);
}

TEST(PowerLossTest, MultiRankSaveWithKeepLastPrunes) {
  Scenario sc;
  sc.world = 2;
  sc.prior = {1, 2};
  sc.step = 3;
  sc.keep_last = 1;
  PowerCutEverywhere(sc);
}

// Replacing the checkpoint `latest` names moves it aside and renames the
// new one in: two renames that the disk may keep one without the other, so
// only the page-cache model (every pending operation dropped) applies; see
// spec/FORMAT.md §4.1.
TEST(PowerLossTest, OverwriteOfTheLatestStep) {
  Scenario sc;
  sc.prior = {1, 2};
  sc.step = 2;
  sc.overwrite = true;
  sc.reordered_dir_ops = false;
  PowerCutEverywhere(sc);
}

}  // namespace
}  // namespace ckpt::reliability

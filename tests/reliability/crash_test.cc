// Crash consistency: a writer process (ckpt_crash_writer, four in-process
// ranks, a few MiB per save, zstd on even steps) is SIGKILLed at
// random moments while it saves; after every kill the root must be
// consistent (root_check.h), every step it reported saved must be at or
// below `latest`, and the next save must clean up the temporaries that the
// kill left behind.
//
// CKPT_CRASH_TRIALS (default 30, the CI run) sets the number of kills; 500
// is the long mode. The kill comes after a delay drawn uniformly from
// [0, 1.5 T), where T is the time the writer took, in this run, to start
// and complete two saves (so kills land in the start-up and in the first
// three saves whatever the machine's speed); CKPT_CRASH_MAX_MS replaces
// 1.5 T. CKPT_CRASH_SEED (default 1) seeds the delays; each trial's delay
// is printed on failure.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "ckpt/in_process.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "reliability/model.h"
#include "reliability/root_check.h"
#include "reliability/subprocess.h"
#include "testing/status_matchers.h"

namespace ckpt::reliability {
namespace {

using ::ckpt::testing::TempDir;

constexpr int kScale = 16;  // about 3 MiB per checkpoint
constexpr int kWorld = 4;
// keep_last of the killed writers: pruning is killed too (PruneOld
// tolerates a step directory whose MANIFEST an interrupted prune removed).
constexpr int kKeepLast = 3;
constexpr size_t kRetain = 3;  // checkpoints kept by the test between trials

// Saves `step` with `world` in-process ranks through the POSIX storage.
absl::Status SaveInProcess(const std::string& root, uint64_t step, int world,
                           const SaveConfig& config) {
  InProcessWorld w(world);
  return RunRanks(w, [&](Communicator& comm) -> absl::Status {
    CKPT_ASSIGN_OR_RETURN(auto state, RankState::Create(&comm, config.scale));
    return state->Save(root, step, config).status();
  });
}

std::vector<std::string> WriterArgs(const std::string& root, uint64_t first,
                                    int keep_last = kKeepLast,
                                    bool async = false) {
  return {CrashWriterPath(),
          "--root",
          root,
          "--first",
          std::to_string(first),
          "--world",
          std::to_string(kWorld),
          "--scale",
          std::to_string(kScale),
          "--keep-last",
          std::to_string(keep_last),
          "--async",
          async ? "1" : "0"};
}

// Keeps the newest kRetain committed checkpoints (and latest's), as
// keep_last would, so that each check reads a bounded amount.
void Retain(const std::string& root, const RootCheck& check) {
  if (kKeepLast > 0) return;
  const std::vector<uint64_t>& c = check.listing.committed;
  for (size_t i = 0; i + kRetain < c.size(); ++i) {
    if (c[i] == check.latest_step) continue;
    std::filesystem::remove_all(JoinPath(root, format::StepDirName(c[i])));
  }
}

// Kills writers that save with Save, or with SaveAsync while training on
// (`async`), and checks the root after every kill.
void KillTrials(bool async) {
  const uint64_t trials = EnvOr("CKPT_CRASH_TRIALS", 30);
  const uint64_t seed = EnvOr("CKPT_CRASH_SEED", 1);
  std::mt19937_64 rng(seed);
  TempDir dir;
  const std::string root = dir / "root";
  SaveConfig config;
  config.scale = kScale;
  config.keep_last = kKeepLast;
  // Committed checkpoints before the first kill, so `latest` always exists;
  // and the time of a start-up and two saves.
  uint64_t max_ms;
  {
    std::vector<std::string> args = WriterArgs(root, 1, kKeepLast, async);
    args.insert(args.end(), {"--count", "2"});
    const auto t0 = std::chrono::steady_clock::now();
    auto child = Child::Start(args, dir / "writer");
    ASSERT_THAT(child, ::ckpt::testing::IsOk());
    const int st = child->Wait();
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
        << DescribeWaitStatus(st) << "\n"
        << child->Stdout() << child->Stderr();
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - t0)
                          .count();
    max_ms = std::max<uint64_t>(
        EnvOr("CKPT_CRASH_MAX_MS", static_cast<uint64_t>(1.5 * ms)), 1);
  }

  uint64_t killed_mid_run = 0, saves = 0, with_temporaries = 0, cleaned = 0,
           without_manifest = 0, warnings = 0;
  const auto start = std::chrono::steady_clock::now();
  // With 10 trials or more, some kill must land inside a save (checked
  // below). Where saves take a small share of the writer's time (under the
  // sanitizers its start-up dominates) the random kills may all miss them:
  // then more trials, up to three times as many, before the check fails
  // (12 ASan trials of seed 1 once killed between saves only).
  const auto more = [&](uint64_t t) {
    return t < trials ||
           (trials >= 10 && with_temporaries == 0 && t < 3 * trials);
  };
  for (uint64_t t = 0; more(t); ++t) {
    const uint64_t first = (t + 1) * 1000;
    const uint64_t delay_us = rng() % (max_ms * 1000);
    SCOPED_TRACE(::testing::Message() << "trial " << t << " (CKPT_CRASH_SEED="
                                      << seed << "), kill after " << delay_us
                                      << " us, first step " << first);
    auto child =
        Child::Start(WriterArgs(root, first, kKeepLast, async), dir / "writer");
    ASSERT_THAT(child, ::ckpt::testing::IsOk());
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    const int st = child->Kill();
    // The writer never stops on its own: anything but SIGKILL is a failed save.
    ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
        << DescribeWaitStatus(st) << "\nstdout:\n"
        << child->Stdout() << "\nstderr:\n"
        << child->Stderr();
    ++killed_mid_run;
    const std::vector<uint64_t> saved = child->SavedSteps();
    saves += saved.size();

    RootCheck check = CheckRoot(root, kScale);
    if (!saved.empty() && check.latest_ok) {
      // "saved N" is printed after Save returned: N was committed and
      // `latest` moved to it (or past it).
      EXPECT_GE(check.latest_step, saved.back());
    }
    without_manifest += check.listing.uncommitted.size();
    warnings += check.validate_warnings;
    if (::testing::Test::HasFailure())
      return;  // one broken root is enough to look at

    Retain(root, check);
    if (!check.listing.temporaries.empty()) {
      ++with_temporaries;
      // The next save, alone in the root, removes what the kill left.
      ASSERT_THAT(SaveInProcess(root, first + 999, 2, config),
                  ::ckpt::testing::IsOk());
      auto after = ListRoot(root);
      ASSERT_THAT(after, ::ckpt::testing::IsOk());
      EXPECT_TRUE(after->temporaries.empty())
          << "left after the next save: "
          << absl::StrJoin(after->temporaries, ", ");
      ++cleaned;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf(
      "%scrash trials: %llu kills (seed %llu, delays < %llu ms) in %.1f s; "
      "%llu saves committed "
      "by the killed writers; %llu kills left temporaries (%llu validate "
      "warnings), all "
      "removed by the next save (%llu); %llu step directories without MANIFEST "
      "seen\n",
      async ? "async " : "", static_cast<unsigned long long>(killed_mid_run),
      static_cast<unsigned long long>(seed),
      static_cast<unsigned long long>(max_ms), seconds,
      static_cast<unsigned long long>(saves),
      static_cast<unsigned long long>(with_temporaries),
      static_cast<unsigned long long>(warnings),
      static_cast<unsigned long long>(cleaned),
      static_cast<unsigned long long>(without_manifest));
  ::testing::Test::RecordProperty("kills", static_cast<int>(killed_mid_run));
  ::testing::Test::RecordProperty("saves_committed", static_cast<int>(saves));
  ::testing::Test::RecordProperty("kills_leaving_temporaries",
                                  static_cast<int>(with_temporaries));
  // The kills must land inside saves, not only before the first one.
  if (trials >= 10) {
    EXPECT_GT(saves, 0u) << "no save completed: raise CKPT_CRASH_MAX_MS";
  }
  if (trials >= 10) {
    EXPECT_GT(with_temporaries, 0u) << "no kill interrupted a save";
  }
}

TEST(ReliabilityCrash, SigkillAtRandomMomentsOfSavesLeavesTheRootConsistent) {
  KillTrials(/*async=*/false);
}

// The same with SaveAsync: a kill while the snapshot is written in the
// background leaves no partial checkpoint visible and earlier ones intact,
// and no checkpoint holds the values the trainer wrote after the snapshot.
TEST(ReliabilityCrash, SigkillDuringAsyncSavesLeavesTheRootConsistent) {
  KillTrials(/*async=*/true);
}

// A writer that ends normally leaves no temporaries, and its last step is
// latest.
TEST(ReliabilityCrash, WriterThatFinishesLeavesACleanRoot) {
  TempDir dir;
  const std::string root = dir / "root";
  std::vector<std::string> args = WriterArgs(root, 10, /*keep_last=*/3);
  args.insert(args.end(), {"--count", "4"});
  auto child = Child::Start(args, dir / "writer");
  ASSERT_THAT(child, ::ckpt::testing::IsOk());
  const int st = child->Wait();
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
      << DescribeWaitStatus(st) << "\n"
      << child->Stdout() << child->Stderr();
  EXPECT_EQ(child->SavedSteps(), (std::vector<uint64_t>{10, 11, 12, 13}));
  RootCheck check = CheckRoot(root, kScale);
  EXPECT_EQ(check.latest_step, 13u);
  EXPECT_EQ(check.listing.committed,
            (std::vector<uint64_t>{11, 12, 13}));  // keep_last 3
  EXPECT_TRUE(check.listing.temporaries.empty());
  EXPECT_TRUE(check.listing.uncommitted.empty());
}

#ifdef CKPT_HAVE_VALIDATE
// Regression: every shard index of a multi-rank save carries the manifest's
// CHECKPOINT_INFO (each rank used to stamp its own creation time, and ranks
// other than 0 a zero fingerprint; ckpt-validate found it in this suite).
TEST(ReliabilityCrash, MultiRankCheckpointPassesValidate) {
  TempDir dir;
  const std::string root = dir / "root";
  SaveConfig config;
  ASSERT_THAT(SaveInProcess(root, 1, 2, config), ::ckpt::testing::IsOk());
  ops::ValidateOptions vo;
  vo.path = root;
  auto report = ops::Validate(vo);
  ASSERT_THAT(report, ::ckpt::testing::IsOk());
  for (const ops::Finding& f : report->findings)
    ADD_FAILURE() << ops::FindingText(f);
}
#endif

}  // namespace
}  // namespace ckpt::reliability

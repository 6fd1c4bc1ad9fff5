// Concurrent writers and readers of one root (spec/FORMAT.md §4.1, "Several
// writers in one root"):
//  - two writer processes save interleaved steps into one root at once:
//    afterwards every committed step loads exactly, `latest` names the
//    highest step, and nothing is left over;
//  - a reader loads `latest` in a loop while a writer commits, with and
//    without keep_last: each load either returns the exact bytes of some
//    step or, only when pruning removed the checkpoint under it, fails
//    with NotFound or DataLoss; never wrong data. `latest` never moves back.
// CKPT_CONCURRENCY_STEPS (default 12) sets the saves per writer.
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/in_process.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "reliability/model.h"
#include "reliability/root_check.h"
#include "reliability/subprocess.h"
#include "testing/status_matchers.h"

namespace ckpt::reliability {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::TempDir;

constexpr int kScale = 2;

uint64_t Steps() {
  const char* v = std::getenv("CKPT_CONCURRENCY_STEPS");
  uint64_t n = (v && *v) ? std::strtoull(v, nullptr, 10) : 12;
  return std::max<uint64_t>(n, 2);
}

std::vector<std::string> WriterArgs(const std::string& root, uint64_t first,
                                    uint64_t stride, uint64_t count,
                                    int keep_last) {
  return {CrashWriterPath(),
          "--root",
          root,
          "--first",
          std::to_string(first),
          "--stride",
          std::to_string(stride),
          "--count",
          std::to_string(count),
          "--world",
          "2",
          "--scale",
          std::to_string(kScale),
          "--keep-last",
          std::to_string(keep_last)};
}

void ExpectExitedOk(Child& c, int st) {
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
      << DescribeWaitStatus(st) << "\nstdout:\n"
      << c.Stdout() << "\nstderr:\n"
      << c.Stderr();
}

// How often the writer (odd or even steps) changes along the committed
// checkpoints in order of creation: the two processes ran at once if > 1.
int Alternations(const std::string& root, const std::vector<uint64_t>& steps) {
  std::vector<std::pair<int64_t, uint64_t>> by_time;
  for (uint64_t s : steps) {
    auto r = Reader::Open(JoinPath(root, format::StepDirName(s)));
    if (r.ok()) by_time.emplace_back((*r)->manifest().info.created_unix_ns, s);
  }
  std::sort(by_time.begin(), by_time.end());
  int changes = 0;
  for (size_t i = 1; i < by_time.size(); ++i) {
    changes += (by_time[i].second % 2) != (by_time[i - 1].second % 2);
  }
  return changes;
}

void TwoWriters(int keep_last) {
  TempDir dir;
  const std::string root = dir / "root";
  const uint64_t n = Steps();
  auto a = Child::Start(WriterArgs(root, 1, 2, n, keep_last),
                        dir / "a");  // 1, 3, 5, ...
  auto b = Child::Start(WriterArgs(root, 2, 2, n, keep_last),
                        dir / "b");  // 2, 4, 6, ...
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  const int sa = a->Wait(), sb = b->Wait();
  ExpectExitedOk(*a, sa);
  ExpectExitedOk(*b, sb);
  EXPECT_EQ(a->SavedSteps().size(), n);
  EXPECT_EQ(b->SavedSteps().size(), n);

  RootCheck check = CheckRoot(root, kScale);
  EXPECT_EQ(check.latest_step, 2 * n);
  std::printf(
      "two writers (keep_last %d): commits of the two alternated %d times\n",
      keep_last, Alternations(root, check.listing.committed));
  std::vector<uint64_t> want;
  for (uint64_t s = keep_last > 0 ? 2 * n - keep_last + 1 : 1; s <= 2 * n; ++s)
    want.push_back(s);
  EXPECT_EQ(check.listing.committed, want);
  EXPECT_TRUE(check.listing.temporaries.empty());
  EXPECT_TRUE(check.listing.uncommitted.empty());
}

TEST(ReliabilityConcurrency, TwoProcessesSavingInterleavedStepsIntoOneRoot) {
  TwoWriters(0);
}

TEST(ReliabilityConcurrency, TwoProcessesSavingInterleavedStepsWithKeepLast) {
  TwoWriters(3);
}

struct ReaderTally {
  int loads = 0;
  int failures = 0;
  std::vector<uint64_t> steps;  // of the successful loads, in order
};

// Loads `latest` of `root` until `done`, checking every outcome.
void ReadUntil(const std::string& root, const std::atomic<bool>& done,
               bool pruning, ReaderTally* tally) {
  while (!done.load()) {
    auto got = VerifyCheckpoint(root, kScale);
    ++tally->loads;
    ASSERT_FALSE(IsWrongData(got.status())) << got.status();
    if (got.ok()) {
      if (!tally->steps.empty()) {
        EXPECT_GE(*got, tally->steps.back()) << "latest moved back";
      }
      tally->steps.push_back(*got);
      continue;
    }
    ++tally->failures;
    // Without pruning nothing a reader can see ever goes away.
    ASSERT_TRUE(pruning) << got.status();
    ASSERT_TRUE(absl::IsNotFound(got.status()) ||
                absl::IsDataLoss(got.status()))
        << got.status();
  }
}

// The writer runs in this process (two in-process ranks on threads), the
// reader on another thread, so ThreadSanitizer sees both.
void ReaderWhileWriterThreadCommits(int keep_last) {
  TempDir dir;
  const std::string root = dir / "root";
  SaveConfig config;
  config.scale = kScale;
  config.keep_last = keep_last;
  {
    InProcessWorld w(2);
    ASSERT_THAT(RunRanks(w,
                         [&](Communicator& comm) -> absl::Status {
                           CKPT_ASSIGN_OR_RETURN(
                               auto s, RankState::Create(&comm, kScale));
                           return s->Save(root, 1, config).status();
                         }),
                IsOk());
  }
  std::atomic<bool> done{false};
  absl::Status written;
  const uint64_t n = 2 * Steps();
  std::thread writer([&] {
    InProcessWorld w(2);
    written = RunRanks(w, [&](Communicator& comm) -> absl::Status {
      CKPT_ASSIGN_OR_RETURN(auto s, RankState::Create(&comm, kScale));
      for (uint64_t step = 2; step <= n + 1; ++step) {
        CKPT_RETURN_IF_ERROR(s->Save(root, step, config).status());
      }
      return absl::OkStatus();
    });
    done = true;
  });
  ReaderTally tally;
  ReadUntil(root, done, keep_last > 0, &tally);
  done = true;
  writer.join();
  EXPECT_THAT(written, IsOk());
  std::printf(
      "reader while writer commits (keep_last %d): %d loads, %d clean "
      "failures, "
      "%zu distinct steps seen\n",
      keep_last, tally.loads, tally.failures,
      static_cast<size_t>(std::unique(tally.steps.begin(), tally.steps.end()) -
                          tally.steps.begin()));
  EXPECT_GT(tally.loads - tally.failures, 0);
  RootCheck check = CheckRoot(root, kScale);
  EXPECT_EQ(check.latest_step, n + 1);
  EXPECT_TRUE(check.listing.temporaries.empty());
}

TEST(ReliabilityConcurrency, ReaderLoadsLatestWhileAWriterCommits) {
  ReaderWhileWriterThreadCommits(0);
}

TEST(ReliabilityConcurrency, ReaderLoadsLatestWhileAWriterCommitsAndPrunes) {
  ReaderWhileWriterThreadCommits(1);
}

// The same with the writer in another process, pruning to one checkpoint.
TEST(ReliabilityConcurrency,
     ReaderLoadsLatestWhileAWriterProcessCommitsAndPrunes) {
  TempDir dir;
  const std::string root = dir / "root";
  auto first = Child::Start(WriterArgs(root, 1, 1, 1, 1), dir / "first");
  ASSERT_THAT(first, IsOk());
  int st = first->Wait();
  ExpectExitedOk(*first, st);
  auto child =
      Child::Start(WriterArgs(root, 2, 1, 2 * Steps(), 1), dir / "writer");
  ASSERT_THAT(child, IsOk());
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    st = child->Wait();
    done = true;
  });
  ReaderTally tally;
  ReadUntil(root, done, /*pruning=*/true, &tally);
  done = true;
  waiter.join();
  ExpectExitedOk(*child, st);
  std::printf(
      "reader while writer process commits (keep_last 1): %d loads, %d clean "
      "failures\n",
      tally.loads, tally.failures);
  EXPECT_GT(tally.loads - tally.failures, 0);
  RootCheck check = CheckRoot(root, kScale);
  EXPECT_EQ(check.latest_step, 2 * Steps() + 1);
  EXPECT_EQ(check.listing.committed, std::vector<uint64_t>{2 * Steps() + 1});
}

}  // namespace
}  // namespace ckpt::reliability

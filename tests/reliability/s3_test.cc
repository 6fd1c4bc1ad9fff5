// The reliability suites on S3 (issue 26). Crash consistency: ckpt_crash_writer
// saves into s3://<bucket>/run on the loopback moto server (tests/testing/s3/)
// and is SIGKILLed at random moments, as crash_test.cc does on POSIX. After
// every kill the root must be consistent (root_check.h through an S3Storage:
// every step with a MANIFEST loads exactly, `latest` names one of them and
// ops::Validate finds no error), every step the writer reported saved must
// be at or below `latest`, and the next save (in this process) must
// succeed. At the end, once the killed saves' markers are stale, one more
// save must remove everything they left: markers, shard objects of
// uncommitted steps and multipart uploads (spec/FORMAT.md §4.3,
// "Leftovers").
//
// CKPT_S3_CRASH_TRIALS (default 50) sets the number of kills; the delays
// are drawn as in crash_test.cc, uniformly from [0, 1.5 T) where T is the
// time the writer took to start and complete two saves; CKPT_CRASH_SEED
// (default 1) seeds them.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "ckpt/in_process.h"
#include "gtest/gtest.h"
#include "libckpt/s3/s3_test_server.h"
#include "libckpt/test_util.h"
#include "reliability/model.h"
#include "reliability/root_check.h"
#include "reliability/subprocess.h"
#include "s3/s3_storage.h"
#include "testing/status_matchers.h"

namespace ckpt::reliability {
namespace {

using ::ckpt::s3::S3Client;
using ::ckpt::s3::S3Storage;
using ::ckpt::s3::S3StorageOptions;
using ::ckpt::testing::TempDir;

constexpr int kScale = 1;  // about 200 KiB per checkpoint
constexpr int kWorld = 2;
constexpr int kKeepLast = 3;
// The stale age of this process's saves: short, so that the final save
// removes what the kills left; longer than twice a save on a busy machine
// (a save older than half of it refuses to commit).
constexpr absl::Duration kStaleAge = absl::Seconds(4);

// Waits until the root holds still: a request the killed writer sent just
// before SIGKILL still runs in the server (a PUT under a new .tmp-* prefix
// lands after the kill), so two listings 100 ms apart must agree (at most
// 3 s) before the root is checked as quiescent. Flaked before: ckpt-validate
// listed one .tmp-save prefix more than the check's own listing had.
void WaitUntilQuiescent(const std::string& root, Storage* storage) {
  auto same = [](const absl::StatusOr<RootListing>& a,
                 const absl::StatusOr<RootListing>& b) {
    return a.ok() && b.ok() && a->committed == b->committed &&
           a->uncommitted == b->uncommitted &&
           a->temporaries == b->temporaries && a->other == b->other &&
           a->has_latest == b->has_latest;
  };
  absl::StatusOr<RootListing> last = ListRoot(root, storage);
  for (int i = 0; i < 30; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    absl::StatusOr<RootListing> now = ListRoot(root, storage);
    if (same(last, now)) return;
    last = std::move(now);
  }
}

// The writer's environment: the AWS variables of ckpt/open_storage.h for
// the moto server's user.
void ExportServer(const s3::testing::TestServer& server) {
  setenv("AWS_ENDPOINT_URL", server.endpoint.c_str(), 1);
  setenv("AWS_ACCESS_KEY_ID", server.user.access_key_id.c_str(), 1);
  setenv("AWS_SECRET_ACCESS_KEY", server.user.secret_access_key.c_str(), 1);
  setenv("AWS_REGION", server.region.c_str(), 1);
  for (const char* v :
       {"AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "CKPT_S3_ADDRESSING",
        "CKPT_S3_CONDITIONAL_WRITES", "CKPT_S3_SINGLE_WRITER"}) {
    unsetenv(v);
  }
}

std::vector<std::string> WriterArgs(const std::string& root, uint64_t first) {
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
          std::to_string(kKeepLast),
          "--io-threads",
          "2"};
}

absl::Status SaveInProcess(Storage* storage, const std::string& root,
                           uint64_t step) {
  SaveConfig config;
  config.scale = kScale;
  config.keep_last = kKeepLast;
  InProcessWorld w(kWorld);
  return RunRanks(w, [&](Communicator& comm) -> absl::Status {
    CKPT_ASSIGN_OR_RETURN(auto state,
                          RankState::Create(&comm, config.scale, storage));
    return state->Save(root, step, config).status();
  });
}

struct Env {
  std::shared_ptr<S3Client> client;
  std::unique_ptr<S3Storage> storage;  // stale age kStaleAge
  std::string bucket, root;
};

size_t UploadsInProgress(const Env& e) {
  auto u = e.client->ListMultipartUploads(e.bucket, "");
  EXPECT_THAT(u.status(), ::ckpt::testing::IsOk());
  return u.ok() ? u->size() : 0;
}

TEST(ReliabilityS3Crash, SigkillAtRandomMomentsOfSavesLeavesTheRootConsistent) {
  CKPT_S3_SERVER_OR_SKIP(server);
  ExportServer(*server);
  Env e;
  e.client = std::shared_ptr<S3Client>(
      std::move(S3Client::Create(s3::testing::TestOptions(*server)).value()));
  S3StorageOptions so;
  so.stale_save_age = kStaleAge;
  e.storage = std::make_unique<S3Storage>(e.client, so);
  e.bucket = s3::testing::NewBucket(e.client.get());
  e.root = absl::StrCat("s3://", e.bucket, "/run");
  TempDir dir;

  const uint64_t trials = EnvOr("CKPT_S3_CRASH_TRIALS", 50);
  const uint64_t seed = EnvOr("CKPT_CRASH_SEED", 1);
  std::mt19937_64 rng(seed);
  // Committed checkpoints before the first kill, and the time of a
  // start-up and two saves.
  uint64_t max_ms;
  {
    std::vector<std::string> args = WriterArgs(e.root, 1);
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
    max_ms = std::max<uint64_t>(static_cast<uint64_t>(1.5 * ms), 1);
  }

  uint64_t saves = 0, with_markers = 0, without_manifest = 0, warnings = 0;
  std::vector<uint64_t> checked;  // committed steps loaded whole already
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t t = 0; t < trials; ++t) {
    const uint64_t first = (t + 1) * 1000;
    const uint64_t delay_us = rng() % (max_ms * 1000);
    SCOPED_TRACE(::testing::Message() << "trial " << t << " (CKPT_CRASH_SEED="
                                      << seed << "), kill after " << delay_us
                                      << " us, first step " << first);
    auto child = Child::Start(WriterArgs(e.root, first), dir / "writer");
    ASSERT_THAT(child, ::ckpt::testing::IsOk());
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    const int st = child->Kill();
    ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
        << DescribeWaitStatus(st) << "\nstdout:\n"
        << child->Stdout() << "\nstderr:\n"
        << child->Stderr();
    const std::vector<uint64_t> saved = child->SavedSteps();
    saves += saved.size();

    WaitUntilQuiescent(e.root, e.storage.get());
    RootCheck check = CheckRoot(e.root, kScale, e.storage.get(), checked);
    if (!saved.empty() && check.latest_ok) {
      EXPECT_GE(check.latest_step, saved.back());
    }
    with_markers += !check.listing.temporaries.empty();
    without_manifest += check.listing.uncommitted.size();
    warnings += check.validate_warnings;
    if (::testing::Test::HasFailure()) return;
    checked = check.listing.committed;

    // The next save succeeds, whatever the kill left.
    ASSERT_THAT(SaveInProcess(e.storage.get(), e.root, first + 999),
                ::ckpt::testing::IsOk());
    checked.push_back(first + 999);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();

  // Once every killed save's marker is stale, one more save removes what
  // the kills left: nothing but committed steps and `latest` remains.
  std::this_thread::sleep_for(absl::ToChronoSeconds(kStaleAge) +
                              std::chrono::seconds(1));
  ASSERT_THAT(SaveInProcess(e.storage.get(), e.root, (trials + 1) * 1000),
              ::ckpt::testing::IsOk());
  auto after = ListRoot(e.root, e.storage.get());
  ASSERT_THAT(after, ::ckpt::testing::IsOk());
  EXPECT_TRUE(after->temporaries.empty())
      << "left after the last save: "
      << absl::StrJoin(after->temporaries, ", ");
  EXPECT_TRUE(after->uncommitted.empty())
      << "uncommitted steps left: " << absl::StrJoin(after->uncommitted, ", ");
  EXPECT_EQ(UploadsInProgress(e), 0u);
  RootCheck last = CheckRoot(e.root, kScale, e.storage.get());
  EXPECT_EQ(last.latest_step, (trials + 1) * 1000);

  std::printf(
      "S3 crash trials: %llu kills (seed %llu, delays < %llu ms) in %.1f s; "
      "%llu saves committed by the killed writers; %llu kills left markers "
      "(%llu validate warnings); %llu step prefixes without MANIFEST seen; "
      "all removed by the last save\n",
      static_cast<unsigned long long>(trials),
      static_cast<unsigned long long>(seed),
      static_cast<unsigned long long>(max_ms), seconds,
      static_cast<unsigned long long>(saves),
      static_cast<unsigned long long>(with_markers),
      static_cast<unsigned long long>(warnings),
      static_cast<unsigned long long>(without_manifest));
  ::testing::Test::RecordProperty("kills", static_cast<int>(trials));
  ::testing::Test::RecordProperty("saves_committed", static_cast<int>(saves));
  if (trials >= 10) {
    EXPECT_GT(saves, 0u) << "no killed writer completed a save";
    EXPECT_GT(with_markers, 0u) << "no kill interrupted a save";
  }
}

#ifdef CKPT_HAVE_VALIDATE
// A flipped byte in a stored shard object: a load fails with DataLoss
// naming the shard, and ckpt-validate's checks (ops::Validate) report an
// error on it.
TEST(ReliabilityS3Crash, FlippedByteInAStoredShardIsFoundByLoadAndValidate) {
  CKPT_S3_SERVER_OR_SKIP(server);
  auto client = std::shared_ptr<S3Client>(
      std::move(S3Client::Create(s3::testing::TestOptions(*server)).value()));
  S3Storage storage(client, S3StorageOptions{});
  const std::string bucket = s3::testing::NewBucket(client.get());
  const std::string root = absl::StrCat("s3://", bucket, "/run");
  ASSERT_THAT(SaveInProcess(&storage, root, 1), ::ckpt::testing::IsOk());
  auto listed = client->ListObjects(bucket, "run/step-00000001/shard-00001.");
  ASSERT_THAT(listed, ::ckpt::testing::IsOk());
  ASSERT_EQ(listed->objects.size(), 1u);
  const std::string key = listed->objects[0].key;
  auto bytes = client->GetObject(bucket, key);
  ASSERT_THAT(bytes, ::ckpt::testing::IsOk());
  (*bytes)[bytes->size() / 3] ^= 0x04;  // in the payload
  ASSERT_THAT(client->PutObject(bucket, key, *bytes), ::ckpt::testing::IsOk());

  const std::string shard = key.substr(key.rfind('/') + 1);
  EXPECT_THAT(VerifyCheckpoint(root, kScale, &storage),
              ::ckpt::testing::StatusIs(absl::StatusCode::kDataLoss, shard));
  ops::ValidateOptions vo;
  vo.path = root;
  vo.storage = &storage;
  auto report = ops::Validate(vo);
  ASSERT_THAT(report, ::ckpt::testing::IsOk());
  bool found = false;
  for (const ops::Finding& f : report->findings) {
    found |= f.severity == ops::Severity::kError &&
             absl::StrContains(ops::FindingText(f), shard);
  }
  EXPECT_TRUE(found) << "no error naming " << shard;
}
#endif

}  // namespace
}  // namespace ckpt::reliability

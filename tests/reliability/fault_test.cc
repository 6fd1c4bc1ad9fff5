// Storage faults: every storage operation of a save and of a load fails in
// turn, once with each of ENOSPC, EIO, EACCES and EFBIG (as the POSIX
// storage reports them), and every write of a save is torn (a short write
// followed by ENOSPC), through FaultInjectingStorage; and one save runs
// into a real RLIMIT_FSIZE (EFBIG). What must hold:
//  - a failed save returns the injected code and names the operation and
//    the file; it never damages an earlier checkpoint or `latest`, and
//    leaves nothing partial: no .tmp-* entry, and a step-* directory exists
//    only if complete;
//  - a failed load returns an error naming the operation and the file,
//    never wrong data.
// CKPT_FAULT_FULL=1 runs the save matrix for both codecs with every errno
// (the default runs all errnos on uncompressed saves and ENOSPC on zstd).
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "ckpt/format/latest.h"
#include "ckpt/in_process.h"
#include "ckpt/testing/fault_injection.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "reliability/model.h"
#include "reliability/root_check.h"
#include "reliability/subprocess.h"
#include "storage/posix_storage.h"
#include "testing/status_matchers.h"

namespace ckpt::reliability {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;

constexpr int kScale = 1;  // about 200 KiB: several blocks and writes per shard
constexpr int kWorld = 2;

struct ErrnoCase {
  int err;
  const char* name;
};
constexpr ErrnoCase kErrnos[] = {
    {ENOSPC, "ENOSPC"}, {EIO, "EIO"}, {EACCES, "EACCES"}, {EFBIG, "EFBIG"}};

// The status PosixStorage returns for `err` (code per storage.h), as the
// message FaultInjectingStorage prefixes with "injected fault: <op> <path>".
absl::Status ErrnoStatus(int err) {
  return absl::Status(internal::ErrnoToStatus(err, "").code(),
                      std::strerror(err));
}

constexpr StorageOp kAllOps[] = {
    StorageOp::kOpen,    StorageOp::kRead,   StorageOp::kWrite,
    StorageOp::kSync,    StorageOp::kClose,  StorageOp::kCreateDir,
    StorageOp::kSyncDir, StorageOp::kRename, StorageOp::kList,
    StorageOp::kStat,    StorageOp::kRemove};

// The words FaultInjectingStorage uses for `op` in its messages.
std::vector<std::string> OpWords(StorageOp op) {
  switch (op) {
    case StorageOp::kOpen:
      return {"open"};
    case StorageOp::kRead:
      return {"pread"};
    case StorageOp::kWrite:
      return {"pwrite"};
    case StorageOp::kSync:
      return {"fsync"};
    case StorageOp::kClose:
      return {"close"};
    case StorageOp::kCreateDir:
      return {"mkdir"};
    case StorageOp::kSyncDir:
      return {"fsync"};
    case StorageOp::kRename:
      return {"rename"};
    case StorageOp::kList:
      return {"opendir"};
    case StorageOp::kStat:
      return {"stat", "fstat"};
    case StorageOp::kRemove:
      return {"unlink", "remove_all"};
  }
  return {};
}

// The message says which operation failed on which file under `root`.
bool NamesOpAndFile(const absl::Status& s, StorageOp op,
                    const std::string& root) {
  const std::string msg(s.message());
  for (const std::string& w : OpWords(op)) {
    if (absl::StrContains(msg, absl::StrCat("injected fault: ", w, " ", root)))
      return true;
  }
  return false;
}

absl::Status SaveWith(Storage* storage, const std::string& root, uint64_t step,
                      const SaveConfig& config) {
  InProcessWorld w(kWorld);
  return RunRanks(w, [&](Communicator& comm) -> absl::Status {
    CKPT_ASSIGN_OR_RETURN(auto state,
                          RankState::Create(&comm, config.scale, storage));
    return state->Save(root, step, config).status();
  });
}

void CopyRoot(const std::string& from, const std::string& to) {
  std::filesystem::remove_all(to);
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
}

std::string Where(StorageOp op, int64_t nth, const std::string& what) {
  return absl::StrCat(what, " at ", StorageOpName(op), " #", nth);
}

// Counts of a matrix run, printed for RELIABILITY.md.
struct Tally {
  int trials = 0;
  int64_t injected = 0;
  int failed = 0;     // the operation returned the injected error
  int tolerated = 0;  // succeeded despite the fault (with exact data)
  std::map<std::string, int> tolerated_at;  // "stat #3" -> count
  void Print(const char* what) const {
    std::string t;
    for (const auto& [k, v] : tolerated_at) absl::StrAppend(&t, " ", k, "x", v);
    std::printf(
        "%s: %d trials, %lld faults injected, %d failed cleanly, %d succeeded "
        "despite "
        "the fault (exact data):%s\n",
        what, trials, static_cast<long long>(injected), failed, tolerated,
        t.empty() ? " none" : t.c_str());
  }
};

// A temporary directory on tmpfs where there is one: the fault trials need
// no durability, and fsync on tmpfs is free, which makes the matrices
// several times faster.
class ScratchDir {
 public:
  ScratchDir() {
    std::string base = access("/dev/shm", W_OK) == 0
                           ? std::string("/dev/shm")
                           : std::filesystem::temp_directory_path().string();
    std::string tmpl = base + "/ckpt-faults-XXXXXX";
    path_ = mkdtemp(tmpl.data()) ? tmpl : dir_.path();
  }
  ~ScratchDir() {
    if (path_ != dir_.path()) std::filesystem::remove_all(path_);
  }
  std::string operator/(const std::string& s) const { return path_ + "/" + s; }

 private:
  TempDir dir_;  // fallback
  std::string path_;
};

class ReliabilityFaults : public ::testing::Test {
 protected:
  // A root with step 1 committed (uncompressed) and, when `two`, step 2
  // (zstd) as latest.
  void MakeTemplate(bool two) {
    template_ = dir_ / "template";
    ASSERT_THAT(SaveWith(DefaultStorage(), template_, 1, config_), IsOk());
    if (two) {
      ASSERT_THAT(SaveWith(DefaultStorage(), template_, 2, config_), IsOk());
    }
  }

  // Number of calls of each op in a save of `step` into a copy of the
  // template.
  std::map<StorageOp, int64_t> ProbeSave(uint64_t step,
                                         const SaveConfig& config) {
    CopyRoot(template_, root_);
    FaultInjectingStorage counter(DefaultStorage());
    EXPECT_THAT(SaveWith(&counter, root_, step, config), IsOk());
    std::map<StorageOp, int64_t> counts;
    for (StorageOp op : kAllOps) counts[op] = counter.count(op);
    return counts;
  }

  // After a save of `step` into a copy of the template that returned `r`
  // under an injected `error`: the checks of the file comment.
  void CheckAfterSave(const absl::Status& r, const absl::Status& error,
                      StorageOp op, uint64_t step,
                      const std::vector<uint64_t>& before, Tally* tally) {
    if (r.ok()) {
      ++tally->tolerated;
    } else {
      ++tally->failed;
      EXPECT_EQ(r.code(), error.code()) << r;
      EXPECT_TRUE(NamesOpAndFile(r, op, root_))
          << "does not name the operation and file: " << r;
    }
    auto listing = ListRoot(root_);
    ASSERT_THAT(listing, IsOk());
    EXPECT_TRUE(listing->temporaries.empty())
        << "left: " << absl::StrJoin(listing->temporaries, ", ")
        << "; save: " << r;
    EXPECT_TRUE(listing->other.empty()) << absl::StrJoin(listing->other, ", ");
    for (uint64_t b : before) {
      if (config_.keep_last > 0 && b != before.back())
        continue;  // may be pruned
      EXPECT_NE(
          std::find(listing->committed.begin(), listing->committed.end(), b),
          listing->committed.end())
          << "earlier checkpoint " << b << " lost; save: " << r;
    }
    for (uint64_t c : listing->committed) {
      auto got =
          VerifyCheckpoint(JoinPath(root_, format::StepDirName(c)), kScale);
      EXPECT_THAT(got, IsOk()) << "step " << c;
    }
    auto latest = VerifyCheckpoint(root_, kScale);
    EXPECT_THAT(latest, IsOk());
    if (r.ok() && latest.ok()) {
      EXPECT_EQ(*latest, step);
    }
    if (latest.ok()) {
      EXPECT_TRUE(*latest == step || *latest == before.back()) << *latest;
    }
    uncommitted_ += listing->uncommitted.size();
  }

  // Fails every call of every op of a save of `step`, in turn, with each
  // of `errnos`; then tears every write.
  void RunSaveMatrix(uint64_t step, const std::vector<ErrnoCase>& errnos,
                     const std::vector<uint64_t>& before, Tally* tally) {
    const std::map<StorageOp, int64_t> counts = ProbeSave(step, config_);
    for (const ErrnoCase& e : errnos) {
      for (StorageOp op : kAllOps) {
        for (int64_t nth = 1; nth <= counts.at(op); ++nth) {
          SCOPED_TRACE(Where(op, nth, e.name));
          CopyRoot(template_, root_);
          FaultInjectingStorage faulty(DefaultStorage());
          faulty.FailAt(op, nth, ErrnoStatus(e.err));
          absl::Status r = SaveWith(&faulty, root_, step, config_);
          ++tally->trials;
          tally->injected += faulty.injected();
          EXPECT_EQ(faulty.injected(), 1);
          if (r.ok())
            ++tally->tolerated_at[absl::StrCat(StorageOpName(op), "#", nth)];
          CheckAfterSave(r, ErrnoStatus(e.err), op, step, before, tally);
          if (HasFailure()) return;
        }
      }
    }
    // Torn writes: the first byte, or a block and a bit, reach the file.
    for (size_t bytes : {size_t{1}, size_t{(64 << 10) + 7}}) {
      for (int64_t nth = 1; nth <= counts.at(StorageOp::kWrite); ++nth) {
        SCOPED_TRACE(Where(StorageOp::kWrite, nth,
                           absl::StrCat("short write of ", bytes)));
        CopyRoot(template_, root_);
        FaultInjectingStorage faulty(DefaultStorage());
        faulty.ShortWriteAt(nth, bytes, ErrnoStatus(ENOSPC));
        absl::Status r = SaveWith(&faulty, root_, step, config_);
        ++tally->trials;
        tally->injected += faulty.injected();
        CheckAfterSave(r, ErrnoStatus(ENOSPC), StorageOp::kWrite, step, before,
                       tally);
        if (HasFailure()) return;
      }
    }
  }

  ScratchDir dir_;
  std::string template_;
  std::string root_ = dir_ / "root";
  SaveConfig config_;
  size_t uncommitted_ = 0;
};

bool FullMode() {
  const char* v = std::getenv("CKPT_FAULT_FULL");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

TEST_F(ReliabilityFaults,
       EveryOperationOfASaveFailingLeavesEarlierCheckpointsIntact) {
  MakeTemplate(/*two=*/false);
  Tally tally;
  const std::vector<ErrnoCase> all(std::begin(kErrnos), std::end(kErrnos));
  RunSaveMatrix(3, all, {1}, &tally);  // uncompressed
  if (HasFailure()) return;
  RunSaveMatrix(4, FullMode() ? all : std::vector<ErrnoCase>{kErrnos[0]}, {1},
                &tally);  // zstd
  tally.Print("save faults");
  EXPECT_EQ(uncommitted_, 0u);
  EXPECT_GE(tally.trials, 200);
}

// With keep_last the save also prunes; a fault there may leave the pruned
// checkpoint without its MANIFEST (never a directory that looks committed
// but is incomplete), and the newest earlier checkpoint always survives.
TEST_F(ReliabilityFaults,
       EveryOperationOfAPruningSaveFailingKeepsLatestIntact) {
  config_.keep_last = 2;
  MakeTemplate(/*two=*/true);
  Tally tally;
  RunSaveMatrix(3, {kErrnos[0], kErrnos[1]}, {1, 2}, &tally);
  tally.Print("pruning-save faults");
  std::printf(
      "pruning-save faults: %zu pruned directories left without MANIFEST\n",
      uncommitted_);
}

// Pruning removes MANIFEST first, then the directory. When the second step
// fails (or the process dies between the two), the next pruning save must
// still succeed and remove the remains.
TEST_F(ReliabilityFaults,
       SaveAfterAnInterruptedPruneSucceedsAndRemovesTheRemains) {
  config_.keep_last = 2;
  MakeTemplate(/*two=*/true);
  CopyRoot(template_, root_);
  {
    // Step 3's prune of step 1: unlink MANIFEST, then remove_all (fails).
    FaultInjectingStorage faulty(DefaultStorage());
    faulty.OnlyPathsContaining("step-00000001");
    faulty.FailAt(StorageOp::kRemove, 2, ErrnoStatus(EIO));
    EXPECT_THAT(SaveWith(&faulty, root_, 3, config_),
                StatusIs(absl::StatusCode::kInternal, "remove_all"));
  }
  auto listing = ListRoot(root_);
  ASSERT_THAT(listing, IsOk());
  ASSERT_EQ(listing->uncommitted, std::vector<std::string>{"step-00000001"});
  EXPECT_THAT(SaveWith(DefaultStorage(), root_, 4, config_), IsOk());
  listing = ListRoot(root_);
  ASSERT_THAT(listing, IsOk());
  EXPECT_EQ(listing->committed, (std::vector<uint64_t>{3, 4}));
  EXPECT_TRUE(listing->uncommitted.empty());
}

// Every operation of a load (open, stat, read, list, close) failing in
// turn, with each errno: the load fails, or, where the failed call did not
// matter, succeeds with the exact bytes. Never wrong data. Returns the
// failures that do not carry the injected code, or do not name the
// operation and a file under the root.
std::vector<std::string> RunLoadMatrix(const std::string& root,
                                       const std::vector<StorageOp>& ops,
                                       Tally* tally) {
  std::vector<std::string> misreported;
  // `latest` (step 2, zstd) through the root, and step 1 (uncompressed) by
  // its directory.
  for (const std::string& path :
       {root, JoinPath(root, format::StepDirName(1))}) {
    FaultInjectingStorage counter(DefaultStorage());
    EXPECT_THAT(VerifyCheckpoint(path, kScale, &counter), IsOk());
    for (const ErrnoCase& e : kErrnos) {
      for (StorageOp op : ops) {
        for (int64_t nth = 1; nth <= counter.count(op); ++nth) {
          SCOPED_TRACE(Where(op, nth, absl::StrCat(e.name, " loading ", path)));
          FaultInjectingStorage faulty(DefaultStorage());
          faulty.FailAt(op, nth, ErrnoStatus(e.err));
          auto got = VerifyCheckpoint(path, kScale, &faulty);
          ++tally->trials;
          tally->injected += faulty.injected();
          EXPECT_FALSE(IsWrongData(got.status())) << got.status();
          if (got.ok()) {
            ++tally->tolerated;
            ++tally->tolerated_at[absl::StrCat(StorageOpName(op), "#", nth)];
            continue;
          }
          ++tally->failed;
          EXPECT_TRUE(absl::StrContains(got.status().message(), root))
              << got.status();
          if (got.status().code() != ErrnoStatus(e.err).code() ||
              !NamesOpAndFile(got.status(), op, root)) {
            misreported.push_back(absl::StrCat(Where(op, nth, e.name),
                                               " loading ", path, ": ",
                                               got.status().ToString()));
          }
        }
      }
    }
  }
  return misreported;
}

TEST_F(ReliabilityFaults, EveryOperationOfALoadFailingNeverReturnsWrongData) {
  MakeTemplate(/*two=*/true);
  CopyRoot(template_, root_);
  Tally tally;
  std::vector<StorageOp> ops(std::begin(kAllOps), std::end(kAllOps));
  // stat: see the next test.
  ops.erase(std::find(ops.begin(), ops.end(), StorageOp::kStat));
  std::vector<std::string> misreported = RunLoadMatrix(root_, ops, &tally);
  tally.Print("load faults (all ops but stat)");
  EXPECT_TRUE(misreported.empty())
      << misreported.size()
      << " load faults came back without their code, operation or file:\n"
      << absl::StrJoin(misreported, "\n");
  EXPECT_GE(tally.trials, 100);
}

// Every read of a load returning OK with fewer bytes than asked (a file
// that ends early: 0 bytes, and 7) or with one bit of them inverted (a disk
// or cable that returns other bytes than the file's): the load fails with
// DataLoss naming a file of the checkpoint. Never wrong data. Everything a
// reader reads is under a checksum or a length check, so a read that comes
// back short or altered can never go unnoticed.
TEST_F(ReliabilityFaults, EveryReadOfALoadCutShortOrCorruptedIsDataLoss) {
  MakeTemplate(/*two=*/true);
  CopyRoot(template_, root_);
  Tally tally;
  std::vector<std::string> misreported;
  std::mt19937_64 rng(7);
  for (const std::string& path :
       {root_, JoinPath(root_, format::StepDirName(1))}) {
    FaultInjectingStorage counter(DefaultStorage());
    ASSERT_THAT(VerifyCheckpoint(path, kScale, &counter), IsOk());
    const int64_t reads = counter.count(StorageOp::kRead);
    EXPECT_GE(reads, 5) << path;
    for (int64_t nth = 1; nth <= reads; ++nth) {
      for (int kind = 0; kind < 4; ++kind) {
        FaultInjectingStorage faulty(DefaultStorage());
        std::string what;
        if (kind < 2) {
          const size_t keep = kind == 0 ? 0 : 7;
          faulty.ShortReadAt(nth, keep);
          what = absl::StrCat("read cut to ", keep, " bytes");
        } else {
          const uint64_t byte = rng();
          const int bit = static_cast<int>(rng() % 8);
          faulty.CorruptReadAt(nth, byte, bit);
          what = absl::StrCat("bit ", bit, " of byte ", byte, " % n inverted");
        }
        SCOPED_TRACE(Where(StorageOp::kRead, nth,
                           absl::StrCat(what, " loading ", path)));
        auto got = VerifyCheckpoint(path, kScale, &faulty);
        ++tally.trials;
        tally.injected += faulty.injected();
        ASSERT_FALSE(IsWrongData(got.status())) << got.status();
        if (got.ok()) {
          ++tally.tolerated;
          ++tally.tolerated_at[absl::StrCat("read#", nth, " ", what)];
          continue;
        }
        ++tally.failed;
        if (got.status().code() != absl::StatusCode::kDataLoss ||
            !absl::StrContains(got.status().message(), root_)) {
          misreported.push_back(absl::StrCat(Where(StorageOp::kRead, nth, what),
                                             " loading ", path, ": ",
                                             got.status().ToString()));
        }
      }
    }
  }
  tally.Print("short and corrupted reads of a load");
  EXPECT_EQ(tally.tolerated, 0) << "a short or corrupted read went unnoticed";
  EXPECT_TRUE(misreported.empty())
      << misreported.size()
      << " were not DataLoss naming a file of the checkpoint:\n"
      << absl::StrJoin(misreported, "\n");
  EXPECT_GE(tally.trials, 40);
}

// The same for stat: a failed Stat of MANIFEST other than NotFound (EIO,
// EACCES...) keeps its code and names the operation.
TEST_F(ReliabilityFaults, StatFaultsOfALoadKeepTheirCodeAndNameTheOperation) {
  MakeTemplate(/*two=*/true);
  CopyRoot(template_, root_);
  Tally tally;
  std::vector<std::string> misreported =
      RunLoadMatrix(root_, {StorageOp::kStat}, &tally);
  tally.Print("load faults (stat)");
  EXPECT_TRUE(misreported.empty())
      << misreported.size()
      << " load faults came back without their code, operation or file:\n"
      << absl::StrJoin(misreported, "\n");
}

// A real EFBIG: a writer process under RLIMIT_FSIZE (SIGXFSZ ignored) saves
// a checkpoint larger than the limit.
TEST_F(ReliabilityFaults, RealEfbigFromRlimitFsizeFailsTheSaveNamingTheFile) {
  config_.scale = 16;  // 3 MiB, shards of about 800 KiB
  const std::string root = dir_ / "efbig";
  ASSERT_THAT(SaveWith(DefaultStorage(), root, 1, config_), IsOk());
  auto child = Child::Start(
      {CrashWriterPath(), "--root", root, "--first", "2", "--count", "1",
       "--world", "2", "--scale", "16", "--fsize-limit", "262144"},
      dir_ / "efbig-writer");
  ASSERT_THAT(child, IsOk());
  const int st = child->Wait();
  const std::string out = child->Stdout();
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2)
      << DescribeWaitStatus(st) << "\n"
      << out << child->Stderr();
  EXPECT_TRUE(absl::StrContains(out, "status: RESOURCE_EXHAUSTED: ")) << out;
  EXPECT_TRUE(absl::StrContains(out, "File too large")) << out;
  EXPECT_TRUE(absl::StrContains(out, "pwrite " + root + "/.tmp-step-00000002-"))
      << out;
  EXPECT_TRUE(absl::StrContains(out, "/shard-0000")) << out;
  RootCheck check = CheckRoot(root, 16);
  EXPECT_EQ(check.latest_step, 1u);
  EXPECT_EQ(check.listing.committed, std::vector<uint64_t>{1});
  EXPECT_TRUE(check.listing.temporaries.empty());
}

}  // namespace
}  // namespace ckpt::reliability

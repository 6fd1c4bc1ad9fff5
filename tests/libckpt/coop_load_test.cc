// Cooperative loads (ReaderOptions::communicator, ckpt/reader.h) on
// in-process ranks: metadata read once, per-rank guarantees, and a failure
// on one rank failing the load on every rank with the same status. The
// resharding matrix of cooperative loads is in reshard_test.cc.
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "ckpt/reader.h"
#include "ckpt/testing/fake_device.h"
#include "ckpt/testing/fault_injection.h"
#include "ckpt/testing/forwarding_storage.h"
#include "ckpt/writer.h"
#include "gtest/gtest.h"
#include "libckpt/forwarding_communicator.h"
#include "libckpt/row_bands.h"
#include "libckpt/test_util.h"
#include "load/coop/shared_arena.h"
#include "testing/status_matchers.h"
#include "util/mutex.h"

namespace ckpt {
namespace {

using ::ckpt::testing::Delivery;
using ::ckpt::testing::OptionsFor;
using ::ckpt::testing::RunRanksWith;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kRanks = 4;
constexpr uint64_t kRows = 64, kCols = 48;  // float32, 4 KiB blocks

std::string Name(int i) { return "t" + std::to_string(i); }

// Three float32 tensors of kRows x kCols, rank r holding rows
// [16 r, 16 r + 16) of each; returns the global bytes.
std::vector<std::string> SaveRows(const std::string& root) {
  return testing::SaveRowBands(root, kRanks, 3, kRows, kCols, 10);
}

// One rank's storage: every call it made (counted by a
// FaultInjectingStorage that injects nothing), and its shard header reads
// (PRead at offset 0 of a shard file) per file.
class CountingStorage final : public testing::ForwardingStorage {
 public:
  CountingStorage() : ForwardingStorage(&counted_) {}

  int64_t calls() const {
    int64_t n = 0;
    for (int op = 0; op < kNumStorageOps; ++op) {
      n += counted_.count(static_cast<StorageOp>(op));
    }
    return n;
  }
  std::map<std::string, int> HeaderReads() {
    MutexLock l(&mu_);
    return header_reads_;
  }

  absl::StatusOr<std::unique_ptr<File>> Open(
      const std::string& path, OpenMode mode,
      const OpenOptions& options) override {
    CKPT_ASSIGN_OR_RETURN(auto f, ForwardingStorage::Open(path, mode, options));
    return std::unique_ptr<File>(new HeaderFile(std::move(f), this));
  }

 private:
  class HeaderFile final : public testing::ForwardingFile {
   public:
    HeaderFile(std::unique_ptr<File> f, CountingStorage* s)
        : ForwardingFile(std::move(f)), s_(s) {}
    absl::StatusOr<size_t> PRead(uint64_t offset, size_t n,
                                 char* dst) override {
      if (offset == 0 && path().find("shard") != std::string::npos) {
        MutexLock l(&s_->mu_);
        ++s_->header_reads_[std::filesystem::path(path()).filename()];
      }
      return ForwardingFile::PRead(offset, n, dst);
    }

   private:
    CountingStorage* s_;
  };

  FaultInjectingStorage counted_{DefaultStorage()};  // only counts
  Mutex mu_;
  std::map<std::string, int> header_reads_ ABSL_GUARDED_BY(mu_);
};

// The requests for box `b` of the three tensors, into `bufs` (three
// buffers, filled with 0xEE first).
std::vector<LoadRequest> BoxRequests(const Box& b,
                                     std::vector<std::string>* bufs) {
  std::vector<LoadRequest> reqs;
  for (int i = 0; i < 3; ++i) {
    (*bufs)[i].assign(RegionElements(b) * 4, '\xEE');
    reqs.push_back(
        {Name(i), DType::kFloat32, {kRows, kCols}, b, (*bufs)[i].data()});
  }
  return reqs;
}

// Each rank loads columns [12 r, 12 r + 12) of every tensor (rows to
// columns: every stored block feeds every rank).
struct ColumnLoad {
  std::vector<std::vector<std::string>> bufs =
      std::vector<std::vector<std::string>>(kRanks,
                                            std::vector<std::string>(3));
  std::vector<LoadRequest> Requests(int rank) {
    std::vector<LoadRequest> reqs;
    for (int i = 0; i < 3; ++i) {
      Box b{{0, rank * kCols / kRanks}, {kRows, kCols / kRanks}};
      bufs[rank][i].assign(RegionElements(b) * 4, '\xEE');
      reqs.push_back(
          {Name(i), DType::kFloat32, {kRows, kCols}, b, bufs[rank][i].data()});
    }
    return reqs;
  }
  void Check(const std::vector<std::string>& global) {
    for (int r = 0; r < kRanks; ++r) {
      for (int i = 0; i < 3; ++i) {
        Box b{{0, r * kCols / kRanks}, {kRows, kCols / kRanks}};
        EXPECT_EQ(bufs[r][i], testing::Extract(global[i], DType::kFloat32,
                                               {kRows, kCols}, b))
            << "rank " << r << " tensor " << i;
      }
    }
  }
};

TEST(CooperativeOpenTest, OnlyRankZeroTouchesStorage) {
  TempDir dir;
  SaveRows(dir.path());
  std::vector<CountingStorage> storage(kRanks);
  InProcessWorld w(kRanks);
  std::vector<uint64_t> steps(kRanks);
  CKPT_ASSERT_OK(RunRanks(w, [&](Communicator& comm) -> absl::Status {
    ReaderOptions ro;
    ro.communicator = &comm;
    ro.storage = &storage[comm.rank()];
    CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(dir.path(), ro));
    steps[comm.rank()] = reader->description().step;
    return absl::OkStatus();
  }));
  EXPECT_GT(storage[0].calls(), 0);
  for (int r = 1; r < kRanks; ++r) {
    EXPECT_EQ(storage[r].calls(), 0) << "rank " << r;
    EXPECT_EQ(steps[r], 1u);
  }
}

// The cooperative load tests run with both delivery paths.
class CooperativeLoadTest : public ::testing::TestWithParam<Delivery> {};
class CooperativeLoadFailureTest : public ::testing::TestWithParam<Delivery> {};

TEST_P(CooperativeLoadTest, EachShardIndexIsReadByOneRank) {
  TempDir dir;
  const auto global = SaveRows(dir.path());
  std::vector<CountingStorage> storage(kRanks);
  InProcessWorld w(kRanks);
  ColumnLoad load;
  std::vector<LoadReport> reports(kRanks);
  CKPT_ASSERT_OK(
      RunRanksWith(w, GetParam(), [&](Communicator& comm) -> absl::Status {
        ReaderOptions ro;
        ro.communicator = &comm;
        ro.storage = &storage[comm.rank()];
        CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(dir.path(), ro));
        CKPT_ASSIGN_OR_RETURN(
            reports[comm.rank()],
            reader->Load(load.Requests(comm.rank()), OptionsFor(GetParam())));
        return absl::OkStatus();
      }));
  load.Check(global);
  std::map<std::string, int> headers;
  uint64_t read = 0, received = 0;
  for (int r = 0; r < kRanks; ++r) {
    for (const auto& [file, n] : storage[r].HeaderReads()) headers[file] += n;
    read += reports[r].bytes_read;
    received += reports[r].bytes_received;
    EXPECT_GT(reports[r].bytes_read, 0u) << "rank " << r;
  }
  EXPECT_EQ(headers.size(), static_cast<size_t>(kRanks));
  for (const auto& [file, n] : headers) EXPECT_EQ(n, 1) << file;
  EXPECT_EQ(read, 3 * kRows * kCols * 4);  // every block once, uncompressed
  EXPECT_EQ(received, read * (kRanks - 1) / kRanks);
}

// Ranks 0-2 run on node "a", rank 3 on node "b": rank 3 reads half of the
// bytes (within one read), not a quarter as it would with unnamed nodes.
// Ranks that name two machines never try shared memory (these could: they
// are threads of one process).
TEST_P(CooperativeLoadTest, ReadsSpreadOverTheNodesTheCommunicatorNames) {
  TempDir dir;
  const auto global = SaveRows(dir.path());
  InProcessWorld w(kRanks, {"a", "a", "a", "b"});
  ColumnLoad load;
  std::vector<LoadReport> reports(kRanks);
  CKPT_ASSERT_OK(
      RunRanksWith(w, GetParam(), [&](Communicator& comm) -> absl::Status {
        EXPECT_EQ(comm.NodeName(), comm.rank() == 3 ? "b" : "a");
        ReaderOptions ro;
        ro.communicator = &comm;
        CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(dir.path(), ro));
        CKPT_ASSIGN_OR_RETURN(
            reports[comm.rank()],
            reader->Load(load.Requests(comm.rank()), OptionsFor(GetParam())));
        return absl::OkStatus();
      }));
  load.Check(global);
  const uint64_t total = 3 * kRows * kCols * 4, block = 4096;
  uint64_t node_a = 0;
  for (int r = 0; r < 3; ++r) node_a += reports[r].bytes_read;
  EXPECT_EQ(node_a + reports[3].bytes_read, total);
  EXPECT_LE(reports[3].bytes_read, total / 2 + block);
  EXPECT_GE(reports[3].bytes_read, total / 2 - block);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_FALSE(reports[r].shared_memory_exchange) << "rank " << r;
  }
}

TEST_P(CooperativeLoadTest, ManySmallRoundsLoadTheSameBytes) {
  TempDir dir;
  const auto global = SaveRows(dir.path());
  InProcessWorld w(kRanks);
  ColumnLoad load;
  CKPT_ASSERT_OK(
      RunRanksWith(w, GetParam(), [&](Communicator& comm) -> absl::Status {
        ReaderOptions ro;
        ro.communicator = &comm;
        CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(dir.path(), ro));
        LoadOptions lo = OptionsFor(GetParam());
        lo.exchange_bytes_per_round = 1000;  // below one read: a read per round
        return reader->Load(load.Requests(comm.rank()), lo).status();
      }));
  load.Check(global);
}

TEST_P(CooperativeLoadTest, CallsEachOnCompleteOnceAndHonoursStrictness) {
  TempDir dir;
  const auto global = SaveRows(dir.path());
  InProcessWorld w(kRanks);
  ColumnLoad load, other;
  std::vector<std::atomic<int>> calls(kRanks * 3);
  std::vector<absl::Status> strict(kRanks);
  CKPT_ASSERT_OK(
      RunRanksWith(w, GetParam(), [&](Communicator& comm) -> absl::Status {
        const int rank = comm.rank();
        ReaderOptions ro;
        ro.communicator = &comm;
        CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(dir.path(), ro));
        std::vector<LoadRequest> reqs = load.Requests(rank);
        for (int i = 0; i < 3; ++i) {
          reqs[i].on_complete = [&calls, rank, i] { ++calls[rank * 3 + i]; };
        }
        CKPT_RETURN_IF_ERROR(
            reader->Load(reqs, OptionsFor(GetParam())).status());
        // Rank 3 leaves t2 unrequested without a filter: the load fails on
        // every rank.
        std::vector<LoadRequest> fewer = other.Requests(rank);
        if (rank == 3) fewer.pop_back();
        strict[rank] = reader->Load(fewer, OptionsFor(GetParam())).status();
        return absl::OkStatus();
      }));
  load.Check(global);
  for (int k = 0; k < kRanks * 3; ++k) EXPECT_EQ(calls[k], 1) << k;
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_THAT(strict[r], StatusIs(absl::StatusCode::kFailedPrecondition,
                                    "rank 3 of 4: 1 entries in the checkpoint "
                                    "were not requested: t2"));
    EXPECT_EQ(strict[r], strict[0]);
  }
}

// Runs a cooperative column load on kRanks ranks delivering by `delivery`, rank
// r with storage `storage(r)` (null: POSIX) and requests `requests(r)`; returns
// every rank's status of Open (if it failed) or Load.
std::vector<absl::Status> LoadOnAll(
    Delivery delivery, const std::string& root,
    const std::function<Storage*(int)>& storage,
    const std::function<std::vector<LoadRequest>(int)>& requests) {
  InProcessWorld w(kRanks);
  std::vector<absl::Status> out(kRanks);
  absl::Status st = RunRanksWith(w, delivery, [&](Communicator& comm) {
    const int rank = comm.rank();
    ReaderOptions ro;
    ro.communicator = &comm;
    ro.storage = storage(rank);
    auto reader = Reader::Open(root, ro);
    out[rank] = reader.status();
    if (reader.ok()) {
      out[rank] =
          (*reader)->Load(requests(rank), OptionsFor(delivery)).status();
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

void ExpectSameFailure(const std::vector<absl::Status>& got,
                       absl::StatusCode code, const std::string& part) {
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_THAT(got[r], StatusIs(code, part)) << "rank " << r;
    EXPECT_EQ(got[r], got[0]) << "rank " << r;
  }
}

TEST_P(CooperativeLoadFailureTest, OpenErrorsAreThoseOfASingleRankOpen) {
  TempDir dir;
  SaveRows(dir.path());
  ColumnLoad load;
  auto none = [](int) -> Storage* { return nullptr; };
  auto reqs = [&](int r) { return load.Requests(r); };
  const std::string missing = dir / "nope";
  auto got = LoadOnAll(GetParam(), missing, none, reqs);
  ExpectSameFailure(got, absl::StatusCode::kNotFound, "nope");
  EXPECT_EQ(got[0], Reader::Open(missing).status());
  // A corrupt manifest: the decoder's DataLoss, as for one rank.
  auto dir1 = std::filesystem::path(dir.path()) / "step-00000001";
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    if (std::filesystem::exists(e.path() / "MANIFEST")) dir1 = e.path();
  }
  {
    std::fstream f(dir1 / "MANIFEST",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x5A');
  }
  got = LoadOnAll(GetParam(), dir.path(), none, reqs);
  ExpectSameFailure(got, absl::StatusCode::kDataLoss, "MANIFEST");
  EXPECT_EQ(got[0], Reader::Open(dir.path()).status());
}

// Loads the rows on every rank of `delivery`, t1 requested as int32 by
// the ranks of `bad` (and, by rank 3 when `bad_shape_on_3`, t0 at a wrong
// shape): every rank's status.
std::vector<absl::Status> LoadWithBadRequests(Delivery delivery,
                                              const std::set<int>& bad,
                                              bool bad_shape_on_3) {
  TempDir dir;
  SaveRows(dir.path());
  ColumnLoad load;
  return LoadOnAll(
      delivery, dir.path(), [](int) -> Storage* { return nullptr; },
      [&](int r) {
        auto reqs = load.Requests(r);
        if (bad.count(r)) reqs[1].dtype = DType::kInt32;
        if (bad_shape_on_3 && r == 3) reqs[0].shape = {1, 1};
        return reqs;
      });
}

TEST_P(CooperativeLoadFailureTest, BadRequestOnOneRankFailsEveryRank) {
  ExpectSameFailure(LoadWithBadRequests(GetParam(), {2}, false),
                    absl::StatusCode::kInvalidArgument,
                    "rank 2 of 4: t1: dtype float32 in checkpoint, int32 "
                    "requested");
}

// Two ranks with bad requests: the error travels with the requests'
// AllGather, and every rank reports the lowest failing rank's.
TEST_P(CooperativeLoadFailureTest,
       BadRequestsOnTwoRanksFailEveryRankAsTheLowest) {
  ExpectSameFailure(LoadWithBadRequests(GetParam(), {1}, true),
                    absl::StatusCode::kInvalidArgument,
                    "rank 1 of 4: t1: dtype float32 in checkpoint, int32 "
                    "requested");
}

TEST_P(CooperativeLoadFailureTest, LocalErrorOfOneRankFailsEveryRank) {
  TempDir dir;
  SaveRows(dir.path());
  ColumnLoad load;
  InProcessWorld w(kRanks);
  std::vector<absl::Status> got(kRanks);
  CKPT_ASSERT_OK(
      RunRanksWith(w, GetParam(), [&](Communicator& comm) -> absl::Status {
        ReaderOptions ro;
        ro.communicator = &comm;
        CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(dir.path(), ro));
        LoadOptions lo = OptionsFor(GetParam());
        if (comm.rank() == 3)
          lo.local_error = absl::InvalidArgumentError("bad");
        got[comm.rank()] =
            reader->Load(load.Requests(comm.rank()), lo).status();
        return absl::OkStatus();
      }));
  ExpectSameFailure(got, absl::StatusCode::kInvalidArgument,
                    "rank 3 of 4: bad");
}

TEST_P(CooperativeLoadFailureTest, ReadErrorOnOneRankFailsEveryRank) {
  TempDir dir;
  SaveRows(dir.path());
  ColumnLoad load;
  std::vector<std::unique_ptr<FaultInjectingStorage>> fs;
  for (int r = 0; r < kRanks; ++r) {
    fs.push_back(std::make_unique<FaultInjectingStorage>(DefaultStorage()));
  }
  // Rank 1's third read of a shard file fails: after its index reads (the
  // header, tail and index of the one shard it opens), its first block.
  fs[1]->OnlyPathsContaining("shard");
  fs[1]->FailAt(StorageOp::kRead, 4, absl::UnavailableError("disk gone"));
  auto got = LoadOnAll(
      GetParam(), dir.path(), [&](int r) -> Storage* { return fs[r].get(); },
      [&](int r) { return load.Requests(r); });
  ExpectSameFailure(got, absl::StatusCode::kUnavailable, "rank 1 of 4: ");
  EXPECT_THAT(got[0].message(), HasSubstr("disk gone"));
  EXPECT_EQ(fs[1]->injected(), 1);
}

TEST_P(CooperativeLoadFailureTest, ChecksumMismatchOnOneRankFailsEveryRank) {
  TempDir dir;
  SaveRows(dir.path());
  auto reader = Reader::Open(dir.path());
  CKPT_ASSERT_OK(reader);
  const format::ChunkRecord& c = (*reader)->Find("t1")->chunks[0];
  const std::string shard =
      (*reader)->path() + "/" + (*reader)->manifest().shards[c.shard].file_name;
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(c.data_offset + 100);
    const char old = static_cast<char>(f.get());
    f.seekp(c.data_offset + 100);
    f.put(static_cast<char>(old ^ 1));
  }
  ColumnLoad load;
  auto got = LoadOnAll(
      GetParam(), dir.path(), [](int) -> Storage* { return nullptr; },
      [&](int r) { return load.Requests(r); });
  ExpectSameFailure(got, absl::StatusCode::kDataLoss, "checksum");
  EXPECT_THAT(got[0].message(), HasSubstr("'t1'"));
}

TEST_P(CooperativeLoadFailureTest, MissingShardFileFailsEveryRank) {
  TempDir dir;
  SaveRows(dir.path());
  auto reader = Reader::Open(dir.path());
  CKPT_ASSERT_OK(reader);
  const std::string shard =
      (*reader)->path() + "/" + (*reader)->manifest().shards[2].file_name;
  std::filesystem::remove(shard);
  ColumnLoad load;
  auto got = LoadOnAll(
      GetParam(), dir.path(), [](int) -> Storage* { return nullptr; },
      [&](int r) { return load.Requests(r); });
  ExpectSameFailure(got, absl::StatusCode::kDataLoss,
                    "shard file is missing (shard 2 in the manifest)");
}

// The segments of this process's shared-memory exchanges still named in
// /dev/shm (shared_arena.cc names them "ckpt-coop-<pid>-...").
std::vector<std::string> SegmentsLeft() {
  const std::string prefix = "ckpt-coop-" + std::to_string(getpid()) + "-";
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  return out;
}

// A column load (ColumnLoad) of the checkpoint SaveRows wrote to `root`
// (global bytes `global`, checked) on kRanks in-process ranks delivering by
// `delivery`, rank r loading with options_of(r); every rank's report, and
// its AllToAll calls in `calls`.
std::vector<LoadReport> ColumnLoadOnAll(
    const std::string& root, const std::vector<std::string>& global,
    Delivery delivery, const std::function<LoadOptions(int)>& options_of,
    std::vector<int>* calls) {
  InProcessWorld w(kRanks);
  ColumnLoad load;
  std::vector<LoadReport> reports(kRanks);
  CKPT_EXPECT_OK(RunRanksWith(
      w, delivery,
      [&](Communicator& comm) -> absl::Status {
        ReaderOptions ro;
        ro.communicator = &comm;
        CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(root, ro));
        CKPT_ASSIGN_OR_RETURN(
            reports[comm.rank()],
            reader->Load(load.Requests(comm.rank()), options_of(comm.rank())));
        return absl::OkStatus();
      },
      calls));
  load.Check(global);
  return reports;
}

// Ranks of one address space deliver without AllToAll; hiding that, the
// same load exchanges the bytes with AllToAll, or through shared memory
// (the default between processes): then without AllToAll either, the
// same bytes received, and no segment left named in /dev/shm.
TEST(CooperativeLoadDeliveryTest, DirectDeliveryMakesNoAllToAllCall) {
  TempDir dir;
  const auto global = SaveRows(dir.path());
  std::map<Delivery, uint64_t> received;
  for (Delivery d :
       {Delivery::kDirect, Delivery::kAllToAll, Delivery::kSharedMemory}) {
    std::vector<int> calls;
    const std::vector<LoadReport> reports = ColumnLoadOnAll(
        dir.path(), global, d, [d](int) { return OptionsFor(d); }, &calls);
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(calls[r] > 0, d == Delivery::kAllToAll) << "rank " << r;
      EXPECT_EQ(reports[r].shared_memory_exchange, d == Delivery::kSharedMemory)
          << "rank " << r;
      received[d] += reports[r].bytes_received;
    }
    EXPECT_TRUE(SegmentsLeft().empty()) << testing::DeliveryName(d);
  }
  EXPECT_GT(received[Delivery::kAllToAll], 0u);
  EXPECT_EQ(received[Delivery::kSharedMemory], received[Delivery::kAllToAll]);
}

// The shared-memory exchange needs every rank: one rank that opts out
// (or cannot create or map a segment) sends every rank through AllToAll,
// and the load is the same.
TEST(CooperativeLoadDeliveryTest,
     OneRankWithoutSharedMemoryMakesAllUseAllToAll) {
  TempDir dir;
  const auto global = SaveRows(dir.path());
  std::vector<int> calls;
  const std::vector<LoadReport> reports = ColumnLoadOnAll(
      dir.path(), global, Delivery::kSharedMemory,
      [](int rank) {
        return OptionsFor(rank == 2 ? Delivery::kAllToAll
                                    : Delivery::kSharedMemory);
      },
      &calls);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_GT(calls[r], 0) << "rank " << r;
    EXPECT_FALSE(reports[r].shared_memory_exchange) << "rank " << r;
  }
  EXPECT_TRUE(SegmentsLeft().empty());
}

// Issue 24: in a resharded load (rows saved by 4 ranks, loaded as row
// bands by fewer), a stored block that one rank alone needs is read by that
// rank, straight into its destination: only blocks that several ranks need
// travel through AllToAll, each read once in the job. On 2 ranks every
// stored row band feeds one rank: nothing is exchanged. On 3 ranks (rows
// [0, 21), [21, 42), [42, 64)) the bands of saving ranks 1 and 2 are cut:
// only the part of each for the rank that did not read it is sent. The
// ranks share one node, as processes of one machine do (the node's reads
// are then balanced between its ranks).
TEST(CooperativeLoadDeliveryTest, BlocksOneRankNeedsSkipTheCommunicator) {
  TempDir dir;
  const auto global = SaveRows(dir.path());
  const uint64_t row = kCols * 4, band = kRows / kRanks * row;
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(ranks);
    std::vector<uint64_t> first = {0, 32, 64};
    if (ranks == 3) first = {0, 21, 42, 64};
    InProcessWorld w(ranks, std::vector<std::string>(ranks, "host"));
    std::vector<std::vector<std::string>> bufs(ranks,
                                               std::vector<std::string>(3));
    std::vector<LoadReport> reports(ranks);
    std::vector<uint64_t> sent(ranks), calls(ranks);
    CKPT_ASSERT_OK(RunRanks(w, [&](Communicator& base) -> absl::Status {
      testing::ForwardingCommunicator comm(&base, Delivery::kAllToAll);
      const int r = comm.rank();
      const Box b{{first[r], 0}, {first[r + 1] - first[r], kCols}};
      std::vector<LoadRequest> reqs = BoxRequests(b, &bufs[r]);
      ReaderOptions ro;
      ro.communicator = &comm;
      CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(dir.path(), ro));
      absl::StatusOr<LoadReport> got =
          reader->Load(reqs, OptionsFor(Delivery::kAllToAll));
      sent[r] = comm.all_to_all_bytes();
      calls[r] = comm.all_to_all_calls();
      CKPT_RETURN_IF_ERROR(got.status());
      reports[r] = *got;
      return absl::OkStatus();
    }));
    uint64_t read = 0, received = 0, total_sent = 0;
    for (int r = 0; r < ranks; ++r) {
      const Box b{{first[r], 0}, {first[r + 1] - first[r], kCols}};
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(bufs[r][i], testing::Extract(global[i], DType::kFloat32,
                                               {kRows, kCols}, b))
            << "rank " << r << " tensor " << i;
      }
      read += reports[r].bytes_read;
      received += reports[r].bytes_received;
      total_sent += sent[r];
    }
    EXPECT_EQ(read, 3 * kRows * row);  // every block once
    EXPECT_EQ(received, total_sent);
    if (ranks == 2) {
      EXPECT_EQ(total_sent, 0u);
    } else {
      // Per tensor, at most the larger side of each of the two cut bands
      // (rows 16-21 | 21-32 and 32-42 | 42-48); blocks of one rank: none.
      EXPECT_GT(total_sent, 0u);
      EXPECT_LE(total_sent, 3 * (11 + 10) * row);
      EXPECT_LT(total_sent, 3 * 2 * band);
    }
  }
}

// Issue 24: rows saved by 4 ranks loaded as row bands by 2, where every
// shard feeds one rank, exchange nothing and make no AllToAll call at
// all: each rank reads its shards alone, and the load makes two
// collectives in all (the requests, and the outcome's agreement; eight
// before errors travelled with the AllGathers, four before such loads
// read alone). A failed read still fails every rank alike (at that last
// agreement).
TEST(CooperativeLoadDeliveryTest, RoundsThatSendNothingMakeNoAllToAllCall) {
  TempDir dir;
  const auto global = SaveRows(dir.path());
  constexpr int kRanksNow = 2;
  auto load = [&](std::vector<int>* calls, std::vector<int>* agreements,
                  std::vector<int>* collectives,
                  std::vector<std::vector<std::string>>* bufs) {
    std::vector<absl::Status> got(kRanksNow);
    calls->assign(kRanksNow, 0);
    agreements->assign(kRanksNow, 0);
    collectives->assign(kRanksNow, 0);
    bufs->assign(kRanksNow, std::vector<std::string>(3));
    InProcessWorld w(kRanksNow, std::vector<std::string>(kRanksNow, "host"));
    absl::Status st = RunRanks(w, [&](Communicator& base) -> absl::Status {
      testing::ForwardingCommunicator comm(&base, Delivery::kAllToAll);
      const int r = comm.rank();
      const uint64_t rows = kRows / kRanksNow;
      const Box b{{r * rows, 0}, {rows, kCols}};
      std::vector<LoadRequest> reqs;
      for (int i = 0; i < 3; ++i) {
        (*bufs)[r][i].assign(RegionElements(b) * 4, '\xEE');
        reqs.push_back({Name(i),
                        DType::kFloat32,
                        {kRows, kCols},
                        b,
                        (*bufs)[r][i].data()});
      }
      ReaderOptions ro;
      ro.communicator = &comm;
      CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(dir.path(), ro));
      const int before = comm.all_reduce_max_calls();
      const int collectives_before = comm.collective_calls();
      got[r] = reader->Load(reqs).status();
      (*calls)[r] = comm.all_to_all_calls();
      (*agreements)[r] = comm.all_reduce_max_calls() - before;
      (*collectives)[r] = comm.collective_calls() - collectives_before;
      return absl::OkStatus();
    });
    EXPECT_TRUE(st.ok()) << st;
    return got;
  };
  std::vector<int> calls, agreements, collectives;
  std::vector<std::vector<std::string>> bufs;
  std::vector<absl::Status> got =
      load(&calls, &agreements, &collectives, &bufs);
  for (int r = 0; r < kRanksNow; ++r) {
    CKPT_EXPECT_OK(got[r]);
    EXPECT_EQ(calls[r], 0) << "rank " << r;
    EXPECT_EQ(agreements[r], agreements[0]) << "rank " << r;
    // Two collectives in all: the requests (an AllGather that carries a
    // failing rank's error too) and the outcome's agreement.
    EXPECT_EQ(collectives[r], 2) << "rank " << r;
    const uint64_t rows = kRows / kRanksNow;
    const Box b{{r * rows, 0}, {rows, kCols}};
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(bufs[r][i],
                testing::Extract(global[i], DType::kFloat32, {kRows, kCols}, b))
          << "rank " << r << " tensor " << i;
    }
  }
  // Rank 1's rows of t1 corrupted: rank 1 alone reads them, in a round
  // without exchange; both ranks return its DataLoss.
  auto reader = Reader::Open(dir.path());
  CKPT_ASSERT_OK(reader);
  const format::ChunkRecord* last = nullptr;
  for (const format::ChunkRecord& c : (*reader)->Find("t1")->chunks) {
    last = &c;
  }
  const std::string shard = (*reader)->path() + "/" +
                            (*reader)->manifest().shards[last->shard].file_name;
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(last->data_offset + 100);
    const char old = static_cast<char>(f.get());
    f.seekp(last->data_offset + 100);
    f.put(static_cast<char>(old ^ 1));
  }
  got = load(&calls, &agreements, &collectives, &bufs);
  for (int r = 0; r < kRanksNow; ++r) {
    EXPECT_THAT(got[r], StatusIs(absl::StatusCode::kDataLoss, "checksum"))
        << "rank " << r;
    EXPECT_EQ(got[r], got[0]) << "rank " << r;
    EXPECT_THAT(got[r].message(), HasSubstr("rank 1 of 2"));
    EXPECT_EQ(calls[r], 0) << "rank " << r;
  }
}

// A load in the layout of the save (rows saved by 4 ranks, the same row
// bands loaded by 4): every rank reads its own shard alone, each shard's
// index once and each block once, and nothing travels between the ranks.
TEST(CooperativeLoadDeliveryTest,
     ALoadInTheLayoutOfTheSaveReadsEachShardAlone) {
  TempDir dir;
  const auto global = SaveRows(dir.path());
  std::vector<CountingStorage> storage(kRanks);
  InProcessWorld w(kRanks, std::vector<std::string>(kRanks, "host"));
  std::vector<std::vector<std::string>> bufs(kRanks,
                                             std::vector<std::string>(3));
  std::vector<LoadReport> reports(kRanks);
  std::vector<int> collectives(kRanks);
  const uint64_t rows = kRows / kRanks;
  CKPT_ASSERT_OK(RunRanks(w, [&](Communicator& base) -> absl::Status {
    testing::ForwardingCommunicator comm(&base, Delivery::kAllToAll);
    const int r = comm.rank();
    const Box b{{r * rows, 0}, {rows, kCols}};
    std::vector<LoadRequest> reqs = BoxRequests(b, &bufs[r]);
    ReaderOptions ro;
    ro.communicator = &comm;
    ro.storage = &storage[r];
    CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(dir.path(), ro));
    const int before = comm.collective_calls();
    CKPT_ASSIGN_OR_RETURN(reports[r], reader->Load(reqs));
    collectives[r] = comm.collective_calls() - before;
    return absl::OkStatus();
  }));
  uint64_t read = 0;
  std::map<std::string, int> headers;
  for (int r = 0; r < kRanks; ++r) {
    const Box b{{r * rows, 0}, {rows, kCols}};
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(bufs[r][i],
                testing::Extract(global[i], DType::kFloat32, {kRows, kCols}, b))
          << "rank " << r << " tensor " << i;
    }
    for (const auto& [file, n] : storage[r].HeaderReads()) {
      headers[file] += n;
      EXPECT_EQ(storage[r].HeaderReads().size(), 1u) << "rank " << r;
    }
    read += reports[r].bytes_read;
    EXPECT_EQ(reports[r].bytes_received, 0u) << "rank " << r;
    EXPECT_EQ(collectives[r], 2) << "rank " << r;
  }
  EXPECT_EQ(read, 3 * kRows * kCols * 4);  // every block once
  EXPECT_EQ(headers.size(), static_cast<size_t>(kRanks));
  for (const auto& [file, n] : headers) EXPECT_EQ(n, 1) << file;
}

// Rows saved by 4 ranks beside a replicated scalar (an optimizer's step,
// written once): loading the bands and the scalar on every rank reads
// alone (the scalar's few bytes are read by every rank, under 1% of the
// job's bytes); every rank loading the whole tensor shares the reading
// (each block read once, by one rank, and sent to the others).
TEST(CooperativeLoadDeliveryTest,
     ReplicatedScalarsStillReadAloneWholeTensorsDoNot) {
  TempDir dir;
  const std::string big =
      testing::ReferenceBytes(DType::kFloat32, {kRows, kCols}, 31);
  const std::string step = testing::ReferenceBytes(DType::kFloat32, {1}, 32);
  {
    InProcessWorld w(kRanks);
    CKPT_ASSERT_OK(RunRanks(w, [&](Communicator& comm) -> absl::Status {
      Writer::Options wo;
      wo.comm = &comm;
      CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
      const uint64_t r0 = comm.rank() * kRows / kRanks;
      CKPT_RETURN_IF_ERROR(writer->AddTensor(
          "big", DType::kFloat32, {kRows, kCols},
          Box{{r0, 0}, {kRows / kRanks, kCols}}, big.data() + r0 * kCols * 4));
      TensorOptions replica;
      replica.replica = true;
      CKPT_RETURN_IF_ERROR(writer->AddTensor(
          "step", DType::kFloat32, {1}, FullBox({1}), step.data(), replica));
      SaveOptions so;
      so.block_size = 4096;
      return writer->Save(dir.path(), 1, so).status();
    }));
  }
  for (const bool whole : {false, true}) {
    SCOPED_TRACE(whole ? "whole tensor on every rank" : "bands");
    InProcessWorld w(kRanks, std::vector<std::string>(kRanks, "host"));
    std::vector<std::string> got(kRanks), got_step(kRanks);
    std::vector<int> collectives(kRanks);
    std::vector<LoadReport> reports(kRanks);
    CKPT_ASSERT_OK(RunRanks(w, [&](Communicator& base) -> absl::Status {
      testing::ForwardingCommunicator comm(&base, Delivery::kAllToAll);
      const int r = comm.rank();
      const uint64_t rows = whole ? kRows : kRows / kRanks;
      const Box b{{whole ? 0 : r * rows, 0}, {rows, kCols}};
      got[r].assign(RegionElements(b) * 4, '\xEE');
      got_step[r].assign(4, '\xEE');
      ReaderOptions ro;
      ro.communicator = &comm;
      CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(dir.path(), ro));
      const int before = comm.collective_calls();
      CKPT_ASSIGN_OR_RETURN(
          reports[r],
          reader->Load(
              {{"big", DType::kFloat32, {kRows, kCols}, b, got[r].data()},
               {"step",
                DType::kFloat32,
                {1},
                FullBox({1}),
                got_step[r].data()}}));
      collectives[r] = comm.collective_calls() - before;
      return absl::OkStatus();
    }));
    uint64_t read = 0;
    for (int r = 0; r < kRanks; ++r) {
      const uint64_t rows = whole ? kRows : kRows / kRanks;
      const Box b{{whole ? 0 : r * rows, 0}, {rows, kCols}};
      EXPECT_EQ(got[r],
                testing::Extract(big, DType::kFloat32, {kRows, kCols}, b))
          << "rank " << r;
      EXPECT_EQ(got_step[r], step) << "rank " << r;
      read += reports[r].bytes_read;
      if (whole) {
        EXPECT_GT(collectives[r], 2) << "rank " << r;
      } else {
        EXPECT_EQ(collectives[r], 2) << "rank " << r;
        EXPECT_EQ(reports[r].bytes_received, 0u) << "rank " << r;
      }
    }
    // The scalar's block is read by every rank alone, once with the
    // shared reading; the tensor's blocks once either way.
    EXPECT_EQ(read, kRows * kCols * 4 + (whole ? 4 : kRanks * 4));
  }
}

// A device destination on one rank: no rank writes into another's
// memory; every rank takes the AllToAll path, and the bytes arrive.
TEST(CooperativeLoadDeliveryTest, DeviceDestinationOnOneRankUsesAllToAll) {
  TempDir dir;
  const auto global = SaveRows(dir.path());
  InProcessWorld w(kRanks);
  ColumnLoad load;
  testing::FakeDevice dev;
  std::vector<int> calls;
  CKPT_ASSERT_OK(RunRanksWith(
      w, Delivery::kDirect,
      [&](Communicator& comm) -> absl::Status {
        ReaderOptions ro;
        ro.communicator = &comm;
        ro.device_memory = &dev;
        CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(dir.path(), ro));
        std::vector<LoadRequest> reqs = load.Requests(comm.rank());
        if (comm.rank() == 2) reqs[1].memory = MemoryKind::kCuda;
        return reader->Load(reqs, OptionsFor(Delivery::kAllToAll)).status();
      },
      &calls));
  load.Check(global);
  for (int r = 0; r < kRanks; ++r) EXPECT_GT(calls[r], 0) << "rank " << r;
}

// SharedArenas (load/coop/shared_arena.h) on in-process ranks: what one
// rank writes into a half, every rank reads at Of(rank, half).
TEST(SharedArenasTest, EveryRankReadsTheHalvesOthersWrote) {
  InProcessWorld w(3);
  CKPT_ASSERT_OK(RunRanks(w, [&](Communicator& comm) -> absl::Status {
    const uint32_t me = comm.rank();
    CKPT_ASSIGN_OR_RETURN(auto arenas,
                          internal::SharedArenas::Create(&comm, 1000, true));
    if (arenas == nullptr) return absl::InternalError("no arenas");
    for (uint32_t half : {0u, 1u}) {
      std::memset(arenas->Mine(half), static_cast<int>(10 * me + half), 1000);
    }
    CKPT_RETURN_IF_ERROR(comm.Barrier());
    for (uint32_t r = 0; r < 3; ++r) {
      for (uint32_t half : {0u, 1u}) {
        const std::string got(arenas->Of(r, half), 1000);
        EXPECT_EQ(got, std::string(1000, static_cast<char>(10 * r + half)))
            << "rank " << me << " reading rank " << r << " half " << half;
      }
    }
    return comm.Barrier();
  }));
  EXPECT_TRUE(SegmentsLeft().empty());
}

// A segment that /dev/shm cannot hold (posix_fallocate refuses it) on one
// rank: null on every rank (the load then uses AllToAll), nothing left.
TEST(SharedArenasTest, ASegmentTooLargeForDevShmMeansNoneOnEveryRank) {
  InProcessWorld w(2);
  CKPT_ASSERT_OK(RunRanks(w, [&](Communicator& comm) -> absl::Status {
    const uint64_t half = comm.rank() == 1 ? (uint64_t{1} << 60) : 4096;
    CKPT_ASSIGN_OR_RETURN(auto arenas,
                          internal::SharedArenas::Create(&comm, half, true));
    EXPECT_EQ(arenas, nullptr) << "rank " << comm.rank();
    return absl::OkStatus();
  }));
  EXPECT_TRUE(SegmentsLeft().empty());
}

auto DeliveryParamName = [](const ::testing::TestParamInfo<Delivery>& info) {
  return std::string(testing::DeliveryName(info.param));
};
INSTANTIATE_TEST_SUITE_P(EveryPath, CooperativeLoadTest,
                         ::testing::Values(Delivery::kDirect,
                                           Delivery::kAllToAll,
                                           Delivery::kSharedMemory),
                         DeliveryParamName);
INSTANTIATE_TEST_SUITE_P(EveryPath, CooperativeLoadFailureTest,
                         ::testing::Values(Delivery::kDirect,
                                           Delivery::kAllToAll,
                                           Delivery::kSharedMemory),
                         DeliveryParamName);

}  // namespace
}  // namespace ckpt

// MpiCommunicator under a real MPI job: run by ctest as
// `mpirun -np 4 ... libckpt_mpi_save_test` (see CMakeLists.txt). Every rank
// runs every test in the same order; the process exit code is agreed by all
// ranks (non-zero if any rank failed).
//
// Two parts: the six collectives one by one (including the split path for
// transfers above Options::max_bytes_per_call, observed through the MPI
// profiling interface), then a multi-rank save through ckpt::Writer and a
// resharded load on every rank through ckpt::Reader.
//
// Keeping ranks in step: a rank that stops a test early while the others
// enter a collective would hang the job, so before each collective a test
// asks NoRankFailed() (an MPI_Allreduce on MPI_COMM_WORLD, independent of
// the code under test) and all ranks leave together.
#include <mpi.h>
#include <stdlib.h>  // mkdtemp

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/format/format_constants.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/mpi_communicator.h"
#include "ckpt/reader.h"
#include "ckpt/writer.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "testing/status_matchers.h"

// --- MPI profiling interface: the test binary's definitions of these
// functions take precedence over libmpi's, record the largest byte count of
// any call and forward to the PMPI_ entry points.
namespace {
struct CallLog {
  int64_t calls = 0;
  int64_t largest =
      0;  // bytes moved by one call (Allgatherv: all ranks' counts)
  void Record(int64_t bytes) {
    ++calls;
    largest = std::max(largest, bytes);
  }
};
CallLog g_allgatherv;
CallLog g_bcast_bytes;  // MPI_Bcast of MPI_BYTE only (lengths are MPI_INT64_T)
}  // namespace

extern "C" int MPI_Allgatherv(const void* sendbuf, int sendcount,
                              MPI_Datatype sendtype, void* recvbuf,
                              const int recvcounts[], const int displs[],
                              MPI_Datatype recvtype, MPI_Comm comm) {
  int size = 0;
  PMPI_Comm_size(comm, &size);
  int64_t total = 0;
  for (int r = 0; r < size; ++r) total += recvcounts[r];
  g_allgatherv.Record(total);
  return PMPI_Allgatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts,
                         displs, recvtype, comm);
}

CallLog g_gatherv;  // recorded at the root only

extern "C" int MPI_Gatherv(const void* sendbuf, int sendcount,
                           MPI_Datatype sendtype, void* recvbuf,
                           const int recvcounts[], const int displs[],
                           MPI_Datatype recvtype, int root, MPI_Comm comm) {
  int rank = 0, size = 0;
  PMPI_Comm_rank(comm, &rank);
  PMPI_Comm_size(comm, &size);
  if (rank == root) {
    int64_t total = 0;
    for (int r = 0; r < size; ++r) total += recvcounts[r];
    g_gatherv.Record(total);
  }
  return PMPI_Gatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                      recvtype, root, comm);
}

// MPI_Alltoallv of this rank: `largest` is the largest count or
// count + displacement on either side of one call; `sendbuf` the last
// send buffer (to tell parts passed in place from staged ones).
CallLog g_alltoallv;
const void* g_alltoallv_sendbuf = nullptr;

extern "C" int MPI_Alltoallv(const void* sendbuf, const int sendcounts[],
                             const int sdispls[], MPI_Datatype sendtype,
                             void* recvbuf, const int recvcounts[],
                             const int rdispls[], MPI_Datatype recvtype,
                             MPI_Comm comm) {
  int size = 0;
  PMPI_Comm_size(comm, &size);
  int64_t largest = 0;
  for (int r = 0; r < size; ++r) {
    largest = std::max<int64_t>({largest, int64_t{sendcounts[r]} + sdispls[r],
                                 int64_t{recvcounts[r]} + rdispls[r]});
  }
  g_alltoallv.Record(largest);
  g_alltoallv_sendbuf = sendbuf;
  return PMPI_Alltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf,
                        recvcounts, rdispls, recvtype, comm);
}

extern "C" int MPI_Bcast(void* buffer, int count, MPI_Datatype datatype,
                         int root, MPI_Comm comm) {
  if (datatype == MPI_BYTE) g_bcast_bytes.Record(count);
  return PMPI_Bcast(buffer, count, datatype, root, comm);
}

namespace ckpt {
namespace {

using ::ckpt::testing::Extract;
using ::ckpt::testing::Layout;
using ::ckpt::testing::LayoutName;
using ::ckpt::testing::PieceOf;
using ::ckpt::testing::ReferenceBytes;
using ::ckpt::testing::StatusIs;

// True on every rank iff no rank has a failure in the current test.
// Collective over MPI_COMM_WORLD.
bool NoRankFailed() {
  int failed = ::testing::Test::HasFailure() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return failed == 0;
}

std::unique_ptr<MpiCommunicator> MakeComm(int64_t max_bytes_per_call = 0) {
  MpiCommunicator::Options options;
  if (max_bytes_per_call > 0) options.max_bytes_per_call = max_bytes_per_call;
  auto comm = MpiCommunicator::Create(MPI_COMM_WORLD, options);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? std::move(comm).value() : nullptr;
}

// Rank r's contribution: `length` bytes that differ between ranks and
// positions and include NUL.
std::string Contribution(int rank, size_t length) {
  std::string s(length, '\0');
  for (size_t i = 0; i < length; ++i)
    s[i] = static_cast<char>((rank * 131 + i * 7) % 256);
  return s;
}

// Every rank contributes Contribution(r, lengths[r]); checks what it got.
void CheckAllGather(Communicator& comm, const std::vector<size_t>& lengths) {
  ASSERT_EQ(lengths.size(), static_cast<size_t>(comm.size()));
  auto all = comm.AllGather(Contribution(comm.rank(), lengths[comm.rank()]));
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), lengths.size());
  for (int r = 0; r < comm.size(); ++r) {
    EXPECT_EQ((*all)[r], Contribution(r, lengths[r]))
        << "contribution of rank " << r;
  }
}

// Lengths 0, 1, 3000, 100000, ... (rank 0 contributes nothing).
std::vector<size_t> VaryingLengths(int size) {
  const size_t pattern[] = {0, 1, 3000, 100000};
  std::vector<size_t> lengths;
  for (int r = 0; r < size; ++r) lengths.push_back(pattern[r % 4] + r / 4);
  return lengths;
}

TEST(MpiCommunicatorTest, RankAndSizeAreThoseOfADuplicateOfTheCommunicator) {
  auto comm = MakeComm();
  ASSERT_TRUE(NoRankFailed());
  int rank = 0, size = 0, result = MPI_UNEQUAL;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(comm->rank(), rank);
  EXPECT_EQ(comm->size(), size);
  MPI_Comm_compare(comm->comm(), MPI_COMM_WORLD, &result);
  EXPECT_EQ(result, MPI_CONGRUENT);  // same group, different context
  MPI_Errhandler handler;
  MPI_Comm_get_errhandler(comm->comm(), &handler);
  EXPECT_TRUE(handler == MPI_ERRORS_RETURN);
  MPI_Errhandler_free(&handler);
}

// NodeName is MPI's processor name: the same on every rank of this
// single-machine run, so a cooperative load sees one node.
TEST(MpiCommunicatorTest, NodeNameIsTheProcessorName) {
  auto comm = MakeComm();
  ASSERT_TRUE(NoRankFailed());
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(name, &length);
  EXPECT_EQ(comm->NodeName(), std::string(name, length));
  EXPECT_FALSE(comm->NodeName().empty());
  auto all = comm->AllGather(comm->NodeName());
  ASSERT_TRUE(all.ok()) << all.status();
  for (const std::string& n : *all) EXPECT_EQ(n, comm->NodeName());
}

TEST(MpiCommunicatorTest, CreateRejectsNullCommunicatorAndBadOptions) {
  EXPECT_THAT(MpiCommunicator::Create(MPI_COMM_NULL),
              StatusIs(absl::StatusCode::kInvalidArgument, "MPI_COMM_NULL"));
  MpiCommunicator::Options options;
  options.max_bytes_per_call = 0;
  EXPECT_THAT(
      MpiCommunicator::Create(MPI_COMM_WORLD, options),
      StatusIs(absl::StatusCode::kInvalidArgument, "max_bytes_per_call 0"));
  options.max_bytes_per_call = int64_t{INT_MAX} + 1;
  EXPECT_THAT(MpiCommunicator::Create(MPI_COMM_WORLD, options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "max_bytes_per_call 2147483648"));
}

TEST(MpiCommunicatorTest,
     MpiErrorCodesBecomeStatusNamingTheCallAndMpisMessage) {
  CKPT_EXPECT_OK(internal::MpiStatus(MPI_SUCCESS, "Barrier: MPI_Barrier"));
  absl::Status s =
      internal::MpiStatus(MPI_ERR_TRUNCATE, "AllGather: MPI_Allgatherv");
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kInternal, "AllGather: MPI_Allgatherv: "));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInternal, "truncated"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInternal,
                          "(MPI error class " +
                              std::to_string(MPI_ERR_TRUNCATE) + ")"));
  EXPECT_THAT(
      internal::MpiStatus(MPI_ERR_NO_MEM, "Broadcast: MPI_Bcast"),
      StatusIs(absl::StatusCode::kResourceExhausted, "Broadcast: MPI_Bcast: "));
}

TEST(MpiCommunicatorTest, AllGatherOfVaryingLengthsIncludingEmpty) {
  auto comm = MakeComm();
  ASSERT_TRUE(NoRankFailed());
  g_allgatherv = {};
  CheckAllGather(*comm, VaryingLengths(comm->size()));
  EXPECT_EQ(g_allgatherv.calls, 1) << "everything fits in one MPI_Allgatherv";
}

TEST(MpiCommunicatorTest, AllGatherOfNothingFromEveryRank) {
  auto comm = MakeComm();
  ASSERT_TRUE(NoRankFailed());
  CheckAllGather(*comm, std::vector<size_t>(comm->size(), 0));
}

TEST(MpiCommunicatorTest, AllGatherAboveTheLimitIsSplitIntoCallsWithinIt) {
  auto comm = MakeComm(/*max_bytes_per_call=*/1000);
  ASSERT_TRUE(NoRankFailed());
  // A few rounds only (each is a collective; oversubscribed ranks on a busy
  // machine take milliseconds per round).
  std::vector<size_t> lengths;
  for (int r = 0; r < comm->size(); ++r)
    lengths.push_back(r == 1 ? 2501 : 97 * r);
  g_allgatherv = {};
  CheckAllGather(*comm, lengths);
  EXPECT_GT(g_allgatherv.calls, 1);
  EXPECT_LE(g_allgatherv.largest, 1000);
}

TEST(MpiCommunicatorTest, AllGatherWithALimitOfOneByte) {
  auto comm = MakeComm(/*max_bytes_per_call=*/1);
  ASSERT_TRUE(NoRankFailed());
  std::vector<size_t> lengths;
  for (int r = 0; r < comm->size(); ++r) lengths.push_back((r * 5) % 17);
  CheckAllGather(*comm, lengths);
}

// Every rank contributes Contribution(r, lengths[r]) to `root`: the root
// gets them all, every other rank nothing.
void CheckGather(Communicator& comm, const std::vector<size_t>& lengths,
                 int root) {
  ASSERT_EQ(lengths.size(), static_cast<size_t>(comm.size()));
  auto all = comm.Gather(Contribution(comm.rank(), lengths[comm.rank()]), root);
  ASSERT_TRUE(all.ok()) << all.status();
  if (comm.rank() != root) {
    EXPECT_TRUE(all->empty())
        << "rank " << comm.rank() << " is not the root " << root;
    return;
  }
  ASSERT_EQ(all->size(), lengths.size());
  for (int r = 0; r < comm.size(); ++r) {
    EXPECT_EQ((*all)[r], Contribution(r, lengths[r]))
        << "contribution of rank " << r;
  }
}

TEST(MpiCommunicatorTest,
     GatherToEveryRootReachesOnlyThatRootWithoutAllGatherv) {
  auto comm = MakeComm();
  g_allgatherv = {};
  g_gatherv = {};
  for (int root = 0; root < comm->size(); ++root) {
    ASSERT_TRUE(NoRankFailed());
    CheckGather(*comm, VaryingLengths(comm->size()), root);
  }
  EXPECT_EQ(g_allgatherv.calls, 0) << "the bytes go through MPI_Gatherv only";
  EXPECT_EQ(g_gatherv.calls, 1)
      << "this rank was the root once, and all fit in one call";
}

TEST(MpiCommunicatorTest, GatherOfNothingFromEveryRank) {
  auto comm = MakeComm();
  ASSERT_TRUE(NoRankFailed());
  CheckGather(*comm, std::vector<size_t>(comm->size(), 0), 0);
}

TEST(MpiCommunicatorTest, GatherAboveTheLimitIsSplitIntoCallsWithinIt) {
  auto comm = MakeComm(/*max_bytes_per_call=*/1000);
  ASSERT_TRUE(NoRankFailed());
  std::vector<size_t> lengths;
  for (int r = 0; r < comm->size(); ++r)
    lengths.push_back(r == 1 ? 2501 : 97 * r);
  const int root = comm->size() - 1;
  g_gatherv = {};
  CheckGather(*comm, lengths, root);
  if (comm->rank() == root) {
    EXPECT_GT(g_gatherv.calls, 1);
    EXPECT_LE(g_gatherv.largest, 1000);
  }
}

TEST(MpiCommunicatorTest, GatherToARootOutsideTheCommunicatorFailsOnEveryRank) {
  auto comm = MakeComm();
  ASSERT_TRUE(NoRankFailed());
  EXPECT_THAT(
      comm->Gather("x", comm->size()),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "root " + std::to_string(comm->size()) + " is not a rank"));
  EXPECT_THAT(
      comm->Gather("x", -1),
      StatusIs(absl::StatusCode::kInvalidArgument, "root -1 is not a rank"));
  ASSERT_TRUE(NoRankFailed());
  CKPT_EXPECT_OK(comm->Barrier());
}

TEST(MpiCommunicatorTest, BroadcastFromNonZeroRootsReplacesEveryRanksData) {
  auto comm = MakeComm();
  ASSERT_TRUE(NoRankFailed());
  const int last = comm->size() - 1;
  // Non-roots start with more bytes than the root sends.
  std::string data =
      comm->rank() == last ? Contribution(last, 100) : std::string(5000, 'x');
  CKPT_ASSERT_OK(comm->Broadcast(&data, last));
  EXPECT_EQ(data, Contribution(last, 100));

  // An empty root clears everyone.
  const int middle = comm->size() / 2;
  data = comm->rank() == middle ? std::string() : "stale";
  CKPT_ASSERT_OK(comm->Broadcast(&data, middle));
  EXPECT_EQ(data, "");
}

TEST(MpiCommunicatorTest, BroadcastAboveTheLimitIsSplitIntoCallsWithinIt) {
  auto comm = MakeComm(/*max_bytes_per_call=*/4096);
  ASSERT_TRUE(NoRankFailed());
  const int root = comm->size() - 1;
  const size_t length = 3 * 4096 + 5;
  std::string data =
      comm->rank() == root ? Contribution(root, length) : std::string();
  g_bcast_bytes = {};
  CKPT_ASSERT_OK(comm->Broadcast(&data, root));
  EXPECT_EQ(data, Contribution(root, length));
  EXPECT_EQ(g_bcast_bytes.calls, 4);
  EXPECT_EQ(g_bcast_bytes.largest, 4096);
}

TEST(MpiCommunicatorTest,
     BroadcastFromARootOutsideTheCommunicatorFailsOnEveryRank) {
  auto comm = MakeComm();
  ASSERT_TRUE(NoRankFailed());
  std::string data = "unchanged";
  EXPECT_THAT(
      comm->Broadcast(&data, comm->size()),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "root " + std::to_string(comm->size()) + " is not a rank"));
  EXPECT_THAT(
      comm->Broadcast(&data, -1),
      StatusIs(absl::StatusCode::kInvalidArgument, "root -1 is not a rank"));
  EXPECT_EQ(data, "unchanged");
  // The communicator is still in step: a valid collective follows.
  ASSERT_TRUE(NoRankFailed());
  CKPT_EXPECT_OK(comm->Barrier());
}

TEST(MpiCommunicatorTest, AllReduceMaxIsElementWise) {
  auto comm = MakeComm();
  ASSERT_TRUE(NoRankFailed());
  const int64_t r = comm->rank(), last = comm->size() - 1;
  std::vector<int64_t> values = {r, -r, r == last / 2 ? 100 : -100,
                                 INT64_MIN + r, r == 0 ? INT64_MAX : 0};
  CKPT_ASSERT_OK(comm->AllReduceMax(&values));
  EXPECT_EQ(values,
            (std::vector<int64_t>{last, 0, 100, INT64_MIN + last, INT64_MAX}));
  std::vector<int64_t> none;
  CKPT_EXPECT_OK(comm->AllReduceMax(&none));
  EXPECT_TRUE(none.empty());
}

TEST(MpiCommunicatorTest, AllReduceMaxWithDifferentCountsFailsOnEveryRank) {
  auto comm = MakeComm();
  ASSERT_TRUE(NoRankFailed());
  std::vector<int64_t> values(comm->rank() == 1 % comm->size() ? 3 : 2,
                              comm->rank());
  EXPECT_THAT(comm->AllReduceMax(&values),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "ranks passed different counts"));
  ASSERT_TRUE(NoRankFailed());
  std::vector<int64_t> ok = {comm->rank()};
  CKPT_EXPECT_OK(comm->AllReduceMax(&ok));
  EXPECT_EQ(ok[0], comm->size() - 1);
}

// What rank `from` sends to rank `to` in the AllToAll tests: `size` bytes
// naming both ranks and each byte's position.
std::string PartOf(int from, int to, size_t size) {
  std::string s(size, '\0');
  for (size_t i = 0; i < size; ++i)
    s[i] = static_cast<char>(from * 31 + to * 17 + i * 7);
  return s;
}

// Every rank sends PartOf(me, d, sizes(me, d)) to every d, each part in a
// buffer of its own, and checks what arrives.
void CheckAllToAll(Communicator& comm,
                   const std::function<size_t(int, int)>& sizes) {
  const int n = comm.size(), me = comm.rank();
  std::vector<std::string> out(n), in(n);
  std::vector<SendBuffer> send(n);
  std::vector<RecvBuffer> recv(n);
  for (int p = 0; p < n; ++p) {
    out[p] = PartOf(me, p, sizes(me, p));
    in[p].assign(sizes(p, me), '?');
    send[p] = {out[p].data(), out[p].size()};
    recv[p] = {in[p].data(), in[p].size()};
  }
  CKPT_ASSERT_OK(comm.AllToAll(send, recv, MemoryKind::kHost));
  for (int p = 0; p < n; ++p)
    EXPECT_EQ(in[p], PartOf(p, me, sizes(p, me))) << "part of rank " << p;
}

// 0 to 3000 bytes a pair, some empty, self-sends included.
size_t VaryingPart(int from, int to) { return (from * 7 + to * 3) % 5 * 750; }

TEST(MpiCommunicatorTest, AllToAllOfVaryingSizesInOneCall) {
  auto comm = MakeComm();
  ASSERT_TRUE(NoRankFailed());
  g_alltoallv = {};
  CheckAllToAll(*comm, VaryingPart);
  EXPECT_EQ(g_alltoallv.calls, 1) << "everything fits in one MPI_Alltoallv";
}

TEST(MpiCommunicatorTest, AllToAllOfNothingMakesNoAlltoallv) {
  auto comm = MakeComm();
  ASSERT_TRUE(NoRankFailed());
  g_alltoallv = {};
  CheckAllToAll(*comm, [](int, int) { return size_t{0}; });
  EXPECT_EQ(g_alltoallv.calls, 0);
}

TEST(MpiCommunicatorTest, AllToAllAboveATinyLimitTakesRoundsWithinIt) {
  auto comm = MakeComm(/*max_bytes_per_call=*/7);
  ASSERT_TRUE(NoRankFailed());
  g_alltoallv = {};
  CheckAllToAll(*comm, [](int from, int to) {
    return static_cast<size_t>((from * 5 + to * 3) % 7 * 4);  // 0 to 24
  });
  EXPECT_GT(g_alltoallv.calls, 5);
  EXPECT_LE(g_alltoallv.largest, 7);
}

TEST(MpiCommunicatorTest, AllToAllWithALimitOfOneByte) {
  auto comm = MakeComm(/*max_bytes_per_call=*/1);
  ASSERT_TRUE(NoRankFailed());
  g_alltoallv = {};
  CheckAllToAll(*comm, [](int from, int to) { return size_t(from + to); });
  EXPECT_LE(g_alltoallv.largest, 1);
}

// Parts packed in one buffer within the limit go to MPI in place (its send
// buffer is the caller's), not through a staging copy.
TEST(MpiCommunicatorTest, AllToAllOfPartsPackedInOneBufferIsInPlace) {
  auto comm = MakeComm();
  ASSERT_TRUE(NoRankFailed());
  const int n = comm->size(), me = comm->rank();
  std::string out, in(100 * n, '?');
  std::vector<SendBuffer> send(n);
  std::vector<RecvBuffer> recv(n);
  for (int p = 0; p < n; ++p) out += PartOf(me, p, 100);
  for (int p = 0; p < n; ++p) {
    send[p] = {out.data() + 100 * p, 100};
    recv[p] = {in.data() + 100 * p, 100};
  }
  g_alltoallv = {};
  CKPT_ASSERT_OK(comm->AllToAll(send, recv, MemoryKind::kHost));
  EXPECT_EQ(g_alltoallv.calls, 1);
  // Rank 0's own part is copied locally: MPI's buffer starts at part 1.
  EXPECT_EQ(g_alltoallv_sendbuf, me == 0 ? out.data() + 100 : out.data());
  for (int p = 0; p < n; ++p)
    EXPECT_EQ(in.substr(100 * p, 100), PartOf(p, me, 100)) << "rank " << p;
}

// Parts farther apart than the limit go through a staging buffer: MPI's
// send buffer is none of the caller's.
TEST(MpiCommunicatorTest, AllToAllOfScatteredPartsIsStagedWithinTheLimit) {
  auto comm = MakeComm(/*max_bytes_per_call=*/1000);
  ASSERT_TRUE(NoRankFailed());
  const int n = comm->size(), me = comm->rank();
  // 100-byte parts at the start of 1 MiB allocations: never within 1000
  // bytes of each other.
  std::vector<std::string> out(n, std::string(1 << 20, '\0')),
      in(n, std::string(1 << 20, '?'));
  std::vector<SendBuffer> send(n);
  std::vector<RecvBuffer> recv(n);
  for (int p = 0; p < n; ++p) {
    out[p].replace(0, 100, PartOf(me, p, 100));
    send[p] = {out[p].data(), 100};
    recv[p] = {in[p].data(), 100};
  }
  g_alltoallv = {};
  CKPT_ASSERT_OK(comm->AllToAll(send, recv, MemoryKind::kHost));
  EXPECT_EQ(g_alltoallv.calls, 1);
  EXPECT_LE(g_alltoallv.largest, 1000);
  for (int p = 0; p < n; ++p) {
    const char* b = static_cast<const char*>(g_alltoallv_sendbuf);
    EXPECT_FALSE(b >= out[p].data() && b < out[p].data() + out[p].size())
        << "MPI was given part " << p << " in place";
    EXPECT_EQ(in[p].substr(0, 100), PartOf(p, me, 100)) << "rank " << p;
  }
}

TEST(MpiCommunicatorTest, AllToAllPlanKeepsEveryCallWithinTheLimit) {
  using internal::PlanAllToAll;
  // Nothing to send: no calls.
  EXPECT_EQ(PlanAllToAll(0, 0, 0, 4, 100).groups, 0);
  // Everything fits: one call of whole parts.
  internal::AllToAllPlan p = PlanAllToAll(60, 100, 3, 4, 100);
  EXPECT_EQ(p.groups * p.rounds, 1);
  EXPECT_EQ(p.piece, 60);
  EXPECT_EQ(p.shifts_per_group, 3);
  // Above the limit: pieces of limit / fan bytes.
  p = PlanAllToAll(1000, 2500, 4, 16, 100);
  EXPECT_EQ(p.piece, 25);
  EXPECT_EQ(p.groups, 1);
  EXPECT_EQ(p.rounds, 40);
  // A limit below the fan: 1-byte pieces to `limit` peers per call.
  p = PlanAllToAll(5, 50, 10, 11, 3);
  EXPECT_EQ(p.piece, 1);
  EXPECT_EQ(p.shifts_per_group, 3);
  EXPECT_EQ(p.groups, 4);  // distances 1-3, 4-6, 7-9, 10
  EXPECT_EQ(p.rounds, 5);
}

// Rank 2 expects 5 bytes from rank 1, which sends 3: every rank returns
// the receiver's error, and the communicator stays usable.
TEST(MpiCommunicatorTest, AllToAllSizeMismatchFailsEveryRankWithoutHanging) {
  auto comm = MakeComm(/*max_bytes_per_call=*/4);
  ASSERT_TRUE(NoRankFailed());
  const int n = comm->size();
  std::string out(3, 'x'), in(8 * n, '?');
  std::vector<SendBuffer> send(n, SendBuffer{out.data(), 3});
  std::vector<RecvBuffer> recv;
  for (int p = 0; p < n; ++p) recv.push_back({&in[8 * p], 3});
  if (comm->rank() == 2 % n) recv[1 % n].size = 5;
  g_alltoallv = {};
  EXPECT_THAT(
      comm->AllToAll(send, recv, MemoryKind::kHost),
      StatusIs(absl::StatusCode::kInvalidArgument,
               absl::StrCat("AllToAll: rank ", 1 % n, " sends 3 bytes to rank ",
                            2 % n, ", which expects 5")));
  EXPECT_EQ(g_alltoallv.calls, 0) << "no bytes move after a mismatch";
  ASSERT_TRUE(NoRankFailed());
  CheckAllToAll(*comm, VaryingPart);
}

TEST(MpiCommunicatorTest, AllToAllWithBadArgumentsOnOneRankFailsEveryRank) {
  auto comm = MakeComm();
  ASSERT_TRUE(NoRankFailed());
  const int n = comm->size(), bad = n - 1;
  const size_t count = comm->rank() == bad ? n + 1 : n;
  std::vector<SendBuffer> send(count);
  std::vector<RecvBuffer> recv(count);
  EXPECT_THAT(comm->AllToAll(send, recv, MemoryKind::kHost),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       absl::StrCat("AllToAll on rank ", bad, ": expected ", n,
                                    " send and receive buffers")));
  ASSERT_TRUE(NoRankFailed());
  CheckAllToAll(*comm, VaryingPart);
}

// A shared temporary directory: created by rank 0, its path broadcast, and
// removed by rank 0 after every rank is done with it. Collective.
class SharedTempDir {
 public:
  explicit SharedTempDir(Communicator& comm) : comm_(comm) {
    if (comm.rank() == 0) {
      std::string tmpl =
          (std::filesystem::temp_directory_path() / "ckpt-mpi-test-XXXXXX")
              .string();
      if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
    }
    status_ = comm.Broadcast(&path_, 0);
    if (status_.ok() && path_.empty())
      status_ = absl::InternalError("mkdtemp failed on rank 0");
  }
  ~SharedTempDir() {
    (void)comm_.Barrier();
    if (comm_.rank() == 0 && !path_.empty()) std::filesystem::remove_all(path_);
  }
  const absl::Status& status() const { return status_; }
  const std::string& path() const { return path_; }

 private:
  Communicator& comm_;
  std::string path_;
  absl::Status status_;
};

TEST(MpiCommunicatorTest, BarrierHoldsEveryRankUntilRankZeroArrives) {
  auto comm = MakeComm();
  ASSERT_TRUE(NoRankFailed());
  SharedTempDir dir(*comm);
  CKPT_ASSERT_OK(dir.status());
  const std::string marker = dir.path() + "/marker";
  if (comm->rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    FILE* f = fopen(marker.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fclose(f);
  }
  CKPT_ASSERT_OK(comm->Barrier());
  EXPECT_TRUE(std::filesystem::exists(marker))
      << "rank " << comm->rank() << " left early";
}

// --- A multi-rank save and a resharded load through the MPI communicator.

struct TestTensor {
  std::string name;
  DType dtype;
  Shape shape;
  Layout save_layout;
  Layout load_layout;  // differs from save_layout: every load reshards
  std::string global;  // reference bytes, the same on every rank
};

std::vector<TestTensor> Tensors() {
  std::vector<TestTensor> out = {
      {"layers.0.w",
       DType::kFloat32,
       {12, 10},
       Layout::kRows,
       Layout::kCols,
       ""},
      {"layers.0.b",
       DType::kBFloat16,
       {6, 9},
       Layout::kCols,
       Layout::kRows,
       ""},
      {"norm.scale",
       DType::kFloat64,
       {7},
       Layout::kReplicated,
       Layout::kFlatUneven,
       ""},
      {"opt.exp_avg",
       DType::kFloat32,
       {5, 8},
       Layout::kFlatUneven,
       Layout::kGrid,
       ""},
  };
  uint64_t seed = 7;
  for (TestTensor& t : out) t.global = ReferenceBytes(t.dtype, t.shape, seed++);
  return out;
}

constexpr int kObjectRank = 2;
const char kObjectName[] = "loader.state";
std::string ObjectBytes() { return std::string("epoch=3\0sample=123456", 21); }

class MpiSaveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = MakeComm();
    ASSERT_TRUE(NoRankFailed());
    ASSERT_GT(comm_->size(), kObjectRank) << "run with at least 3 ranks";
    dir_ = std::make_unique<SharedTempDir>(*comm_);
    CKPT_ASSERT_OK(dir_->status());
    root_ = dir_->path() + "/run";
    tensors_ = Tensors();
    Writer::Options wo;
    wo.comm = comm_.get();
    CKPT_ASSERT_OK_AND_ASSIGN(writer_, Writer::Create(wo));
  }
  void TearDown() override {
    writer_.reset();
    dir_.reset();  // collective: every rank gets here, also after a failure
    comm_.reset();
  }

  // Registers this rank's saved piece of every tensor (and the object on
  // kObjectRank).
  void RegisterAll() {
    pieces_.assign(tensors_.size(), std::string());
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const TestTensor& t = tensors_[i];
      auto piece =
          PieceOf(t.save_layout, t.shape, comm_->rank(), comm_->size());
      pieces_[i] = Extract(t.global, t.dtype, t.shape, piece.region);
      TensorOptions to;
      to.replica = piece.replica;
      CKPT_EXPECT_OK(writer_->AddTensor(t.name, t.dtype, t.shape, piece.region,
                                        pieces_[i].data(), to));
    }
    if (comm_->rank() == kObjectRank) {
      CKPT_EXPECT_OK(writer_->SetObject(kObjectName, ObjectBytes()));
    }
  }

  std::unique_ptr<MpiCommunicator> comm_;
  std::unique_ptr<SharedTempDir> dir_;
  std::string root_;
  std::vector<TestTensor> tensors_;
  std::vector<std::string> pieces_;  // registered memory: alive across Save
  std::unique_ptr<Writer> writer_;
};

TEST_F(MpiSaveTest, SaveOnEveryRankThenLoadReshardedOnEveryRank) {
  RegisterAll();
  ASSERT_TRUE(NoRankFailed());
  auto saved = writer_->Save(root_, 1, SaveOptions());
  ASSERT_TRUE(saved.ok()) << "rank " << comm_->rank() << ": " << saved.status();
  EXPECT_EQ(saved->path, root_ + "/step-00000001");
  // The replica is written once: stored bytes are the unique bytes.
  uint64_t unique = ObjectBytes().size();
  for (const TestTensor& t : tensors_) unique += t.global.size();
  EXPECT_EQ(saved->logical_bytes, unique);
  EXPECT_EQ(saved->stored_bytes, unique);
  ASSERT_TRUE(NoRankFailed());

  // Every rank loads a different piece than the one it saved, under a
  // different layout, from another rank's position.
  auto reader = Reader::Open(root_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->manifest().info.world_size,
            static_cast<uint32_t>(comm_->size()));
  EXPECT_EQ((*reader)->manifest().shards.size(),
            static_cast<size_t>(comm_->size()));
  const format::EntryRecord* replicated = (*reader)->Find("norm.scale");
  ASSERT_NE(replicated, nullptr);
  EXPECT_EQ(replicated->chunks.size(), 1u)
      << "the replicated tensor was written more than once";

  const int as_rank = (comm_->rank() + 1) % comm_->size();
  std::vector<std::string> bufs(tensors_.size());
  std::vector<LoadRequest> reqs;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TestTensor& t = tensors_[i];
    auto piece = PieceOf(t.load_layout, t.shape, as_rank, comm_->size());
    bufs[i].assign(RegionElements(piece.region) * DTypeSize(t.dtype), '\xEE');
    reqs.push_back({t.name, t.dtype, t.shape, piece.region, bufs[i].data()});
  }
  std::string object;
  LoadRequest object_request;
  object_request.name = kObjectName;
  object_request.object = &object;
  reqs.push_back(object_request);
  auto report = (*reader)->Load(reqs);  // strict: every entry is requested
  ASSERT_TRUE(report.ok()) << "rank " << comm_->rank() << ": "
                           << report.status();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TestTensor& t = tensors_[i];
    auto piece = PieceOf(t.load_layout, t.shape, as_rank, comm_->size());
    EXPECT_EQ(bufs[i], Extract(t.global, t.dtype, t.shape, piece.region))
        << "rank " << comm_->rank() << " tensor " << t.name << " region "
        << RegionToString(piece.region);
  }
  EXPECT_EQ(object, ObjectBytes());
}

// Cooperative loads over MpiCommunicator (ReaderOptions::communicator):
// every layout of the resharding matrix, compared with the reference; the
// ranks read between them exactly what one rank reading all their requests
// reads (each block once); a bad request on one rank fails every rank with
// the same status.
TEST_F(MpiSaveTest, SaveThenLoadCooperativelyUnderEveryLayout) {
  RegisterAll();
  ASSERT_TRUE(NoRankFailed());
  CKPT_ASSERT_OK(writer_->Save(root_, 1, SaveOptions()));
  ASSERT_TRUE(NoRankFailed());
  ReaderOptions ro;
  ro.communicator = comm_.get();
  auto reader = Reader::Open(root_, ro);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto alone = Reader::Open(root_);  // the reference for the bytes read
  ASSERT_TRUE(alone.ok()) << alone.status();
  LoadOptions lo;
  lo.filter = [](const std::string& n) { return n != kObjectName; };
  const int size = comm_->size();
  for (Layout layout : ::ckpt::testing::kAllLayouts) {
    std::vector<std::string> bufs(tensors_.size());
    std::vector<LoadRequest> reqs;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const TestTensor& t = tensors_[i];
      auto piece = PieceOf(layout, t.shape, comm_->rank(), size);
      bufs[i].assign(RegionElements(piece.region) * DTypeSize(t.dtype), '\xEE');
      reqs.push_back({t.name, t.dtype, t.shape, piece.region, bufs[i].data()});
    }
    auto report = (*reader)->Load(reqs, lo);
    ASSERT_TRUE(report.ok())
        << "rank " << comm_->rank() << ": " << report.status();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const TestTensor& t = tensors_[i];
      auto piece = PieceOf(layout, t.shape, comm_->rank(), size);
      EXPECT_EQ(bufs[i], Extract(t.global, t.dtype, t.shape, piece.region))
          << "rank " << comm_->rank() << " layout " << LayoutName(layout)
          << " tensor " << t.name;
    }
    // Every rank's requests, read by one rank alone.
    std::vector<std::string> scratch;
    scratch.reserve(size * tensors_.size());
    std::vector<LoadRequest> all;
    for (int r = 0; r < size; ++r) {
      for (const TestTensor& t : tensors_) {
        auto piece = PieceOf(layout, t.shape, r, size);
        scratch.emplace_back(RegionElements(piece.region) * DTypeSize(t.dtype),
                             '\0');
        all.push_back(
            {t.name, t.dtype, t.shape, piece.region, scratch.back().data()});
      }
    }
    auto single = (*alone)->Load(all, lo);
    ASSERT_TRUE(single.ok()) << single.status();
    int64_t read = static_cast<int64_t>(report->bytes_read);
    MPI_Allreduce(MPI_IN_PLACE, &read, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(static_cast<uint64_t>(read), single->bytes_read)
        << LayoutName(layout);
    ASSERT_TRUE(NoRankFailed());
  }
  // A dtype mismatch on rank 1 only.
  std::vector<std::string> bufs(tensors_.size());
  std::vector<LoadRequest> reqs;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TestTensor& t = tensors_[i];
    bufs[i].assign(t.global.size(), '\0');
    reqs.push_back(
        {t.name, t.dtype, t.shape, FullBox(t.shape), bufs[i].data()});
  }
  if (comm_->rank() == 1) reqs[0].dtype = DType::kInt32;
  auto failed = (*reader)->Load(reqs, lo);
  EXPECT_THAT(failed.status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "rank 1 of " + std::to_string(size) +
                           ": layers.0.w: dtype float32 in checkpoint, int32 "
                           "requested"));
}

TEST_F(MpiSaveTest, InconsistentShapeOnOneRankFailsEveryRankAndCommitsNothing) {
  RegisterAll();
  ASSERT_TRUE(NoRankFailed());
  CKPT_ASSERT_OK(writer_->Save(root_, 1, SaveOptions()).status());
  ASSERT_TRUE(NoRankFailed());

  // The last rank re-registers its piece of layers.0.w under a taller shape.
  const int odd = comm_->size() - 1;
  if (comm_->rank() == odd) {
    const TestTensor& t = tensors_[0];
    auto piece = PieceOf(t.save_layout, t.shape, odd, comm_->size());
    CKPT_EXPECT_OK(writer_->Remove(t.name));
    CKPT_EXPECT_OK(writer_->AddTensor(t.name, t.dtype, {13, 10}, piece.region,
                                      pieces_[0].data()));
  }
  ASSERT_TRUE(NoRankFailed());
  absl::Status status = writer_->Save(root_, 2, SaveOptions()).status();
  EXPECT_THAT(
      status,
      StatusIs(absl::StatusCode::kInvalidArgument,
               "entry 'layers.0.w': global shape differs between ranks"));
  EXPECT_THAT(status,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "rank " + std::to_string(odd) + " has [13, 10]"));
  ASSERT_TRUE(NoRankFailed());

  // The same status on every rank.
  auto all = comm_->AllGather(status.ToString());
  ASSERT_TRUE(all.ok()) << all.status();
  for (int r = 0; r < comm_->size(); ++r) {
    EXPECT_EQ((*all)[r], status.ToString())
        << "rank " << r << " differs from rank " << comm_->rank();
  }
  CKPT_ASSERT_OK(comm_->Barrier());

  // Nothing of step 2 exists, not even a temporary directory; latest is 1.
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(root_)) {
    names.insert(e.path().filename().string());
  }
  EXPECT_EQ(names.count(format::StepDirName(1)), 1u);
  EXPECT_EQ(names.count(format::StepDirName(2)), 0u);
  for (const std::string& name : names) {
    EXPECT_NE(name.rfind(format::kTempDirPrefix, 0), 0u)
        << "left behind: " << name;
  }
  auto reader = Reader::Open(root_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->manifest().info.step, 1u);
}

// More than INT_MAX bytes in one AllGather and one Broadcast. Needs about
// 5 GiB of memory per rank, so it is not part of the suite; run it by hand:
//   mpirun -np 2 build/tests/libckpt_mpi_save_test
//     --gtest_also_run_disabled_tests --gtest_filter='*OverTwoGiB*'
TEST(MpiCommunicatorTest, DISABLED_AllGatherAndBroadcastOverTwoGiB) {
  auto comm = MakeComm(INT_MAX);  // the largest limit: calls just under 2 GiB
  ASSERT_TRUE(NoRankFailed());
  const size_t each =
      (size_t{INT_MAX} + 1) / comm->size() + 4097;  // total > INT_MAX
  std::string mine(each, static_cast<char>('a' + comm->rank()));
  mine[each - 1] = 'Z';
  g_allgatherv = {};
  auto start = std::chrono::steady_clock::now();
  auto all = comm->AllGather(mine);
  ASSERT_TRUE(all.ok()) << all.status();
  for (int r = 0; r < comm->size(); ++r) {
    ASSERT_EQ((*all)[r].size(), each);
    EXPECT_EQ((*all)[r][0], 'a' + r);
    EXPECT_EQ((*all)[r][each - 1], 'Z');
  }
  EXPECT_GT(g_allgatherv.calls, 1);
  EXPECT_LE(g_allgatherv.largest, INT_MAX);
  all->clear();
  double gather_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_TRUE(NoRankFailed());

  std::string data;
  if (comm->rank() == 0) data.assign(size_t{INT_MAX} + 4097, 'b');
  g_bcast_bytes = {};
  start = std::chrono::steady_clock::now();
  CKPT_ASSERT_OK(comm->Broadcast(&data, 0));
  double bcast_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_EQ(data.size(), size_t{INT_MAX} + 4097);
  EXPECT_EQ(data.find_first_not_of('b'), std::string::npos);
  EXPECT_EQ(g_bcast_bytes.calls, 2);
  if (comm->rank() == 0) {
    printf(
        "AllGather of %zu bytes in %.2f s; Broadcast of %zu bytes in %.2f s\n",
        each * comm->size(), gather_s, data.size(), bcast_s);
  }
}

// Prints failures of ranks other than 0, prefixed with the rank; rank 0
// keeps gtest's usual output.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
            result.file_name() ? result.file_name() : "?", result.line_number(),
            result.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(),
              info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  int provided = 0;
  // ckpt's I/O threads never call MPI: FUNNELED is all ckpt needs.
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) !=
      MPI_SUCCESS) {
    fprintf(stderr, "mpi_save_test: MPI_Init_thread failed\n");
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) {
    fprintf(
        stderr,
        "mpi_save_test: run it under mpirun with 4 ranks (this job has %d)\n",
        size);
    MPI_Finalize();
    return 1;
  }
  if (rank != 0) {
    ::testing::TestEventListeners& listeners =
        ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new ckpt::RankFailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) {
    printf("mpi_save_test: %s on %d ranks\n",
           failed ? "FAILED (see above)" : "passed", size);
  }
  MPI_Finalize();
  return failed;
}

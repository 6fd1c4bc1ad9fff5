// The AllToAll contract, checked on the default implementation (through an
// adapter that implements only the four required collectives) and on every
// communicator that overrides it.
#include "ckpt/communicator.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

// Forwards the required collectives only, so AllToAll is the default.
class MinimalAdapter final : public Communicator {
 public:
  explicit MinimalAdapter(Communicator* inner) : inner_(inner) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::StatusOr<std::vector<std::string>> AllGather(
      absl::string_view mine) override {
    return inner_->AllGather(mine);
  }
  absl::Status Broadcast(std::string* data, int root) override {
    return inner_->Broadcast(data, root);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  absl::Status AllReduceMax(std::vector<int64_t>* values) override {
    return inner_->AllReduceMax(values);
  }

 private:
  Communicator* inner_;
};

// What rank `from` sends to rank `to`: (from * 7 + to) % 5 * 3 bytes, some
// of them empty, each byte naming both ranks and its position.
std::string Payload(int from, int to) {
  std::string s((from * 7 + to) % 5 * 3, '\0');
  for (size_t i = 0; i < s.size(); ++i) {
    s[i] = static_cast<char>(from * 31 + to * 17 + static_cast<int>(i));
  }
  return s;
}

absl::Status ExchangeAndCheck(Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  std::vector<std::string> out(n), in(n);
  std::vector<SendBuffer> send(n);
  std::vector<RecvBuffer> recv(n);
  for (int p = 0; p < n; ++p) {
    out[p] = Payload(me, p);
    in[p].assign(Payload(p, me).size(), '?');
    send[p] = {out[p].data(), out[p].size()};
    recv[p] = {in[p].data(), in[p].size()};
  }
  absl::Status s = comm.AllToAll(send, recv, MemoryKind::kHost);
  if (!s.ok()) return s;
  for (int p = 0; p < n; ++p) {
    if (in[p] != Payload(p, me)) {
      return absl::InternalError(
          absl::StrCat("rank ", me, " got wrong bytes from rank ", p));
    }
  }
  return absl::OkStatus();
}

TEST(AllToAll, DefaultDeliversEveryPairIncludingSelfAndEmpty) {
  InProcessWorld world(4);
  EXPECT_TRUE(RunRanks(world, [](Communicator& comm) {
                MinimalAdapter adapter(&comm);
                return ExchangeAndCheck(adapter);
              }).ok());
}

TEST(AllToAll, InProcessDeliversEveryPairIncludingSelfAndEmpty) {
  InProcessWorld world(4);
  EXPECT_TRUE(RunRanks(world, ExchangeAndCheck).ok());
}

TEST(AllToAll, SizeMismatchNamesBothRanks) {
  InProcessWorld world(2);
  absl::Status s = RunRanks(world, [](Communicator& comm) {
    MinimalAdapter adapter(&comm);
    std::string out(comm.rank() == 0 ? 4 : 0, 'x'), in(8, '?');
    std::vector<SendBuffer> send = {{out.data(), 0}, {out.data(), out.size()}};
    std::vector<RecvBuffer> recv = {{in.data(), 0}, {in.data(), 0}};
    if (comm.rank() == 1) recv[0].size = 8;  // rank 0 sends only 4
    return adapter.AllToAll(send, recv, MemoryKind::kHost);
  });
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rank 0 sends 4 bytes to rank 1, which expects 8"),
            std::string::npos)
      << s;
}

TEST(AllToAll, WrongNumberOfBuffersIsInvalidArgument) {
  SingleProcessCommunicator comm;
  std::vector<SendBuffer> send(2);
  std::vector<RecvBuffer> recv(1);
  absl::Status s = comm.AllToAll(send, recv, MemoryKind::kHost);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expected 1 send and receive buffers"),
            std::string::npos)
      << s;
}

TEST(AllToAll, DeviceMemoryRefusedWithoutSupport) {
  SingleProcessCommunicator comm;
  std::vector<SendBuffer> send(1);
  std::vector<RecvBuffer> recv(1);
  absl::Status s = comm.AllToAll(send, recv, MemoryKind::kCuda);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("only host memory"), std::string::npos) << s;
}

// Runs `fn` on every rank of an in-process world of `ranks`, through the
// default AllToAll (`adapter`) or InProcessCommunicator's, and returns
// every rank's status.
std::vector<absl::Status> EveryRank(
    int ranks, bool adapter,
    const std::function<absl::Status(Communicator&)>& fn) {
  InProcessWorld world(ranks);
  std::vector<absl::Status> out(ranks);
  absl::Status first = RunRanks(world, [&](Communicator& comm) {
    MinimalAdapter wrapped(&comm);
    out[comm.rank()] = adapter ? fn(wrapped) : fn(comm);
    return absl::OkStatus();
  });
  EXPECT_TRUE(first.ok()) << first;
  return out;
}

// The default and InProcessCommunicator's AllToAll keep the same contract.
class AllToAllContract : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(DefaultAndInProcess, AllToAllContract,
                         ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Default" : "InProcess";
                         });

TEST_P(AllToAllContract, SixteenRanks) {
  for (const absl::Status& s : EveryRank(16, GetParam(), ExchangeAndCheck))
    EXPECT_TRUE(s.ok()) << s;
}

// Back-to-back calls: a rank that returns early and posts its next call's
// buffers must not disturb a peer still copying from the previous one.
TEST_P(AllToAllContract, ManyCallsInARowEachDeliverTheirOwnBytes) {
  auto fn = [](Communicator& comm) {
    for (int call = 0; call < 50; ++call) {
      const int n = comm.size(), me = comm.rank();
      std::vector<std::string> out(n), in(n);
      std::vector<SendBuffer> send(n);
      std::vector<RecvBuffer> recv(n);
      for (int p = 0; p < n; ++p) {
        out[p] = absl::StrCat(call, ":", me, "->", p);
        in[p].assign(absl::StrCat(call, ":", p, "->", me).size(), '?');
        send[p] = {out[p].data(), out[p].size()};
        recv[p] = {in[p].data(), in[p].size()};
      }
      CKPT_RETURN_IF_ERROR(comm.AllToAll(send, recv, MemoryKind::kHost));
      for (int p = 0; p < n; ++p) {
        if (in[p] != absl::StrCat(call, ":", p, "->", me))
          return absl::InternalError(absl::StrCat("call ", call, ": ", in[p]));
      }
    }
    return absl::OkStatus();
  };
  for (const absl::Status& s : EveryRank(4, GetParam(), fn))
    EXPECT_TRUE(s.ok()) << s;
}

// Rank 2 expects 5 bytes from rank 1, which sends 3: every rank returns
// (none waits for the others) with the receiver's error.
TEST_P(AllToAllContract, SizeMismatchFailsEveryRankWithTheSameError) {
  auto fn = [](Communicator& comm) {
    const int n = comm.size();
    std::string out(3, 'x'), in(8 * n, '?');
    std::vector<SendBuffer> send(n, SendBuffer{out.data(), 3});
    std::vector<RecvBuffer> recv;
    for (int p = 0; p < n; ++p) recv.push_back({&in[8 * p], 3});
    if (comm.rank() == 2) recv[1].size = 5;
    return comm.AllToAll(send, recv, MemoryKind::kHost);
  };
  for (const absl::Status& s : EveryRank(4, GetParam(), fn)) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                            "AllToAll: rank 1 sends 3 bytes to rank 2, which "
                            "expects 5"));
  }
}

// Ranks 1 and 3 pass too few buffers: every rank fails with rank 1's error
// (the lowest failing rank) and nobody hangs.
TEST_P(AllToAllContract, BadArgumentsOnSomeRanksFailEveryRank) {
  auto fn = [](Communicator& comm) {
    const size_t n = comm.rank() % 2 == 1 ? 2 : comm.size();
    std::vector<SendBuffer> send(n);
    std::vector<RecvBuffer> recv(n);
    return comm.AllToAll(send, recv, MemoryKind::kHost);
  };
  for (const absl::Status& s : EveryRank(4, GetParam(), fn)) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                            "AllToAll on rank 1: expected 4 send and receive "
                            "buffers (one per rank), got 2 and 2"));
  }
}

TEST_P(AllToAllContract, DeviceMemoryOnOneRankFailsEveryRank) {
  auto fn = [](Communicator& comm) {
    std::vector<SendBuffer> send(comm.size());
    std::vector<RecvBuffer> recv(comm.size());
    return comm.AllToAll(
        send, recv, comm.rank() == 2 ? MemoryKind::kCuda : MemoryKind::kHost);
  };
  for (const absl::Status& s : EveryRank(3, GetParam(), fn)) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                            "AllToAll on rank 2: this communicator moves only "
                            "host memory"));
  }
}

// A large exchange (some MiB per pair) arrives intact: in-process
// receivers copy straight from the senders' buffers.
TEST_P(AllToAllContract, LargePartsArriveIntact) {
  auto fn = [](Communicator& comm) {
    const int n = comm.size(), me = comm.rank();
    const size_t bytes = (size_t{1} << 20) + 17;
    std::vector<std::string> out(n), in(n, std::string(bytes, '?'));
    std::vector<SendBuffer> send(n);
    std::vector<RecvBuffer> recv(n);
    for (int p = 0; p < n; ++p) {
      out[p].assign(bytes, static_cast<char>(me * 16 + p));
      send[p] = {out[p].data(), bytes};
      recv[p] = {in[p].data(), bytes};
    }
    CKPT_RETURN_IF_ERROR(comm.AllToAll(send, recv, MemoryKind::kHost));
    for (int p = 0; p < n; ++p) {
      if (in[p] != std::string(bytes, static_cast<char>(p * 16 + me)))
        return absl::InternalError(absl::StrCat("wrong bytes from ", p));
    }
    return absl::OkStatus();
  };
  for (const absl::Status& s : EveryRank(3, GetParam(), fn))
    EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace ckpt

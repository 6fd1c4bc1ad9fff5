// The AllToAll contract, checked on the default implementation (through an
// adapter that implements only the four required collectives) and on every
// communicator that overrides it.
#include "ckpt/communicator.h"

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/in_process.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

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

}  // namespace
}  // namespace ckpt

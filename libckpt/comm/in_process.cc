#include "ckpt/in_process.h"

#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/status_macros.h"
#include "util/mutex.h"

namespace ckpt {

// The meeting point of the ranks' collectives: each deposits its
// contribution and waits until every rank has, then all read the result.
class InProcessWorld::Rendezvous {
 public:
  explicit Rendezvous(int size) : size_(size) {
    MutexLock l(&mu_);
    slots_.resize(size);
  }

  std::vector<std::string> Exchange(int rank, std::string mine) {
    MutexLock l(&mu_);
    slots_[rank] = std::move(mine);
    const uint64_t gen = generation_;
    if (++arrived_ == size_) {
      // The previous result is no longer read: every rank has deposited into
      // this round, so each has finished reading the last one.
      result_.swap(slots_);
      slots_.assign(size_, std::string());
      arrived_ = 0;
      ++generation_;
      round_done_.SignalAll();
    } else {
      while (generation_ == gen) round_done_.Wait(&mu_);
    }
    return result_;
  }

 private:
  const int size_;
  Mutex mu_;
  CondVar round_done_;  // generation_ moved on
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> result_ ABSL_GUARDED_BY(mu_);
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(InProcessWorld* world, int rank)
      : world_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return world_->size(); }

  absl::StatusOr<std::vector<std::string>> AllGather(
      absl::string_view mine) override {
    return world_->Exchange(rank_, std::string(mine));
  }
  absl::Status Broadcast(std::string* data, int root) override {
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("broadcast root ", root, " out of range"));
    }
    auto all = world_->Exchange(rank_, rank_ == root ? *data : std::string());
    *data = std::move(all[root]);
    return absl::OkStatus();
  }
  absl::Status Barrier() override {
    world_->Exchange(rank_, std::string());
    return absl::OkStatus();
  }
  absl::Status AllToAll(absl::Span<const SendBuffer> send,
                        absl::Span<const RecvBuffer> recv,
                        MemoryKind memory) override;
  bool SharesAddressSpace() const override { return true; }
  std::string NodeName() const override {
    const auto& names = world_->node_names_;
    return static_cast<size_t>(rank_) < names.size() ? names[rank_] : "";
  }
  absl::Status AllReduceMax(std::vector<int64_t>* values) override {
    std::string mine;
    for (int64_t v : *values)
      format::PutFixed64(&mine, static_cast<uint64_t>(v));
    auto all = world_->Exchange(rank_, mine);
    for (const std::string& s : all) {
      if (s.size() != mine.size()) {
        return absl::InvalidArgumentError(
            "AllReduceMax: ranks passed different counts");
      }
      for (size_t i = 0; i < values->size(); ++i) {
        (*values)[i] = std::max(
            (*values)[i],
            static_cast<int64_t>(format::LoadFixed64(s.data() + 8 * i)));
      }
    }
    return absl::OkStatus();
  }

 private:
  InProcessWorld* world_;
  int rank_;
};

namespace {

// The address of a rank's array of send buffers, as AllToAll posts it: 8
// bytes, or nothing when that rank's arguments are bad.
std::string PostAddress(absl::Span<const SendBuffer> send) {
  std::string out(sizeof(const SendBuffer*), '\0');
  const SendBuffer* data = send.data();
  std::memcpy(out.data(), &data, sizeof(data));
  return out;
}

const SendBuffer* PostedAddress(const std::string& posted) {
  const SendBuffer* data = nullptr;
  std::memcpy(&data, posted.data(), sizeof(data));
  return data;
}

}  // namespace

// Each byte is copied once, by its receiver, straight from the sender's
// buffer. The first rendezvous publishes every rank's send array; the
// second (AgreeOnFirstError's AllReduceMax) holds every sender until all
// receivers have copied, so that the arrays and buffers stay valid, and
// makes any rank's error every rank's.
absl::Status InProcessCommunicator::AllToAll(absl::Span<const SendBuffer> send,
                                             absl::Span<const RecvBuffer> recv,
                                             MemoryKind memory) {
  absl::Status verdict =
      CheckAllToAllArguments(send.size(), recv.size(), memory);
  const std::vector<std::string> posted =
      world_->Exchange(rank_, verdict.ok() ? PostAddress(send) : std::string());
  std::vector<const SendBuffer*> incoming(posted.size(), nullptr);
  for (size_t s = 0; s < posted.size() && verdict.ok(); ++s) {
    if (posted[s].empty()) continue;  // that rank failed; it reports why
    incoming[s] = PostedAddress(posted[s]) + rank_;
    if (incoming[s]->size != recv[s].size) {
      verdict = AllToAllSizeMismatch(static_cast<int>(s), incoming[s]->size,
                                     rank_, recv[s].size);
    }
  }
  for (size_t s = 0; s < incoming.size() && verdict.ok(); ++s) {
    if (incoming[s] != nullptr && incoming[s]->size > 0)
      std::memcpy(recv[s].data, incoming[s]->data, incoming[s]->size);
  }
  return AgreeOnFirstError(verdict);
}

InProcessWorld::InProcessWorld(int size)
    : InProcessWorld(size, std::vector<std::string>(size)) {}

InProcessWorld::InProcessWorld(int size, std::vector<std::string> node_names)
    : size_(size),
      node_names_(std::move(node_names)),
      rendezvous_(std::make_unique<Rendezvous>(size)) {
  for (int r = 0; r < size; ++r)
    comms_.push_back(std::make_unique<InProcessCommunicator>(this, r));
}
InProcessWorld::~InProcessWorld() = default;

Communicator* InProcessWorld::comm(int rank) { return comms_.at(rank).get(); }

std::vector<std::string> InProcessWorld::Exchange(int rank, std::string mine) {
  return rendezvous_->Exchange(rank, std::move(mine));
}

absl::Status RunRanks(InProcessWorld& world,
                      const std::function<absl::Status(Communicator&)>& fn) {
  std::vector<absl::Status> results(world.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < world.size(); ++r) {
    threads.emplace_back([&, r] { results[r] = fn(*world.comm(r)); });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace ckpt

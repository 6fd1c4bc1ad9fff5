#include "ckpt/in_process.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/status_macros.h"

namespace ckpt {

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

InProcessWorld::InProcessWorld(int size) : size_(size) {
  {
    MutexLock l(&mu_);
    slots_.resize(size);
  }
  for (int r = 0; r < size; ++r)
    comms_.push_back(std::make_unique<InProcessCommunicator>(this, r));
}
InProcessWorld::~InProcessWorld() = default;

Communicator* InProcessWorld::comm(int rank) { return comms_.at(rank).get(); }

std::vector<std::string> InProcessWorld::Exchange(int rank, std::string mine) {
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

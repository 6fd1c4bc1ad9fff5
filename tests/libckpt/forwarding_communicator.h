// Test helper: a communicator that forwards every call to another, counts
// the AllToAll calls and the bytes they send, and can hide the other's
// SharesAddressSpace, so that the cooperative load's two delivery paths (direct
// writes between ranks of one address space, and the AllToAll exchange) can
// both be tested on in-process ranks.
#ifndef CKPT_TESTS_LIBCKPT_FORWARDING_COMMUNICATOR_H_
#define CKPT_TESTS_LIBCKPT_FORWARDING_COMMUNICATOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/communicator.h"
#include "ckpt/in_process.h"
#include "ckpt/reader.h"

namespace ckpt::testing {

// How a cooperative load on in-process ranks delivers bytes: straight into
// each other's destinations (one address space), or, as between processes,
// exchanged through AllToAll or through shared memory (OptionsFor).
enum class Delivery { kDirect, kAllToAll, kSharedMemory };

inline const char* DeliveryName(Delivery d) {
  switch (d) {
    case Delivery::kDirect:
      return "Direct";
    case Delivery::kAllToAll:
      return "AllToAll";
    case Delivery::kSharedMemory:
      return "SharedMemory";
  }
  return "?";
}

// `o` with the exchange `d` asks for: shared memory for kSharedMemory
// only (LoadOptions::shared_memory_exchange; kDirect has no exchange).
inline LoadOptions OptionsFor(Delivery d, LoadOptions o = {}) {
  o.shared_memory_exchange = d == Delivery::kSharedMemory;
  return o;
}

class ForwardingCommunicator : public Communicator {
 public:
  // Not kDirect: SharesAddressSpace() is false whatever `base` says. Tests
  // derive from it to watch or change single calls.
  ForwardingCommunicator(Communicator* base, Delivery delivery)
      : base_(base), delivery_(delivery) {}

  int rank() const override { return base_->rank(); }
  int size() const override { return base_->size(); }
  absl::StatusOr<std::vector<std::string>> AllGather(
      absl::string_view mine) override {
    ++collective_calls_;
    return base_->AllGather(mine);
  }
  absl::StatusOr<std::vector<std::string>> Gather(absl::string_view mine,
                                                  int root) override {
    ++collective_calls_;
    return base_->Gather(mine, root);
  }
  absl::Status Broadcast(std::string* data, int root) override {
    ++collective_calls_;
    return base_->Broadcast(data, root);
  }
  absl::Status Barrier() override {
    ++collective_calls_;
    return base_->Barrier();
  }
  absl::Status AllReduceMax(std::vector<int64_t>* values) override {
    ++collective_calls_;
    ++all_reduce_max_calls_;
    return base_->AllReduceMax(values);
  }
  absl::Status AllToAll(absl::Span<const SendBuffer> send,
                        absl::Span<const RecvBuffer> recv,
                        MemoryKind memory) override {
    ++collective_calls_;
    ++all_to_all_calls_;
    for (const SendBuffer& b : send) all_to_all_bytes_ += b.size;
    return base_->AllToAll(send, recv, memory);
  }
  bool SupportsDeviceMemory() const override {
    return base_->SupportsDeviceMemory();
  }
  bool SharesAddressSpace() const override {
    return delivery_ == Delivery::kDirect && base_->SharesAddressSpace();
  }
  std::string NodeName() const override { return base_->NodeName(); }

  int all_to_all_calls() const { return all_to_all_calls_; }
  // AllReduceMax calls (agreements among them), all calls together.
  int all_reduce_max_calls() const { return all_reduce_max_calls_; }
  // Collective calls of every kind, all calls together.
  int collective_calls() const { return collective_calls_; }
  // The bytes this rank sent through AllToAll, all calls together.
  uint64_t all_to_all_bytes() const { return all_to_all_bytes_; }

 private:
  Communicator* base_;
  Delivery delivery_;
  int all_to_all_calls_ = 0;       // used by one thread, the rank's
  int all_reduce_max_calls_ = 0;   // the same
  int collective_calls_ = 0;       // the same
  uint64_t all_to_all_bytes_ = 0;  // the same
};

// RunRanks(world, fn) with each rank's communicator wrapped for `delivery`;
// `all_to_all_calls` (null, or world.size() counters) receives each rank's
// count of AllToAll calls.
inline absl::Status RunRanksWith(
    InProcessWorld& world, Delivery delivery,
    const std::function<absl::Status(Communicator&)>& fn,
    std::vector<int>* all_to_all_calls = nullptr) {
  if (all_to_all_calls != nullptr) all_to_all_calls->assign(world.size(), 0);
  return RunRanks(world, [&](Communicator& comm) -> absl::Status {
    ForwardingCommunicator wrapped(&comm, delivery);
    absl::Status st = fn(wrapped);
    if (all_to_all_calls != nullptr) {
      (*all_to_all_calls)[comm.rank()] = wrapped.all_to_all_calls();
    }
    return st;
  });
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_LIBCKPT_FORWARDING_COMMUNICATOR_H_

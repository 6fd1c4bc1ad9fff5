// A fake asynchronous device for tests without a GPU: "device memory" is
// host memory, and each stream runs its copies, in order, on its own thread,
// after a latency, completing DeviceEvents as a GPU would. It counts calls
// (batched and strided ones separately), can fail a copy, can run "kernels"
// on a caller's stream, and reports what it allocated for staging.
#ifndef CKPT_TESTING_FAKE_DEVICE_H_
#define CKPT_TESTING_FAKE_DEVICE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "ckpt/device_memory.h"

namespace ckpt::testing {

// Completion shared between the stream that completes it and its holders.
class FakeEvent final : public DeviceEvent {
 public:
  bool Done() override {
    std::lock_guard<std::mutex> l(mu_);
    return done_;
  }
  absl::Status Wait() override {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return done_; });
    return status_;
  }
  void Complete(absl::Status s) {
    {
      std::lock_guard<std::mutex> l(mu_);
      done_ = true;
      status_ = std::move(s);
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  absl::Status status_;
};

// Forwards to a FakeEvent it shares (events handed to the library are owned
// by it; the stream keeps its own reference).
class SharedEvent final : public DeviceEvent {
 public:
  explicit SharedEvent(std::shared_ptr<FakeEvent> e) : e_(std::move(e)) {}
  bool Done() override { return e_->Done(); }
  absl::Status Wait() override { return e_->Wait(); }

 private:
  std::shared_ptr<FakeEvent> e_;
};

class FakeDevice;

// Ops run in order on the stream's thread. The first failed copy fails
// every later event of the stream.
class FakeStream final : public DeviceStream {
 public:
  explicit FakeStream(FakeDevice* dev);
  ~FakeStream() override {
    Enqueue(nullptr);
    thread_.join();
  }
  absl::Status WaitEvent(DeviceEvent& event) override;
  absl::Status CopyAsync(CopyKind kind,
                         absl::Span<const DeviceCopy> copies) override;
  absl::StatusOr<std::unique_ptr<DeviceEvent>> Record() override {
    auto e = std::make_shared<FakeEvent>();
    Enqueue([this, e] { e->Complete(error_); });
    return std::unique_ptr<DeviceEvent>(new SharedEvent(e));
  }
  // Runs `fn` on the stream (a "kernel" of the caller).
  void Launch(std::function<void()> fn) { Enqueue(std::move(fn)); }

 private:
  void Enqueue(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> l(mu_);
      ops_.push_back(std::move(op));
    }
    cv_.notify_one();
  }
  void Loop() {
    for (;;) {
      std::function<void()> op;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return !ops_.empty(); });
        op = std::move(ops_.front());
        ops_.pop_front();
      }
      if (!op) return;
      op();
    }
  }

  FakeDevice* dev_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> ops_;
  absl::Status error_;  // stream thread only
  std::thread thread_;
};

class FakeDevice : public DeviceMemory {
 public:
  explicit FakeDevice(
      std::chrono::microseconds latency = std::chrono::microseconds(200))
      : latency_(latency) {}

  absl::Status CopyToHost(void* dst, const void* src, size_t n,
                          int device) override {
    sync_calls += 1;
    return Copy(dst, src, n);
  }
  absl::Status CopyFromHost(void* dst, const void* src, size_t n,
                            int device) override {
    sync_calls += 1;
    return Copy(dst, src, n);
  }
  absl::StatusOr<std::unique_ptr<DeviceStream>> CreateStream(
      int device) override {
    streams_created += 1;
    return std::unique_ptr<DeviceStream>(new FakeStream(this));
  }
  absl::StatusOr<void*> AllocateHost(size_t n) override {
    allocated_bytes += n;
    allocations += 1;
    return DeviceMemory::AllocateHost(n);
  }
  void FreeHost(void* p, size_t n) override {
    allocated_bytes -= n;
    DeviceMemory::FreeHost(p, n);
  }
  // "Device memory" is host memory; counted apart from staging memory.
  absl::StatusOr<void*> AllocateDevice(size_t n, int device) override {
    if (!device_memory_enabled) return DeviceMemory::AllocateDevice(n, device);
    device_allocations += 1;
    device_allocated_bytes += n;
    return DeviceMemory::AllocateHost(n);
  }
  void FreeDevice(void* p, size_t n, int device) override {
    device_allocated_bytes -= n;
    DeviceMemory::FreeHost(p, n);
  }

  // The copy that would take the total past `bytes` fails with `error`.
  void FailAfterBytes(uint64_t bytes, absl::Status error) {
    std::lock_guard<std::mutex> l(mu_);
    fail_after_ = bytes;
    fail_error_ = std::move(error);
  }
  // Called before every copy runs (on the stream's thread).
  void OnCopy(std::function<void()> fn) { on_copy_ = std::move(fn); }

  // One DeviceCopy, as the device would run it. Called by streams.
  absl::Status RunCopy(const DeviceCopy& c) {
    std::this_thread::sleep_for(latency_);
    if (on_copy_) on_copy_();
    copy_calls += 1;
    if (c.rows > 1) strided_calls += 1;
    for (size_t r = 0; r < c.rows; ++r) {
      absl::Status s =
          Copy(static_cast<char*>(c.dst) + r * c.dst_pitch,
               static_cast<const char*>(c.src) + r * c.src_pitch, c.row_bytes);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  std::atomic<uint64_t> bytes_copied{0};
  std::atomic<int64_t> copy_calls{0};     // async copies (one per DeviceCopy)
  std::atomic<int64_t> strided_calls{0};  // those with rows > 1
  std::atomic<int64_t> batches{0};        // CopyAsync calls
  std::atomic<int64_t> sync_calls{0};     // CopyToHost / CopyFromHost
  std::atomic<int64_t> streams_created{0};
  std::atomic<int64_t> allocations{0};
  std::atomic<int64_t> allocated_bytes{0};  // staging memory held now
  std::atomic<int64_t> d2d_calls{0};        // kDeviceToDevice copies
  std::atomic<int64_t> device_allocations{0};
  std::atomic<int64_t> device_allocated_bytes{0};  // AllocateDevice, held now
  bool device_memory_enabled = true;  // false: AllocateDevice Unimplemented

 private:
  absl::Status Copy(void* dst, const void* src, size_t n) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (fail_after_ >= 0 &&
          bytes_copied + n > static_cast<uint64_t>(fail_after_)) {
        return fail_error_;
      }
    }
    std::memcpy(dst, src, n);
    bytes_copied += n;
    return absl::OkStatus();
  }

  const std::chrono::microseconds latency_;
  std::function<void()> on_copy_;
  std::mutex mu_;
  int64_t fail_after_ = -1;
  absl::Status fail_error_;
};

inline FakeStream::FakeStream(FakeDevice* dev)
    : dev_(dev), thread_([this] { Loop(); }) {}

inline absl::Status FakeStream::WaitEvent(DeviceEvent& event) {
  // The stream's thread blocks, not the caller: as cudaStreamWaitEvent.
  // The event is referenced until then, so the caller must keep it alive
  // until the stream passed it (the library's callers keep theirs for the
  // whole save).
  DeviceEvent* e = &event;
  Enqueue([this, e] {
    absl::Status s = e->Wait();
    if (error_.ok()) error_ = s;
  });
  return absl::OkStatus();
}

inline absl::Status FakeStream::CopyAsync(CopyKind kind,
                                          absl::Span<const DeviceCopy> copies) {
  dev_->batches += 1;
  if (kind == CopyKind::kDeviceToDevice) dev_->d2d_calls += copies.size();
  std::vector<DeviceCopy> list(copies.begin(), copies.end());
  Enqueue([this, list = std::move(list)] {
    for (const DeviceCopy& c : list) {
      if (!error_.ok()) return;
      error_ = dev_->RunCopy(c);
    }
  });
  return absl::OkStatus();
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTING_FAKE_DEVICE_H_

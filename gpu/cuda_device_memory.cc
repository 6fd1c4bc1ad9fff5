#include "ckpt/gpu/cuda_device_memory.h"

#include <utility>
#include <vector>

#include "ckpt/format/status_macros.h"
#include "ckpt/gpu/scoped_device.h"
#include "ckpt/gpu/status_macros.h"
#include "util/mutex.h"

namespace ckpt::gpu {
namespace {

using internal::ScopedDevice;

class CudaEvent final : public DeviceEvent {
 public:
  CudaEvent(cudaEvent_t event, bool owned) : event_(event), owned_(owned) {}
  ~CudaEvent() override {
    if (owned_) (void)cudaEventDestroy(event_);
  }
  bool Done() override {
    const cudaError_t err = cudaEventQuery(event_);
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    return true;  // complete, or failed: Wait() reports which
  }
  absl::Status Wait() override {
    CKPT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
    return absl::OkStatus();
  }
  cudaEvent_t event() const { return event_; }

 private:
  cudaEvent_t event_;
  bool owned_;
};

absl::StatusOr<std::unique_ptr<DeviceEvent>> RecordEvent(cudaStream_t stream) {
  cudaEvent_t e;
  CKPT_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  auto event = std::make_unique<CudaEvent>(e, /*owned=*/true);
  CKPT_CUDA_RETURN_IF_ERROR(cudaEventRecord(e, stream));
  return std::unique_ptr<DeviceEvent>(std::move(event));
}

cudaMemcpyKind ToCuda(CopyKind kind) {
  switch (kind) {
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToDevice:
      break;
  }
  return cudaMemcpyDeviceToDevice;
}

class CudaStream final : public DeviceStream {
 public:
  CudaStream(int device, cudaStream_t stream)
      : device_(device), stream_(stream) {}
  ~CudaStream() override {
    // Its own queued work only; errors were reported by its events.
    ScopedDevice scope;
    (void)scope.Enter(device_);
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }

  absl::Status WaitEvent(DeviceEvent& event) override {
    auto* cuda = dynamic_cast<CudaEvent*>(&event);
    if (cuda == nullptr) return event.Wait();
    ScopedDevice scope;
    CKPT_RETURN_IF_ERROR(scope.Enter(device_));
    CKPT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, cuda->event(), 0));
    return absl::OkStatus();
  }

  absl::Status CopyAsync(CopyKind kind,
                         absl::Span<const DeviceCopy> copies) override {
    ScopedDevice scope;
    CKPT_RETURN_IF_ERROR(scope.Enter(device_));
    const cudaMemcpyKind k = ToCuda(kind);
    // Runs of contiguous copies go as one batch; a strided copy is one
    // cudaMemcpy2DAsync. Their order on the stream is kept.
    size_t i = 0;
    while (i < copies.size()) {
      if (copies[i].rows > 1) {
        const DeviceCopy& c = copies[i++];
        CKPT_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(c.dst, c.dst_pitch, c.src,
                                                    c.src_pitch, c.row_bytes,
                                                    c.rows, k, stream_));
        continue;
      }
      size_t end = i;
      while (end < copies.size() && copies[end].rows <= 1) ++end;
      if (absl::Status s = CopyContiguous(copies.subspan(i, end - i), k);
          !s.ok())
        return s;
      i = end;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<DeviceEvent>> Record() override {
    ScopedDevice scope;
    CKPT_RETURN_IF_ERROR(scope.Enter(device_));
    return RecordEvent(stream_);
  }

 private:
  // Contiguous copies: one cudaMemcpyBatchAsync where the runtime has it
  // (CUDA 12.8 and later; the copies of one batch are unordered, which the
  // SaveStager's and the loader's copies, to and from disjoint ranges, allow),
  // else one cudaMemcpyAsync each. A batch the driver refuses is retried
  // copy by copy, so that an error names the copy that fails.
  absl::Status CopyContiguous(absl::Span<const DeviceCopy> copies,
                              cudaMemcpyKind kind) {
#if CUDART_VERSION >= 12080
    if (copies.size() > 1) {
      std::vector<void*> dsts;
      std::vector<const void*> srcs;
      std::vector<size_t> sizes;
      for (const DeviceCopy& c : copies) {
        dsts.push_back(c.dst);
        srcs.push_back(c.src);
        sizes.push_back(c.row_bytes);
      }
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t attr_index = 0;
#if CUDART_VERSION >= 13000
      const cudaError_t err =
          cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(),
                               copies.size(), &attr, &attr_index, 1, stream_);
#else
      size_t fail_index = 0;
      const cudaError_t err = cudaMemcpyBatchAsync(
          dsts.data(), srcs.data(), sizes.data(), copies.size(), &attr,
          &attr_index, 1, &fail_index, stream_);
#endif
      if (err == cudaSuccess) return absl::OkStatus();
      (void)cudaGetLastError();  // retried below, copy by copy
    }
#endif
    for (const DeviceCopy& c : copies) {
      CKPT_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(c.dst, c.src, c.row_bytes, kind, stream_));
    }
    return absl::OkStatus();
  }

  int device_;
  cudaStream_t stream_;
};

absl::StatusOr<cudaStream_t> NewStream(int device) {
  ScopedDevice scope;
  CKPT_RETURN_IF_ERROR(scope.Enter(device));
  cudaStream_t s;
  CKPT_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

struct PooledStream {
  int device;
  cudaStream_t stream;
};

}  // namespace

class CudaDeviceMemory::StreamPool {
 public:
  StreamPool() = default;
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;
  ~StreamPool() {
    MutexLock l(&mu_);
    for (const PooledStream& s : idle_) {
      ScopedDevice scope;
      (void)scope.Enter(s.device);
      (void)cudaStreamDestroy(s.stream);
    }
  }

  // An idle stream of `device`, or a new one.
  absl::StatusOr<PooledStream> Take(int device) {
    {
      MutexLock l(&mu_);
      for (size_t i = 0; i < idle_.size(); ++i) {
        if (idle_[i].device == device) {
          PooledStream s = idle_[i];
          idle_.erase(idle_.begin() + i);
          return s;
        }
      }
    }
    absl::StatusOr<cudaStream_t> s = NewStream(device);
    if (!s.ok()) return s.status();
    return PooledStream{device, *s};
  }

  void Give(PooledStream s) {
    MutexLock l(&mu_);
    idle_.push_back(s);
  }

 private:
  Mutex mu_;
  std::vector<PooledStream> idle_ ABSL_GUARDED_BY(mu_);
};

CudaDeviceMemory::CudaDeviceMemory()
    : streams_(std::make_unique<StreamPool>()) {}

CudaDeviceMemory::~CudaDeviceMemory() = default;

absl::Status CudaDeviceMemory::CopySync(void* dst, const void* src, size_t n,
                                        int device, cudaMemcpyKind kind) {
  absl::StatusOr<PooledStream> s = streams_->Take(device);
  if (!s.ok()) return s.status();
  absl::Status status = [&]() -> absl::Status {
    ScopedDevice scope;
    CKPT_RETURN_IF_ERROR(scope.Enter(device));
    CKPT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n, kind, s->stream));
    CKPT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s->stream));
    return absl::OkStatus();
  }();
  streams_->Give(*s);
  return status;
}

absl::Status CudaDeviceMemory::CopyToHost(void* dst, const void* src, size_t n,
                                          int device) {
  return CopySync(dst, src, n, device, cudaMemcpyDeviceToHost);
}

absl::Status CudaDeviceMemory::CopyFromHost(void* dst, const void* src,
                                            size_t n, int device) {
  return CopySync(dst, src, n, device, cudaMemcpyHostToDevice);
}

absl::StatusOr<std::unique_ptr<DeviceStream>> CudaDeviceMemory::CreateStream(
    int device) {
  absl::StatusOr<cudaStream_t> s = NewStream(device);
  if (!s.ok()) return s.status();
  return std::unique_ptr<DeviceStream>(new CudaStream(device, *s));
}

absl::StatusOr<void*> CudaDeviceMemory::AllocateHost(size_t n) {
  void* p = nullptr;
  CKPT_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, n, cudaHostAllocPortable));
  return p;
}

void CudaDeviceMemory::FreeHost(void* p, size_t n) { (void)cudaFreeHost(p); }

absl::StatusOr<void*> CudaDeviceMemory::AllocateDevice(size_t n, int device) {
  ScopedDevice scope;
  CKPT_RETURN_IF_ERROR(scope.Enter(device));
  void* p = nullptr;
  CKPT_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, n));
  return p;
}

void CudaDeviceMemory::FreeDevice(void* p, size_t n, int device) {
  ScopedDevice scope;
  (void)scope.Enter(device);
  (void)cudaFree(p);
}

absl::StatusOr<std::unique_ptr<DeviceEvent>> CudaDeviceMemory::RecordOn(
    cudaStream_t stream) {
  return RecordEvent(stream);
}

std::unique_ptr<DeviceEvent> CudaDeviceMemory::WrapEvent(cudaEvent_t event) {
  return std::make_unique<CudaEvent>(event, /*owned=*/false);
}

}  // namespace ckpt::gpu

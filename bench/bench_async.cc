// ckpt-bench-async: what Writer::SaveAsync costs the trainer, against the
// limit of a snapshot and against a synchronous Save, measured in one run.
//
//   ckpt-bench-async --dir /dev/shm/b --gib 2 [--device] [--threads 4]
//
// The state: G GiB of float32 tensors of 64 MiB, in host memory, or with
// --device in CUDA device memory (cudaMalloc; needs a build with the CUDA
// Toolkit and a GPU). One process, one rank. In this order:
//   snapshot_limit_s  host: the same bytes copied in pieces of 4 MiB with
//                     the library's copy (CopyForLater, util/copy.h:
//                     streaming stores where the CPU has AVX2), by as many
//                     threads as the snapshot uses
//                     (--snapshot-threads, default
//                     ckpt::DefaultSnapshotThreads()), into memory
//                     allocated and faulted in as the staging pool's; the
//                     best of three rounds. device: one cudaMemcpyAsync per
//                     tensor into pinned memory on one stream, then
//                     cudaStreamSynchronize (the best of two rounds);
//                     device with --device-snapshot: the same copies into
//                     device memory allocated before (device to device);
//   sync_save_s       Save of the state (everything to the commit; the
//                     second of two saves with the same Writer);
//   host_sync_save_s  (--device only) Save of the same bytes from host
//                     memory: the write throughput of a save of device
//                     tensors relative to host ones;
//   stall_s           SaveAsync's return after its call: how long the
//                     trainer is blocked;
//   stall_plan_s, stall_snapshot_s  its parts from the SaveResult
//                     (plan_seconds, snapshot_seconds; the rest is the
//                     step's directory and the call itself);
//   async_durable_s   from the SaveAsync call until Wait() returned (the
//                     checkpoint committed and durable);
//   peak_staging_bytes, staging_cap_bytes  from the SaveResult;
//   snapshot_threads  SaveOptions::snapshot_threads of the async saves;
//   capped            stall_s, async_durable_s, peak_staging_bytes and
//                     staging_cap_bytes again with Writer::Options::
//                     staging_bytes a quarter of the state.
// --fake-device: the device path without a GPU, through the tests' fake
// device (tests/testing/fake_device.h): "device memory" is host memory and
// each stream copies on a thread of its own, so the figures measure the
// pipeline's own overhead (ordering, waits, hand-offs) at host copy speed,
// not a GPU (JSON "fake_device": true). Its snapshot limit is the same
// copies on one fake stream, one per tensor, into memory allocated as the
// pool's. On a machine with few cores the fake copies take CPU from the
// writes, which a GPU's copy engine does not.
// --device-snapshot (with --device): the async saves snapshot into spare
// device memory (SaveOptions::snapshot_to_device with device_snapshot_bytes
// the state's size; JSON "device_snapshot": true); its limit is the
// device-to-device copy.
// Then the targets judged on this run, each "met" or "MISSED": stall <=
// 1.2x the limit (host, and the D2D limit of --device-snapshot) or 1.15x
// (device, the pinned D2H limit), durable <= 1.15x the sync save
// (a host target), peak staging <= the cap (both runs), and with --device
// the device save's write throughput >= 0.9 of the host save's; in the JSON
// under "targets", with "met" true when every target of the run's kind is
// (host: stall, durable, peak; device: stall, peak, throughput).
// Each async figure is the second of two saves with the same Writer: the
// first one allocates and faults in (with --device, pins) the staging pool,
// which every later save reuses. Also printed (not in the JSON): the CPU
// seconds (user + system, all threads) of the sync save and of the async
// save. Every checkpoint is loaded and compared afterwards (not
// timed). Steps go into one root with keep_last = 1. The last line printed
// is one JSON object.
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "ckpt/reader.h"
#include "ckpt/testing/fake_device.h"
#include "ckpt/writer.h"
#include "util/copy.h"
#ifdef CKPT_BENCH_CUDA
#include <cuda_runtime_api.h>

#include "ckpt/gpu/cuda_device_memory.h"
#endif

namespace {

constexpr uint64_t kTensorBytes = 64ull << 20;  // 4096 x 4096 float32

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "ckpt-bench-async: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T Check(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Die(std::string(what) + ": " + v.status().ToString());
  return *std::move(v);
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Deterministic tensor bytes (some structure, as float32 weights).
void Fill(char* p, uint64_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint64_t i = 0; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
}

struct State {
  std::vector<std::unique_ptr<char[]>> host;  // the bytes, on the host
  std::vector<void*> device;  // with --device: the same on the GPU
  uint64_t bytes() const { return host.size() * kTensorBytes; }
};

// CPU seconds (user + system) of every thread of the process so far.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

struct Async {
  double stall = 0, durable = 0, cpu = 0;
  double plan = 0, snapshot = 0;  // parts of the stall (SaveResult)
  uint64_t peak = 0, cap = 0;
};

std::unique_ptr<ckpt::Writer> MakeWriter(const State& s, bool on_device,
                                         ckpt::DeviceMemory* dm, uint64_t cap,
                                         uint64_t device_snapshot = 0) {
  ckpt::Writer::Options wo;
  wo.device_memory = dm;
  wo.device_snapshot_bytes = device_snapshot;
  if (cap != 0) wo.staging_bytes = cap;
  auto w = Check(ckpt::Writer::Create(wo), "Writer::Create");
  ckpt::TensorOptions to;
  if (on_device) to.memory = ckpt::MemoryKind::kCuda;
  for (size_t i = 0; i < s.host.size(); ++i) {
    const void* data =
        on_device ? s.device[i] : static_cast<const void*>(s.host[i].get());
    Check(w->AddTensor(absl::StrFormat("t%04d", i), ckpt::DType::kFloat32,
                       {4096, 4096}, ckpt::FullBox({4096, 4096}), data, to),
          "AddTensor");
  }
  return w;
}

// The second of two saves (as the async figures: with --device the first
// pins the Writer's staging buffers).
double SyncSave(ckpt::Writer* w, const std::string& root, uint64_t* step,
                const ckpt::SaveOptions& so, double* cpu = nullptr) {
  double seconds = 0;
  for (int round = 0; round < 2; ++round) {
    const double t0 = Now(), c0 = CpuSeconds();
    Check(w->Save(root, ++*step, so), "Save");
    if (cpu != nullptr) *cpu = CpuSeconds() - c0;
    seconds = Now() - t0;
  }
  return seconds;
}

Async AsyncSave(ckpt::Writer* w, const std::string& root, uint64_t* step,
                const ckpt::SaveOptions& so) {
  Async a;
  for (int round = 0; round < 2; ++round) {  // the first makes the pool
    const double t0 = Now(), c0 = CpuSeconds();
    ckpt::SaveHandle h = Check(w->SaveAsync(root, ++*step, so), "SaveAsync");
    a.stall = Now() - t0;
    ckpt::SaveResult r = Check(h.Wait(), "SaveHandle::Wait");
    a.durable = Now() - t0;
    a.cpu = CpuSeconds() - c0;
    a.peak = r.peak_staging_bytes;
    a.cap = r.staging_cap_bytes;
    a.plan = r.plan_seconds;
    a.snapshot = r.snapshot_seconds;
  }
  return a;
}

void Verify(const State& s, const std::string& root) {
  auto reader = Check(ckpt::Reader::Open(root), "Reader::Open");
  std::unique_ptr<char[]> out(new char[kTensorBytes]);
  for (size_t i = 0; i < s.host.size(); ++i) {
    ckpt::LoadOptions lo;
    lo.allow_unrequested = true;
    Check(reader
              ->Load({{absl::StrFormat("t%04d", i),
                       ckpt::DType::kFloat32,
                       {4096, 4096},
                       ckpt::FullBox({4096, 4096}),
                       out.get()}},
                     lo)
              .status(),
          "Load");
    if (std::memcmp(out.get(), s.host[i].get(), kTensorBytes) != 0) {
      Die(absl::StrFormat("tensor t%04d of %s differs from the state", i,
                          root));
    }
  }
}

// The copy of the library's snapshot without the rest of the library:
// every tensor copied in pieces of 4 MiB (as the SaveStager splits them,
// with its CopyForLater) by `threads`
// threads taking pieces in turn, into memory allocated and faulted in as the
// staging pool's (2 MiB aligned, MADV_HUGEPAGE, every page touched). The
// best of three rounds.
double HostSnapshotLimit(const State& s, int threads) {
  constexpr uint64_t kPiece = 4ull << 20, kHuge = 2ull << 20;
  char* dst = static_cast<char*>(std::aligned_alloc(kHuge, s.bytes()));
  if (dst == nullptr) Die("cannot allocate the snapshot limit's buffer");
  (void)madvise(dst, s.bytes(), MADV_HUGEPAGE);
  for (uint64_t i = 0; i < s.bytes(); i += 4096) dst[i] = 0;
  const uint64_t pieces = s.bytes() / kPiece;
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    std::atomic<uint64_t> next{0};
    auto copy = [&] {
      for (uint64_t p; (p = next.fetch_add(1)) < pieces;) {
        const uint64_t off = p * kPiece;
        ckpt::internal::CopyForLater(
            dst + off, s.host[off / kTensorBytes].get() + off % kTensorBytes,
            kPiece);
      }
    };
    const double t0 = Now();
    std::vector<std::thread> helpers;
    for (int t = 1; t < threads; ++t) helpers.emplace_back(copy);
    copy();
    for (auto& h : helpers) h.join();
    best = std::min(best, Now() - t0);
  }
  std::free(dst);
  return best;
}

// The fake device's copy of the same bytes: one copy per tensor on one
// fake stream into memory allocated as the staging pool's and faulted in;
// the best of two rounds.
double FakeSnapshotLimit(const State& s, ckpt::DeviceMemory* dm) {
  char* dst = static_cast<char*>(Check(dm->AllocateHost(s.bytes()), "alloc"));
  for (uint64_t i = 0; i < s.bytes(); i += 4096) dst[i] = 0;
  auto stream = Check(dm->CreateStream(0), "CreateStream");
  double best = 1e30;
  for (int round = 0; round < 2; ++round) {
    std::vector<ckpt::DeviceCopy> copies(s.device.size());
    for (size_t i = 0; i < s.device.size(); ++i) {
      copies[i].dst = dst + i * kTensorBytes;
      copies[i].src = s.device[i];
      copies[i].row_bytes = kTensorBytes;
    }
    const double t0 = Now();
    Check(stream->CopyAsync(ckpt::CopyKind::kDeviceToHost, copies),
          "CopyAsync");
    Check(Check(stream->Record(), "Record")->Wait(), "Wait");
    best = std::min(best, Now() - t0);
  }
  stream.reset();
  dm->FreeHost(dst, s.bytes());
  return best;
}

// The fake device's "device memory": a copy of each tensor in host memory.
void ToFakeDevice(State* s, ckpt::DeviceMemory* dm) {
  for (auto& h : s->host) {
    void* d = Check(dm->AllocateDevice(kTensorBytes, 0), "AllocateDevice");
    std::memcpy(d, h.get(), kTensorBytes);
    s->device.push_back(d);
  }
}

#ifdef CKPT_BENCH_CUDA
void CudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(std::string(what) + ": " + cudaGetErrorString(e));
}

void ToDevice(State* s) {
  for (auto& h : s->host) {
    void* d = nullptr;
    CudaCheck(cudaMalloc(&d, kTensorBytes), "cudaMalloc");
    CudaCheck(cudaMemcpy(d, h.get(), kTensorBytes, cudaMemcpyHostToDevice),
              "cudaMemcpy");
    s->device.push_back(d);
  }
}

// One cudaMemcpyAsync per tensor into pinned host memory (or, with
// `to_device`, into device memory) allocated before; the best of two rounds.
double DeviceSnapshotLimit(const State& s, bool to_device) {
  void* pinned = nullptr;
  if (to_device) {
    CudaCheck(cudaMalloc(&pinned, s.bytes()), "cudaMalloc");
    CudaCheck(cudaMemset(pinned, 0, s.bytes()), "cudaMemset");
  } else {
    CudaCheck(cudaHostAlloc(&pinned, s.bytes(), cudaHostAllocPortable),
              "cudaHostAlloc");
    std::memset(pinned, 0, s.bytes());
  }
  cudaStream_t stream;
  CudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            "cudaStreamCreate");
  double best = 1e30;
  for (int round = 0; round < 2; ++round) {
    const double t0 = Now();
    for (size_t i = 0; i < s.device.size(); ++i) {
      CudaCheck(cudaMemcpyAsync(static_cast<char*>(pinned) + i * kTensorBytes,
                                s.device[i], kTensorBytes,
                                to_device ? cudaMemcpyDeviceToDevice
                                          : cudaMemcpyDeviceToHost,
                                stream),
                "cudaMemcpyAsync");
    }
    CudaCheck(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    best = std::min(best, Now() - t0);
  }
  cudaStreamDestroy(stream);
  if (to_device) {
    cudaFree(pinned);
  } else {
    cudaFreeHost(pinned);
  }
  return best;
}
#endif

struct Options {
  std::string dir;
  double gib = 2;
  bool device = false;  // after CheckOptions: --device or --fake-device
  bool fake_device = false;
  bool device_snapshot = false;
  int threads = 4;
  int snapshot_threads = ckpt::DefaultSnapshotThreads();
};

// -1 when the benchmark goes on, else the exit code (--help: 0).
int ParseOptions(int argc, char** argv, Options* o) {
  CLI::App app(
      "ckpt-bench-async: the trainer's stall for SaveAsync, against a snapshot "
      "and Save");
  app.add_option("--dir", o->dir,
                 "directory for the checkpoints (e.g. /dev/shm/b)")
      ->required();
  app.add_option("--gib", o->gib, "size of the state in GiB");
  app.add_flag("--device", o->device, "tensors in CUDA device memory");
  app.add_flag("--fake-device", o->fake_device,
               "the device path through the tests' fake device (no GPU): "
               "the pipeline's overhead at host copy speed");
  app.add_flag("--device-snapshot", o->device_snapshot,
               "with --device: SaveAsync snapshots into spare device memory "
               "(SaveOptions::snapshot_to_device, Writer::Options::"
               "device_snapshot_bytes = the state's size)");
  app.add_option("--threads", o->threads, "SaveOptions::io_threads");
  app.add_option("--snapshot-threads", o->snapshot_threads,
                 "SaveOptions::snapshot_threads, and the threads of the host "
                 "snapshot limit (default: ckpt::DefaultSnapshotThreads())");
  CLI11_PARSE(app, argc, argv);
  return -1;
}

// Dies on options that exclude each other; --fake-device implies the
// device path.
void CheckOptions(Options* o) {
#ifndef CKPT_BENCH_CUDA
  if (o->device) Die("--device needs a build with the CUDA Toolkit (gpu/)");
#endif
  if (o->device && o->fake_device)
    Die("--device and --fake-device exclude each other");
  if (o->device_snapshot && !o->device && !o->fake_device)
    Die("--device-snapshot needs --device or --fake-device");
  o->device = o->device || o->fake_device;
}

// The state: --gib of 64 MiB tensors on the host.
State MakeState(const Options& o) {
  State s;
  const uint64_t n = std::max<uint64_t>(
      1, static_cast<uint64_t>(o.gib * (1ull << 30)) / kTensorBytes);
  for (uint64_t i = 0; i < n; ++i) {
    s.host.emplace_back(new char[kTensorBytes]);
    Fill(s.host.back().get(), kTensorBytes, i + 1);
  }
  return s;
}

// With a device, copies the state there and returns its DeviceMemory (null
// on the host); *limit is the snapshot limit of where the state lives.
std::unique_ptr<ckpt::DeviceMemory> PrepareDevice(const Options& o, State* s,
                                                  double* limit) {
  std::unique_ptr<ckpt::DeviceMemory> dm;
  if (o.fake_device) {
    dm = std::make_unique<ckpt::testing::FakeDevice>(
        std::chrono::microseconds(0));
    ToFakeDevice(s, dm.get());
    *limit = FakeSnapshotLimit(*s, dm.get());
  } else if (o.device) {
#ifdef CKPT_BENCH_CUDA
    ToDevice(s);
    dm = std::make_unique<ckpt::gpu::CudaDeviceMemory>();
    *limit = DeviceSnapshotLimit(*s, o.device_snapshot);
#endif
  } else {
    *limit = HostSnapshotLimit(*s, o.snapshot_threads);
  }
  return dm;
}

struct Results {
  double limit = 0;  // the snapshot limit
  double sync_save = 0, sync_cpu = 0;
  double host_sync = 0;  // with a device: the same save from host memory
  bool snapshot_to_device = false;
  Async full, capped;  // SaveAsync without and with a staging cap
};

// The saves: synchronous (and from the host, with a device), asynchronous,
// and asynchronous with a quarter of the state as staging cap; each
// checkpoint is verified against the state.
void RunSaves(const Options& o, const State& s, ckpt::DeviceMemory* dm,
              Results* r) {
  std::filesystem::remove_all(o.dir);
  std::filesystem::create_directories(o.dir);
  ckpt::SaveOptions so;
  so.io_threads = o.threads;
  so.snapshot_threads = o.snapshot_threads;
  ckpt::SaveOptions async_so = so;
  async_so.snapshot_to_device = o.device && o.device_snapshot;
  r->snapshot_to_device = async_so.snapshot_to_device;
  const uint64_t device_bytes = async_so.snapshot_to_device ? s.bytes() : 0;
  so.keep_last = 1;
  uint64_t step = 0;
  auto w = MakeWriter(s, o.device, dm, 0, device_bytes);
  r->sync_save = SyncSave(w.get(), o.dir + "/sync", &step, so, &r->sync_cpu);
  Verify(s, o.dir + "/sync");
  if (o.device) {
    auto hw = MakeWriter(s, false, nullptr, 0);
    r->host_sync = SyncSave(hw.get(), o.dir + "/host", &step, so);
    std::filesystem::remove_all(o.dir + "/host");
  }
  std::filesystem::remove_all(o.dir + "/sync");
  r->full = AsyncSave(w.get(), o.dir + "/async", &step, async_so);
  Verify(s, o.dir + "/async");
  std::filesystem::remove_all(o.dir + "/async");
  w.reset();  // its pool goes
  const uint64_t quarter = s.bytes() / 4 / (64ull << 20) * (64ull << 20);
  auto cw = MakeWriter(s, o.device, dm,
                       std::max<uint64_t>(quarter, 64ull << 20), device_bytes);
  r->capped = AsyncSave(cw.get(), o.dir + "/capped", &step, async_so);
  Verify(s, o.dir + "/capped");
  cw.reset();
  std::filesystem::remove_all(o.dir);
}

void PrintFigures(const Options& o, const State& s, const Results& r) {
  const double gb = s.bytes() / 1e9;
  std::printf("state            %.3f GB in %zu tensors (%s)\n", gb,
              s.host.size(),
              o.fake_device ? "fake device"
              : o.device    ? "device"
                            : "host");
  std::printf("snapshot limit   %.3f s  (%.2f GB/s)\n", r.limit, gb / r.limit);
  std::printf("sync save        %.3f s  (%.2f GB/s)\n", r.sync_save,
              gb / r.sync_save);
  if (o.device) {
    std::printf(
        "host sync save   %.3f s  (device/host write throughput %.2f)\n",
        r.host_sync, r.host_sync / r.sync_save);
  }
  std::printf("cpu (user+sys)   sync save %.3f s, async save %.3f s\n",
              r.sync_cpu, r.full.cpu);
  std::printf(
      "async stall      %.3f s  (%.2fx the snapshot limit; plan %.4f s, "
      "snapshot %.4f s)\n",
      r.full.stall, r.full.stall / r.limit, r.full.plan, r.full.snapshot);
  std::printf("async durable    %.3f s  (%.2fx the sync save)\n",
              r.full.durable, r.full.durable / r.sync_save);
  std::printf("peak staging     %llu of cap %llu\n",
              (unsigned long long)r.full.peak, (unsigned long long)r.full.cap);
  std::printf(
      "capped stall     %.3f s, durable %.3f s, peak %llu of cap %llu\n",
      r.capped.stall, r.capped.durable, (unsigned long long)r.capped.peak,
      (unsigned long long)r.capped.cap);
}

// The targets of the issue that asked for SaveAsync, judged on this run.
struct Targets {
  double stall_target = 0;
  bool stall_met = false, durable_met = false, peak_met = false,
       throughput_met = false;
  bool met = false;
};

Targets Judge(const Options& o, const Results& r) {
  Targets t;
  // The device-to-device limit (a GPU's --device-snapshot) has 1.2x.
  const bool d2d = o.device_snapshot && !o.fake_device;
  t.stall_target = o.device && !d2d ? 1.15 : 1.2;
  t.stall_met = r.full.stall <= t.stall_target * r.limit;
  t.durable_met = r.full.durable <= 1.15 * r.sync_save;
  t.peak_met = r.full.peak <= r.full.cap && r.capped.peak <= r.capped.cap;
  t.throughput_met = !o.device || r.host_sync >= 0.9 * r.sync_save;
  t.met = t.stall_met && t.peak_met &&
          (o.device ? t.throughput_met : t.durable_met);
  return t;
}

void PrintTargets(const Options& o, const Results& r, const Targets& t) {
  auto verdict = [](bool met) { return met ? "met" : "MISSED"; };
  std::printf("target           stall <= %.2fx the %s limit: %.2fx %s\n",
              t.stall_target,
              o.fake_device       ? "fake D2H"
              : o.device_snapshot ? "D2D"
              : o.device          ? "pinned D2H"
                                  : "host copy",
              r.full.stall / r.limit, verdict(t.stall_met));
  std::printf("target           durable <= 1.15x the sync save%s: %.2fx %s\n",
              o.device ? " (a host target)" : "", r.full.durable / r.sync_save,
              verdict(t.durable_met));
  std::printf("target           peak staging <= cap (and capped): %s\n",
              verdict(t.peak_met));
  if (o.device) {
    std::printf(
        "target           device write throughput >= 0.90 of host: %.2f %s\n",
        r.host_sync / r.sync_save, verdict(t.throughput_met));
  }
}

// The last line: the JSON object of bench/README.md.
std::string Json(const Options& o, const State& s, const Results& r,
                 const Targets& t) {
  std::string json = absl::StrFormat(
      "{\"bytes\": %d, \"device\": %s, \"stall_s\": %.4f, "
      "\"stall_plan_s\": %.5f, \"stall_snapshot_s\": %.5f, \"sync_save_s\": "
      "%.4f, "
      "\"async_durable_s\": %.4f, \"snapshot_limit_s\": %.4f, "
      "\"peak_staging_bytes\": %d, "
      "\"staging_cap_bytes\": %d, \"snapshot_threads\": %d, "
      "\"device_snapshot\": %s, \"fake_device\": %s",
      s.bytes(), o.device ? "true" : "false", r.full.stall, r.full.plan,
      r.full.snapshot, r.sync_save, r.full.durable, r.limit, r.full.peak,
      r.full.cap, o.snapshot_threads, r.snapshot_to_device ? "true" : "false",
      o.fake_device ? "true" : "false");
  if (o.device)
    absl::StrAppendFormat(&json, ", \"host_sync_save_s\": %.4f", r.host_sync);
  absl::StrAppendFormat(
      &json,
      ", \"capped\": {\"stall_s\": %.4f, \"async_durable_s\": %.4f, "
      "\"peak_staging_bytes\": %d, \"staging_cap_bytes\": %d}",
      r.capped.stall, r.capped.durable, r.capped.peak, r.capped.cap);
  absl::StrAppendFormat(
      &json,
      ", \"targets\": {\"stall_vs_limit\": %.3f, \"stall_target\": %.2f, "
      "\"durable_vs_sync\": %.3f, \"durable_target\": 1.15, "
      "\"peak_within_cap\": %s",
      r.full.stall / r.limit, t.stall_target, r.full.durable / r.sync_save,
      t.peak_met ? "true" : "false");
  if (o.device) {
    absl::StrAppendFormat(&json,
                          ", \"device_vs_host_write\": %.3f, "
                          "\"device_vs_host_target\": 0.90",
                          r.host_sync / r.sync_save);
  }
  absl::StrAppendFormat(&json, ", \"met\": %s}}", t.met ? "true" : "false");
  return json;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (int rc = ParseOptions(argc, argv, &o); rc >= 0) return rc;
  CheckOptions(&o);
  State s = MakeState(o);
  Results r;
  std::unique_ptr<ckpt::DeviceMemory> dm = PrepareDevice(o, &s, &r.limit);
  RunSaves(o, s, dm.get(), &r);
  PrintFigures(o, s, r);
  const Targets t = Judge(o, r);
  PrintTargets(o, r, t);
  std::printf("%s\n", Json(o, s, r, t).c_str());
  return 0;
}

// ckpt-bench-io: save and load throughput against the sequential bandwidth
// of the same directory, measured in the same run.
//
//   ckpt-bench-io --dir /dev/shm/b --gib 2 --threads 4
//   ckpt-bench-io --dir /dev/shm/b --gib 2 --ranks 1,4 --codecs none,zstd
//   --reshard-to 2
//
// The data: G GiB of float32 tensors of 64 MiB (4096 x 4096), a mix that
// compresses somewhat (see Generate). With R ranks, rank r holds rows
// [4096 r / R, 4096 (r + 1) / R) of every tensor: a contiguous piece of its
// buffer. Ranks are threads of this process (ckpt::InProcessWorld), all
// saving or loading at once.
//
// Each run measures, on the same bytes and in this order:
//   limit   sequential 64 MiB writes of one file + fsync, sequential 64 MiB
//           reads of it into the same destination buffers (dd-like); memcpy
//           of the data into those buffers on 1 thread and on every core;
//   ckpt    for every rank count and codec: Save (everything from Writer
//           creation to the commit: planning, every rank's writes, fsyncs,
//           manifest, renames) and a same-layout Load into those buffers;
//   reshard the checkpoint of the most ranks (uncompressed) loaded by
//           --reshard-to ranks that each want a block of columns of every
//           tensor (rows to columns: every stored row is cut), against the
//           same-layout load of that checkpoint, each rank reading alone
//           and cooperatively (ReaderOptions::communicator); then as many
//           ranks as saved it each loading everything (replicas), both
//           ways. Read amplification: bytes read from storage by all ranks
//           / stored bytes of the requested data (LoadReport::bytes_read).
// With --direct, uncompressed ckpt is also measured with O_DIRECT
// (SaveOptions/ReaderOptions::direct_io; tmpfs has none and falls back to
// buffered I/O). Every load is checked against the data afterwards (not
// timed); the destination buffers are overwritten before each load. Every
// figure comes with the CPU time of the process (all threads, user +
// system) per GB: on a busy machine it stays meaningful when wall time does
// not.
//
// Page cache: on /dev/shm it is the medium itself. On a disk, --evict drops
// each file's pages (posix_fadvise DONTNEED, after the fsync) before it is
// read, for the limit and ckpt alike, so reads come from the device.
//
// --dump-inputs PATH writes the generated tensors to PATH (raw float32,
// little-endian, tensor after tensor) and a description to PATH.json, so
// that other programs (bench/peers/) can use the very same bytes;
// --inputs PATH reads them back instead of generating.
//
// Figures are in GB/s (1e9 bytes) of tensor bytes. The last line printed
// is one JSON object holding every run's figure.
//
// --storage s3://bucket/prefix measures an S3 store instead: counts of
// requests and bytes, not speeds (bench_io_s3.h; --ranks' largest count
// saves, --reshard-to loads; --dir is not used).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ckpt/in_process.h"
#include "ckpt/reader.h"
#include "ckpt/writer.h"
#ifdef CKPT_BENCH_IO_S3
#include "bench_io_s3.h"
#endif

namespace {

namespace format = ckpt::format;
using Clock = std::chrono::steady_clock;

// Wall time and the CPU time of this process (all threads, user + system):
// on a busy machine the CPU time per byte stays meaningful when the wall
// time does not.
struct Timing {
  double wall = 0, cpu = 0;
};
double CpuNow() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}
class Stopwatch {
 public:
  Stopwatch() : wall_(Clock::now()), cpu_(CpuNow()) {}
  Timing Stop() const {
    return {std::chrono::duration<double>(Clock::now() - wall_).count(),
            CpuNow() - cpu_};
  }

 private:
  Clock::time_point wall_;
  double cpu_;
};

constexpr uint64_t kRows = 4096, kCols = 4096;
constexpr uint64_t kTensorBytes = kRows * kCols * 4;  // 64 MiB of float32

[[noreturn]] void Die(const std::string& what) {
  std::cerr << "ckpt-bench-io: " << what << "\n";
  std::exit(2);
}
void Check(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// SplitMix64: a tiny counter-based generator, so that tensors can be
// generated in parallel and identically anywhere.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Tensor i, a quarter each of: float32 weights (uniform, |w| < 0.05: sign,
// exponent and 23 random mantissa bits), weights of bfloat16 precision (the
// low 16 bits zero), small positive second moments (Adam's exp_avg_sq) and
// sparse weights (half of them zero, as in rarely used embedding rows).
// zstd -3 stores about 70% of the mix (ratio 1.42).
void Generate(int i, char* out) {
  const int kind = i % 4;
  const uint64_t n = kTensorBytes / 4;
  for (uint64_t j = 0; j < n; ++j) {
    uint64_t r = Mix((uint64_t(i) << 40) + j);
    float f;
    if (kind == 2) {
      f = static_cast<float>(static_cast<uint32_t>(r)) *
          (1e-6f / 4294967296.0f);
    } else {
      f = static_cast<float>(static_cast<int32_t>(r)) * (0.05f / 2147483648.0f);
      if (kind == 3 && (r >> 63) != 0) f = 0;
    }
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if (kind == 1) bits &= 0xffff0000u;
    std::memcpy(out + 4 * j, &bits, 4);
  }
}

// Runs fn(i) for i in [0, n) on every core.
template <typename Fn>
void ParallelOver(int n, Fn fn) {
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < std::min(hw, n); ++t) {
    pool.emplace_back([&] {
      for (int i; (i = next++) < n;) fn(i);
    });
  }
  for (auto& th : pool) th.join();
}

// Drops the cached pages of `path` (a file, or every file below a
// directory). The data must be clean (fsync'd).
void Evict(const std::string& path) {
  auto one = [](const std::string& p) {
    int fd = open(p.c_str(), O_RDONLY);
    if (fd < 0) Die("open " + p + ": " + std::strerror(errno));
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  };
  if (!std::filesystem::is_directory(path)) return one(path);
  for (const auto& e : std::filesystem::recursive_directory_iterator(path)) {
    if (e.is_regular_file()) one(e.path().string());
  }
}

// One tensor's 64 MiB, page-aligned (as O_DIRECT needs) and touched once so
// that no timed region pays for first-touch page faults.
class Buffer {
 public:
  Buffer() : p_(static_cast<char*>(std::aligned_alloc(4096, kTensorBytes))) {
    if (p_ == nullptr) Die("out of memory");
    std::memset(p_.get(), 0, kTensorBytes);
  }
  char* data() { return p_.get(); }
  const char* data() const { return p_.get(); }
  size_t size() const { return kTensorBytes; }
  bool operator!=(const Buffer& o) const {
    return std::memcmp(data(), o.data(), size()) != 0;
  }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> p_;
};

struct Data {
  std::vector<Buffer> src;  // the tensors
  std::vector<Buffer> dst;  // destinations of every load
  // Destinations of ranks 1.. of a replicated load.
  std::vector<std::vector<Buffer>> replicas;
  uint64_t bytes() const { return src.size() * kTensorBytes; }
  // Overwrites the destinations so that a load that skips bytes is caught.
  void Poison() {
    ParallelOver(static_cast<int>(dst.size()), [&](int i) {
      std::memset(dst[i].data(), 0xa5, dst[i].size());
    });
  }
  void VerifySameLayout(const std::string& what) const {
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] != dst[i])
        Die(absl::StrCat(what, ": tensor ", i, " differs from the data"));
    }
  }
};

// Rows [Lo(r, R), Lo(r + 1, R)) of every tensor belong to rank r of R.
uint64_t Lo(int r, int world, uint64_t n) { return n * r / world; }

std::string Name(int i) { return absl::StrFormat("layers.%d.w", i); }

// ---- the limit -----------------------------------------------------------

// Returns the write (+ fsync) and read timings.
std::pair<Timing, Timing> Sequential(const std::string& dir, Data& d,
                                     bool evict) {
  const std::string path = dir + "/sequential.bin";
  unlink(path.c_str());
  int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) Die("open " + path + ": " + std::strerror(errno));
  Stopwatch sw;
  for (const Buffer& s : d.src) {
    if (write(fd, s.data(), s.size()) != static_cast<ssize_t>(s.size()))
      Die("write " + path);
  }
  if (fsync(fd) != 0) Die("fsync " + path);
  close(fd);
  const Timing w = sw.Stop();
  if (evict) Evict(path);
  d.Poison();
  fd = open(path.c_str(), O_RDONLY);
  sw = Stopwatch();
  for (Buffer& s : d.dst) {
    if (read(fd, s.data(), s.size()) != static_cast<ssize_t>(s.size()))
      Die("read " + path);
  }
  const Timing r = sw.Stop();
  close(fd);
  unlink(path.c_str());
  d.VerifySameLayout("sequential read");
  return {w, r};
}

double Memcpy(Data& d, int threads) {
  std::atomic<int> next{0};
  Stopwatch sw;
  std::vector<std::thread> pool;
  for (int k = 0; k < threads; ++k) {
    pool.emplace_back([&] {
      for (int i; (i = next++) < static_cast<int>(d.src.size());) {
        std::memcpy(d.dst[i].data(), d.src[i].data(), kTensorBytes);
      }
    });
  }
  for (auto& th : pool) th.join();
  return d.bytes() / sw.Stop().wall / 1e9;
}

// ---- ckpt ---------------------------------------------------------------

// One configuration of ckpt and its figures, one per run.
struct Config {
  int ranks;
  format::Codec codec;
  std::string codec_name;
  bool direct = false;  // SaveOptions / ReaderOptions::direct_io
  std::vector<double> save, load, save_vs_limit, load_vs_limit, save_cpu,
      load_cpu;
  double ratio = 1;  // logical / stored bytes
  std::string Label() const { return codec_name + (direct ? " O_DIRECT" : ""); }
};

struct SaveOutcome {
  Timing time;
  uint64_t logical = 0, stored = 0;
};

SaveOutcome Save(const std::string& root, const Data& d, const Config& c,
                 int zstd_level, int threads) {
  const int world = c.ranks;
  std::filesystem::remove_all(root);
  ckpt::InProcessWorld w(world);
  SaveOutcome out;
  Stopwatch sw;
  absl::Status s =
      ckpt::RunRanks(w, [&](ckpt::Communicator& comm) -> absl::Status {
        const int r = comm.rank();
        ckpt::Writer::Options wo;
        wo.comm =
            world > 1 ? &comm : nullptr;  // one rank: the single-process path
        auto writer = ckpt::Writer::Create(wo);
        if (!writer.ok()) return writer.status();
        const uint64_t b = Lo(r, world, kRows), e = Lo(r + 1, world, kRows);
        for (size_t i = 0; i < d.src.size(); ++i) {
          absl::Status st = (*writer)->AddTensor(
              Name(i), ckpt::DType::kFloat32, {kRows, kCols},
              ckpt::Box{{b, 0}, {e - b, kCols}},
              d.src[i].data() + b * kCols * 4);
          if (!st.ok()) return st;
        }
        ckpt::SaveOptions so;
        so.codec = c.codec;
        so.zstd_level = zstd_level;
        so.io_threads = threads;
        so.direct_io = c.direct;
        auto saved = (*writer)->Save(root, 1, so);
        if (!saved.ok()) return saved.status();
        if (r == 0) {
          out.logical = saved->logical_bytes;
          out.stored = saved->stored_bytes;
        }
        return absl::OkStatus();
      });
  out.time = sw.Stop();
  Check(s, "save " + root);
  return out;
}

// What each rank of a load wants of every tensor.
enum class Want {
  kRows,        // rows [Lo(r), Lo(r + 1)): the saved layout
  kColumns,     // columns [Lo(r), Lo(r + 1)): every stored row is cut
  kEverything,  // the whole tensor, as data-parallel replicas do
};

struct LoadOutcome {
  Timing time;
  uint64_t bytes_read = 0;  // stored bytes read, summed over ranks
};

// `world` ranks each load one piece of every tensor with one Load
// (`coop`: one cooperative Load over the ranks' communicator). Rows go to
// their place in dst[i]; columns box-local, row-major, in dst[i] at the
// offset where the pieces of ranks < r end; everything to dst[i] on rank 0
// and replicas[r - 1][i] on rank r.
absl::Status LoadPieces(const std::string& root, Data& d, int world,
                        int threads, bool direct, Want want, bool coop,
                        uint64_t* bytes_read) {
  ckpt::InProcessWorld w(world);
  std::atomic<uint64_t> read{0};
  absl::Status st =
      ckpt::RunRanks(w, [&](ckpt::Communicator& comm) -> absl::Status {
        const int r = comm.rank();
        ckpt::ReaderOptions ro;
        ro.io_threads = threads;
        ro.direct_io = direct;
        if (coop) ro.communicator = &comm;
        auto reader = ckpt::Reader::Open(root, ro);
        if (!reader.ok()) return reader.status();
        const bool by_columns = want == Want::kColumns;
        const uint64_t n = by_columns ? kCols : kRows;
        const uint64_t b = Lo(r, world, n), e = Lo(r + 1, world, n);
        ckpt::Box box = by_columns ? ckpt::Box{{0, b}, {kRows, e - b}}
                                   : ckpt::Box{{b, 0}, {e - b, kCols}};
        if (want == Want::kEverything) box = ckpt::FullBox({kRows, kCols});
        std::vector<ckpt::LoadRequest> reqs;
        for (size_t i = 0; i < d.src.size(); ++i) {
          // Rows and columns put rank r's piece after b rows' or b
          // columns' worth of elements: b * kCols or kRows * b.
          char* out =
              want == Want::kEverything
                  ? (r == 0 ? d.dst[i].data() : d.replicas[r - 1][i].data())
                  : d.dst[i].data() + b * (by_columns ? kRows : kCols) * 4;
          reqs.push_back(
              {Name(i), ckpt::DType::kFloat32, {kRows, kCols}, box, out});
        }
        auto report = (*reader)->Load(reqs);
        if (!report.ok()) return report.status();
        read += report->bytes_read;
        return absl::OkStatus();
      });
  *bytes_read = read;
  return st;
}

Timing LoadSameLayout(const std::string& root, Data& d, int world, int threads,
                      bool direct, bool evict) {
  if (evict) Evict(root);
  d.Poison();
  Stopwatch sw;
  uint64_t read = 0;
  absl::Status s = LoadPieces(root, d, world, threads, direct, Want::kRows,
                              /*coop=*/false, &read);
  const Timing sec = sw.Stop();
  Check(s, "load " + root);
  d.VerifySameLayout("load of " + root);
  return sec;
}

LoadOutcome LoadColumns(const std::string& root, Data& d, int world,
                        int threads, bool evict, bool coop) {
  if (evict) Evict(root);
  d.Poison();
  LoadOutcome out;
  Stopwatch sw;
  absl::Status s = LoadPieces(root, d, world, threads, /*direct=*/false,
                              Want::kColumns, coop, &out.bytes_read);
  out.time = sw.Stop();
  Check(s, "resharded load of " + root);
  for (int r = 0; r < world; ++r) {
    const uint64_t b = Lo(r, world, kCols), e = Lo(r + 1, world, kCols);
    for (size_t i = 0; i < d.src.size(); ++i) {
      const char* piece = d.dst[i].data() + kRows * b * 4;
      for (uint64_t row = 0; row < kRows; ++row) {
        if (std::memcmp(piece + row * (e - b) * 4,
                        d.src[i].data() + (row * kCols + b) * 4,
                        (e - b) * 4) != 0) {
          Die(absl::StrCat("resharded load: tensor ", i, " row ", row,
                           " of rank ", r, " differs from the data"));
        }
      }
    }
  }
  return out;
}

// Every rank of `world` loads every tensor (replicas: d.replicas must
// hold world - 1 sets of destinations).
LoadOutcome LoadEverything(const std::string& root, Data& d, int world,
                           int threads, bool evict, bool coop) {
  if (evict) Evict(root);
  d.Poison();
  for (auto& set : d.replicas) {
    for (Buffer& b : set) std::memset(b.data(), 0xa5, b.size());
  }
  LoadOutcome out;
  Stopwatch sw;
  absl::Status s = LoadPieces(root, d, world, threads, /*direct=*/false,
                              Want::kEverything, coop, &out.bytes_read);
  out.time = sw.Stop();
  Check(s, "replicated load of " + root);
  d.VerifySameLayout("replicated load of " + root);
  for (const auto& set : d.replicas) {
    for (size_t i = 0; i < d.src.size(); ++i) {
      if (set[i] != d.src[i]) {
        Die(absl::StrCat("replicated load: tensor ", i, " differs"));
      }
    }
  }
  return out;
}

// The figures of the `reshard` JSON object, one per run.
struct ReshardFigures {
  std::vector<double> load, vs_same, amp_indep;      // independent, columns
  std::vector<double> coop_load, coop_vs_same, amp;  // cooperative, columns
  std::vector<double> rep_s_indep, rep_s, rep_amp_indep, rep_amp;  // replicas
};

// Rows to columns from `from` to `to` ranks, independent and cooperative,
// and `from` replicas loading everything, both ways. Amplification: bytes
// read by all ranks / `stored` (the stored bytes of the whole checkpoint,
// all of which every load requests).
void MeasureReshard(const std::string& root, Data& d, int from, int to,
                    int threads, bool evict, uint64_t stored, double same_wall,
                    ReshardFigures* f, std::string* line) {
  const double gb = d.bytes() / 1e9;
  const LoadOutcome ri = LoadColumns(root, d, to, threads, evict, false);
  const LoadOutcome rc = LoadColumns(root, d, to, threads, evict, true);
  f->load.push_back(gb / ri.time.wall);
  f->vs_same.push_back(ri.time.wall / same_wall);
  f->amp_indep.push_back(double(ri.bytes_read) / stored);
  f->coop_load.push_back(gb / rc.time.wall);
  f->coop_vs_same.push_back(rc.time.wall / same_wall);
  f->amp.push_back(double(rc.bytes_read) / stored);
  if (d.replicas.empty()) {
    d.replicas.resize(from - 1);
    for (auto& set : d.replicas) set.resize(d.src.size());
  }
  const LoadOutcome pi = LoadEverything(root, d, from, threads, evict, false);
  const LoadOutcome pc = LoadEverything(root, d, from, threads, evict, true);
  f->rep_s_indep.push_back(pi.time.wall);
  f->rep_s.push_back(pc.time.wall);
  f->rep_amp_indep.push_back(double(pi.bytes_read) / stored);
  f->rep_amp.push_back(double(pc.bytes_read) / stored);
  absl::StrAppendFormat(
      line,
      " reshard %d->%d %.2f (coop %.2f, amplification %.2f vs %.2f);"
      " %d replicas %.2f s (coop %.2f s, amplification %.2f vs %.2f)",
      from, to, f->load.back(), f->coop_load.back(), f->amp.back(),
      f->amp_indep.back(), from, pi.time.wall, pc.time.wall, f->rep_amp.back(),
      f->rep_amp_indep.back());
}

// ---- output -------------------------------------------------------------

std::string Json(const std::vector<double>& v) {
  return absl::StrCat("[",
                      absl::StrJoin(v, ", ",
                                    [](std::string* out, double x) {
                                      absl::StrAppendFormat(out, "%.4f", x);
                                    }),
                      "]");
}

std::vector<int> ParseInts(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int v;
    if (!absl::SimpleAtoi(p, &v) || v < 1 || v > 1024)
      Die(absl::StrCat("bad rank count '", p, "'"));
    out.push_back(v);
  }
  return out;
}

void ReadInputs(const std::string& path, Data& d) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) Die("open " + path + ": " + std::strerror(errno));
  struct stat st;
  fstat(fd, &st);
  if (st.st_size == 0 || st.st_size % kTensorBytes != 0) {
    Die(absl::StrCat(path, ": ", st.st_size,
                     " bytes is not a whole number of 64 MiB tensors"));
  }
  d.src.resize(st.st_size / kTensorBytes);
  for (Buffer& s : d.src) {
    if (read(fd, s.data(), s.size()) != static_cast<ssize_t>(s.size()))
      Die("read " + path);
  }
  close(fd);
}

void DumpInputs(const std::string& path, const Data& d) {
  int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) Die("open " + path + ": " + std::strerror(errno));
  for (const Buffer& s : d.src) {
    if (write(fd, s.data(), s.size()) != static_cast<ssize_t>(s.size()))
      Die("write " + path);
  }
  close(fd);
  std::vector<std::string> names;
  for (size_t i = 0; i < d.src.size(); ++i)
    names.push_back("\"" + Name(i) + "\"");
  FILE* f = std::fopen((path + ".json").c_str(), "w");
  if (f == nullptr) Die("open " + path + ".json");
  std::fprintf(f,
               "{\"dtype\": \"float32\", \"byte_order\": \"little\", "
               "\"shape\": [%llu, %llu], "
               "\"tensors\": %zu, \"names\": [%s]}\n",
               static_cast<unsigned long long>(kRows),
               static_cast<unsigned long long>(kCols), d.src.size(),
               absl::StrJoin(names, ", ").c_str());
  std::fclose(f);
}

struct Options {
  std::string dir, ranks_arg = "1", codecs_arg = "none", inputs, dump;
  std::string storage;  // s3://...: the counts of bench_io_s3.h
  int part_mib = 16;
  bool create_bucket = false;
  double gib = 2;
  int threads = 4, repeats = 3, reshard_to = 0, zstd_level = 3;
  bool evict = false, direct = false;
};

// -1 when the benchmark goes on, else the exit code (--help: 0).
int ParseOptions(int argc, char** argv, Options* o) {
  CLI::App app{
      "ckpt save/load throughput vs. sequential I/O on the same directory"};
  app.add_option(
      "--dir", o->dir,
      "directory to write into (created; what is written is removed)");
  app.add_option("--storage", o->storage,
                 "s3://bucket/prefix: count requests and bytes of a save, a "
                 "cooperative resharded load and a replicated load on S3 "
                 "instead (AWS_* environment variables)");
  app.add_option("--part-mib", o->part_mib,
                 "with --storage: multipart part size in MiB (>= 5)");
  app.add_flag("--create-bucket", o->create_bucket,
               "with --storage: create the bucket first");
  app.add_option("--gib", o->gib, "GiB of data (64 MiB tensors)");
  app.add_option("--threads", o->threads, "I/O threads of each rank");
  app.add_option("--repeats", o->repeats,
                 "runs; each figure is the median, each ratio the median of "
                 "per-run ratios (0: "
                 "only generate and --dump-inputs)");
  app.add_option("--ranks", o->ranks_arg,
                 "comma-separated in-process rank counts, e.g. 1,4");
  app.add_option("--codecs", o->codecs_arg,
                 "comma-separated codecs: none, zstd");
  app.add_option("--zstd-level", o->zstd_level, "zstd level");
  app.add_option("--reshard-to", o->reshard_to,
                 "also load the checkpoint of the most ranks on this many "
                 "ranks, by columns (0: off)");
  app.add_flag("--direct", o->direct,
               "also save and load uncompressed with O_DIRECT "
               "(SaveOptions/ReaderOptions::direct_io)");
  app.add_flag("--evict", o->evict,
               "drop every file's cached pages before it is read (cold reads)");
  app.add_option("--inputs", o->inputs,
                 "read the tensors from this file (written by --dump-inputs)");
  app.add_option("--dump-inputs", o->dump,
                 "write the tensors to this file (raw float32) and PATH.json");
  CLI11_PARSE(app, argc, argv);
  if (o->dir.empty() && o->storage.empty()) {
    std::cerr << "ckpt-bench-io: --dir or --storage is required\n";
    return 64;
  }
  return -1;
}

// --storage: the S3 counts; the process's exit code.
int RunStorage(const Options& o) {
#ifdef CKPT_BENCH_IO_S3
  if (absl::StartsWith(o.storage, "s3://")) {
    ckpt::bench::S3CountsOptions so;
    so.url = o.storage;
    so.gib = o.gib;
    const std::vector<int> ranks = ParseInts(o.ranks_arg);
    so.ranks = *std::max_element(ranks.begin(), ranks.end());
    so.reshard_to = o.reshard_to > 0 ? o.reshard_to : so.ranks + 1;
    so.threads = o.threads;
    so.part_mib = o.part_mib;
    so.create_bucket = o.create_bucket;
    return ckpt::bench::RunS3Counts(so);
  }
#endif
  std::cerr << "ckpt-bench-io: --storage " << o.storage
            << ": only s3:// URLs, with a build that has ckpt_s3\n";
  return 64;
}

// The tensors: read from --inputs or generated, and dumped with
// --dump-inputs.
void MakeInputs(const Options& o, Data* d) {
  if (!o.inputs.empty()) {
    ReadInputs(o.inputs, *d);
  } else {
    const int n =
        std::max<int>(1, static_cast<int>(o.gib * (1ull << 30) / kTensorBytes));
    d->src.resize(n);
    ParallelOver(n, [&](int i) { Generate(i, d->src[i].data()); });
  }
  if (!o.dump.empty()) DumpInputs(o.dump, *d);
}

// What to measure: every codec on every rank count (and O_DIRECT with
// --direct), and the resharded loads of the most ranks' checkpoint.
struct Plan {
  std::vector<Config> configs;
  int reshard_from = 0, reshard_to = 0;
  bool reshard = false;
};

Plan MakePlan(const Options& o) {
  Plan p;
  const std::vector<int> rank_counts = ParseInts(o.ranks_arg);
  for (absl::string_view c :
       absl::StrSplit(o.codecs_arg, ',', absl::SkipEmpty())) {
    format::Codec codec;
    if (c == "none") {
      codec = format::Codec::kNone;
    } else if (c == "zstd") {
      codec = format::Codec::kZstd;
    } else {
      Die(absl::StrCat("unknown codec '", c, "'"));
    }
    for (int r : rank_counts)
      p.configs.push_back(Config{r, codec, std::string(c)});
  }
  if (o.direct) {
    for (int r : rank_counts)
      p.configs.push_back(Config{r, format::Codec::kNone, "none", true});
  }
  p.reshard_from = *std::max_element(rank_counts.begin(), rank_counts.end());
  p.reshard_to = o.reshard_to;
  p.reshard =
      o.reshard_to > 0 &&
      std::any_of(p.configs.begin(), p.configs.end(), [&](auto& c) {
        return c.ranks == p.reshard_from && c.codec == format::Codec::kNone;
      });
  return p;
}

// The limits, one figure per run.
struct Limits {
  std::vector<double> write, read, write_cpu, read_cpu, memcpy1, memcpyn;
  int cores = 1;
};

// One run: the limits, then every configuration's save and load (and the
// resharded loads), next to each other so that all see the machine in the
// same state. Prints the run's line.
void RunOnce(int rep, const Options& o, Data& d, Limits* l, Plan* p,
             ReshardFigures* rf) {
  const double gb = d.bytes() / 1e9;
  auto [wt, rt] = Sequential(o.dir, d, o.evict);
  const double ws = gb / wt.wall, rs = gb / rt.wall;
  l->write.push_back(ws);
  l->read.push_back(rs);
  l->write_cpu.push_back(wt.cpu / gb);
  l->read_cpu.push_back(rt.cpu / gb);
  l->memcpy1.push_back(Memcpy(d, 1));
  l->memcpyn.push_back(Memcpy(d, l->cores));
  std::string line = absl::StrFormat(
      "run %d: limit write %.2f read %.2f memcpy %.2f/%.2f GB/s", rep + 1, ws,
      rs, l->memcpy1.back(), l->memcpyn.back());
  for (Config& c : p->configs) {
    const std::string root =
        absl::StrFormat("%s/ckpt-%d-%s%s", o.dir, c.ranks, c.codec_name,
                        c.direct ? "-direct" : "");
    SaveOutcome so = Save(root, d, c, o.zstd_level, o.threads);
    const Timing lt =
        LoadSameLayout(root, d, c.ranks, o.threads, c.direct, o.evict);
    c.save.push_back(gb / so.time.wall);
    c.load.push_back(gb / lt.wall);
    c.save_cpu.push_back(so.time.cpu / gb);
    c.load_cpu.push_back(lt.cpu / gb);
    c.save_vs_limit.push_back(c.save.back() / ws);
    c.load_vs_limit.push_back(c.load.back() / rs);
    c.ratio = so.stored ? double(so.logical) / so.stored : 0;
    absl::StrAppendFormat(&line, "; %s x%d save %.2f load %.2f", c.Label(),
                          c.ranks, c.save.back(), c.load.back());
    if (p->reshard && c.ranks == p->reshard_from &&
        c.codec == format::Codec::kNone && !c.direct) {
      MeasureReshard(root, d, p->reshard_from, p->reshard_to, o.threads,
                     o.evict, so.stored, lt.wall, rf, &line);
    }
    std::filesystem::remove_all(root);
  }
  std::cout << line << "\n" << std::flush;
}

void PrintSummary(const Options& o, const Data& d, const Limits& l,
                  const Plan& p, const ReshardFigures& rf) {
  std::printf(
      "dir %s, %.2f GiB in %d tensors of 64 MiB, %d threads per rank, median "
      "of %d runs\n",
      o.dir.c_str(), d.bytes() / double(1ull << 30),
      static_cast<int>(d.src.size()), o.threads, o.repeats);
  std::printf(
      "limit: sequential write+fsync %.2f GB/s (%.2f CPU s/GB), read %.2f GB/s "
      "(%.2f CPU "
      "s/GB); memcpy %.2f GB/s (1 thread), %.2f GB/s (%d threads)\n",
      Median(l.write), Median(l.write_cpu), Median(l.read), Median(l.read_cpu),
      Median(l.memcpy1), Median(l.memcpyn), l.cores);
  for (const Config& c : p.configs) {
    std::printf(
        "ckpt %s, %d rank%s: save %.2f GB/s (%.0f%% of the limit, %.2f CPU "
        "s/GB), load "
        "%.2f GB/s (%.0f%%, %.2f CPU s/GB)",
        c.Label().c_str(), c.ranks, c.ranks > 1 ? "s" : "", Median(c.save),
        100 * Median(c.save_vs_limit), Median(c.save_cpu), Median(c.load),
        100 * Median(c.load_vs_limit), Median(c.load_cpu));
    if (c.codec != format::Codec::kNone)
      std::printf(", compression ratio %.3f", c.ratio);
    std::printf("\n");
  }
  if (!p.reshard) return;
  std::printf(
      "resharded load %d -> %d ranks (rows to columns): %.2f GB/s (%.2fx the "
      "same-layout time, read amplification %.3f); cooperative %.2f GB/s "
      "(%.2fx, read amplification %.3f)\n",
      p.reshard_from, p.reshard_to, Median(rf.load), Median(rf.vs_same),
      Median(rf.amp_indep), Median(rf.coop_load), Median(rf.coop_vs_same),
      Median(rf.amp));
  std::printf(
      "replicated load on %d ranks (each loads everything): %.3f s (read "
      "amplification %.3f); cooperative %.3f s (read amplification %.3f)\n",
      p.reshard_from, Median(rf.rep_s_indep), Median(rf.rep_amp_indep),
      Median(rf.rep_s), Median(rf.rep_amp));
}

// The last line: the JSON object of bench/README.md.
std::string JsonLine(const Options& o, const Data& d, const Limits& l,
                     const Plan& p, const ReshardFigures& rf) {
  std::string json = absl::StrFormat(
      "{\"dir\": \"%s\", \"bytes\": %llu, \"tensors\": %d, \"tensor_shape\": "
      "[%llu, %llu], "
      "\"threads\": %d, \"repeats\": %d, \"evict\": %s, \"cores\": %d, "
      "\"limit\": {\"write_GBps\": %s, \"read_GBps\": %s, "
      "\"write_cpu_s_per_GB\": %s, "
      "\"read_cpu_s_per_GB\": %s, \"memcpy_GBps\": %s, "
      "\"memcpy_all_cores_GBps\": %s}, "
      "\"ckpt\": [",
      o.dir, static_cast<unsigned long long>(d.bytes()),
      static_cast<int>(d.src.size()), static_cast<unsigned long long>(kRows),
      static_cast<unsigned long long>(kCols), o.threads, o.repeats,
      o.evict ? "true" : "false", l.cores, Json(l.write), Json(l.read),
      Json(l.write_cpu), Json(l.read_cpu), Json(l.memcpy1), Json(l.memcpyn));
  for (size_t i = 0; i < p.configs.size(); ++i) {
    const Config& c = p.configs[i];
    absl::StrAppendFormat(
        &json,
        "%s{\"ranks\": %d, \"codec\": \"%s\", \"io\": \"%s\", \"save_GBps\": "
        "%s, "
        "\"load_GBps\": %s, \"save_vs_limit\": %s, \"load_vs_limit\": %s, "
        "\"save_cpu_s_per_GB\": %s, \"load_cpu_s_per_GB\": %s, "
        "\"compression_ratio\": %.4f}",
        i ? ", " : "", c.ranks, c.codec_name, c.direct ? "direct" : "buffered",
        Json(c.save), Json(c.load), Json(c.save_vs_limit),
        Json(c.load_vs_limit), Json(c.save_cpu), Json(c.load_cpu), c.ratio);
  }
  json += "]";
  if (p.reshard) {
    absl::StrAppendFormat(
        &json,
        ", \"reshard\": {\"from\": %d, \"to\": %d, \"load_GBps\": %s, "
        "\"time_vs_same_layout\": %s, \"read_amplification\": %s, "
        "\"read_amplification_independent\": %s, \"coop_load_GBps\": %s, "
        "\"coop_time_vs_same_layout\": %s, \"replicated\": {\"ranks\": %d, "
        "\"seconds\": %s, \"seconds_independent\": %s, "
        "\"read_amplification\": %s, \"read_amplification_independent\": "
        "%s}}",
        p.reshard_from, p.reshard_to, Json(rf.load), Json(rf.vs_same),
        Json(rf.amp), Json(rf.amp_indep), Json(rf.coop_load),
        Json(rf.coop_vs_same), p.reshard_from, Json(rf.rep_s),
        Json(rf.rep_s_indep), Json(rf.rep_amp), Json(rf.rep_amp_indep));
  }
  json += "}";
  return json;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (int rc = ParseOptions(argc, argv, &o); rc >= 0) return rc;
  if (!o.storage.empty()) return RunStorage(o);
  Data d;
  MakeInputs(o, &d);
  if (o.repeats < 1) return 0;  // --repeats 0: only generate (and dump)
  d.dst.resize(d.src.size());
  Plan p = MakePlan(o);
  std::filesystem::create_directories(o.dir);
  Limits l;
  l.cores = std::max(1u, std::thread::hardware_concurrency());
  ReshardFigures rf;
  for (int rep = 0; rep < o.repeats; ++rep) RunOnce(rep, o, d, &l, &p, &rf);
  PrintSummary(o, d, l, p, rf);
  std::printf("%s\n", JsonLine(o, d, l, p, rf).c_str());
  return 0;
}

// ckpt-bench-inspect: the speed of ckpt-inspect's metadata path on a
// checkpoint of a million chunks, and of ckpt-validate's full check against
// a plain read of the same bytes, measured in the same run.
//
//   ckpt-bench-inspect --dir /dev/shm/bi [--chunk-ranks 1024] [--gib 1]
//
// 1. A checkpoint of 1024 tensors x 1024 ranks = 1M chunks of 32-96 bytes
//    (half of the tensors row-sharded boxes, half uneven flat ranges), built
//    directly with the format codecs: valid shard files (header, payload,
//    index with block tables, tail) and a manifest, as 1024 in-process
//    Writer ranks would write them but in seconds. Timed:
//    tools::LoadSummary + PrintInspectText (what `ckpt-inspect DIR` does),
//    and a full Validate of it (a million tiny blocks).
// 2. A ~1 GiB checkpoint of float32 tensors (64 MiB each) saved by
//    ckpt::Writer. Timed: full Validate (every block read and verified),
//    against reading the same shard files with pread in 1 MiB pieces on
//    the same number of threads, and with one thread (dd-like).
// Caches are warm for both (dropping them needs root); each figure is the
// median of --repeats runs. The last line is one JSON object.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "ckpt/format/checksum.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/shard.h"
#include "ckpt/writer.h"
#include "inspect/inspect.h"
#include "util/align.h"
#include "validate/validate.h"

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// CPU time of this thread: with other processes on the machine, closer to
// the work done than the wall clock.
double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// CPU time of the whole process (all threads, user + system).
double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::cerr << what << ": " << s << "\n";
    std::exit(1);
  }
}

void WriteFileOrDie(const std::string& path, const std::string& data) {
  int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0 || write(fd, data.data(), data.size()) !=
                    static_cast<ssize_t>(data.size())) {
    std::cerr << "cannot write " << path << "\n";
    std::exit(1);
  }
  close(fd);
}

constexpr uint64_t kManyChunksCols = 16;
constexpr uint64_t kManyChunksAlign = 64;

// The chunk of rank `r` of tensor `t` of checkpoint 1 (BuildManyChunks).
ckpt::Region ManyChunksRegion(uint32_t t, uint32_t r) {
  if (t % 2 == 0) return ckpt::Box{{r, 0}, {1, kManyChunksCols}};
  uint64_t start = (r / 2) * 32 + (r % 2) * 8;
  return ckpt::FlatRange{start, r % 2 == 0 ? 8u : 24u};
}

// Rank r's shard file of checkpoint 1; adds its chunks to m's entries.
std::string BuildManyChunksShard(uint32_t r, uint32_t tensors,
                                 ckpt::format::Manifest* m) {
  using namespace ckpt;
  using namespace ckpt::format;
  std::vector<float> values(32);
  ShardHeader h;
  h.checkpoint_id = m->info.id;
  h.shard_id = r;
  h.alignment = kManyChunksAlign;
  std::string file = EncodeShardHeader(h);
  ShardIndex index;
  index.info = m->info;
  index.entries.reserve(tensors);
  for (uint32_t t = 0; t < tensors; ++t) {
    ChunkRecord c;
    c.region = ManyChunksRegion(t, r);
    c.shard = r;
    const uint64_t n = RegionElements(c.region) * 4;
    for (size_t i = 0; i < n / 4; ++i)
      values[i] = static_cast<float>(t + r + i) * 0.5f;
    file.resize(ckpt::internal::AlignUp(file.size(), kManyChunksAlign), '\0');
    c.data_offset = file.size();
    c.stored_length = n;
    file.append(reinterpret_cast<const char*>(values.data()), n);
    m->entries[t].chunks.push_back(c);
    c.blocks.push_back(
        BlockRecord{n, Checksum(file.data() + c.data_offset, n)});
    EntryRecord e;
    e.name = m->entries[t].name;
    e.dtype = m->entries[t].dtype;
    e.shape = m->entries[t].shape;
    e.chunks.push_back(std::move(c));
    index.entries.push_back(std::move(e));
  }
  std::string idx = EncodeShardIndex(index);
  ShardTail tail{file.size(), idx.size(), Checksum(idx)};
  file += idx;
  file += EncodeShardTail(tail);
  return file;
}

// Checkpoint 1: `tensors` float32 tensors of shape [ranks, 16], each split
// into one chunk per rank. Even tensors: box rows (dim0 x ranks). Odd
// tensors: flat ranges of 8 and 24 elements alternately (flat x ranks
// uneven). Returns the checkpoint directory.
std::string BuildManyChunks(const std::string& root, uint32_t ranks,
                            uint32_t tensors) {
  using namespace ckpt;
  using namespace ckpt::format;
  const std::string dir = root + "/" + StepDirName(1);
  std::filesystem::create_directories(dir);
  Manifest m;
  for (int i = 0; i < 16; ++i) m.info.id[i] = static_cast<uint8_t>(0xa0 + i);
  m.info.step = 1;
  m.info.world_size = ranks;
  m.info.created_unix_ns = 1795219200000000000;
  m.info.writer = "ckpt-bench-inspect";
  m.entries.resize(tensors);
  for (uint32_t t = 0; t < tensors; ++t) {
    m.entries[t].name =
        absl::StrFormat("layers.%04d.%s", t / 2, t % 2 == 0 ? "w" : "exp_avg");
    m.entries[t].dtype = DType::kFloat32;
    m.entries[t].shape = {ranks, kManyChunksCols};
    m.entries[t].chunks.reserve(ranks);
  }
  for (uint32_t r = 0; r < ranks; ++r) {
    const std::string file = BuildManyChunksShard(r, tensors, &m);
    std::string name = ShardFileName(r);
    m.shards.push_back(ShardInfo{r, name, file.size()});
    WriteFileOrDie(dir + "/" + name, file);
  }
  WriteFileOrDie(dir + "/" + kManifestFileName, EncodeManifest(m));
  WriteFileOrDie(root + "/" + kLatestFileName, EncodeLatest(StepDirName(1)));
  return dir;
}

// Checkpoint 2: `count` float32 tensors [4096, 4096] (64 MiB) saved by
// ckpt::Writer. One rank: multi-rank saves currently give each shard index
// its own created_unix_ns, which ckpt-validate rightly reports.
std::string BuildLarge(const std::string& root, int count) {
  using namespace ckpt;
  const uint64_t rows = 4096, cols = 4096;
  std::vector<std::vector<float>> data(count);
  auto w = Writer::Create({});
  Check(w.status(), "writer");
  for (int t = 0; t < count; ++t) {
    data[t].resize(rows * cols);
    uint32_t x = 2463534242u + t;
    for (float& v : data[t]) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      v = static_cast<float>(x >> 8) * 1e-6f;
    }
    Check((*w)->AddTensor(absl::StrFormat("big.%02d", t), DType::kFloat32,
                          {rows, cols}, FullBox({rows, cols}), data[t].data()),
          "add");
  }
  auto res = (*w)->Save(root, 1, SaveOptions{});
  Check(res.status(), "save");
  return res->path;
}

// Reads every file of `dir` but MANIFEST with pread in 1 MiB pieces: the
// files are split into 8 MiB tasks taken by `threads` threads. Returns GB/s.
double PlainRead(const std::string& dir, int threads) {
  struct Task {
    std::string path;
    uint64_t lo, hi;
  };
  std::vector<Task> tasks;
  uint64_t total = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename() == "MANIFEST") continue;
    uint64_t size = e.file_size();
    total += size;
    for (uint64_t o = 0; o < size; o += 8 << 20) {
      tasks.push_back(
          {e.path().string(), o, std::min<uint64_t>(size, o + (8 << 20))});
    }
  }
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> sink{0};
  auto t0 = Clock::now();
  auto worker = [&] {
    std::string buf(1 << 20, '\0');
    for (size_t i; (i = next++) < tasks.size();) {
      int fd = open(tasks[i].path.c_str(), O_RDONLY);
      for (uint64_t o = tasks[i].lo; o < tasks[i].hi; o += buf.size()) {
        ssize_t n = pread(fd, buf.data(),
                          std::min<uint64_t>(buf.size(), tasks[i].hi - o), o);
        if (n <= 0) std::abort();
        sink += static_cast<unsigned char>(buf[0]);
      }
      close(fd);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  return total / Since(t0) / 1e9;
}

struct Options {
  std::string dir;
  uint32_t ranks = 1024, tensors = 1024;
  int large_tensors = 16;
  int threads =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int repeats = 3;
  bool keep = false;
};

// -1 when the benchmark goes on, else the exit code (--help: 0).
int ParseOptions(int argc, char** argv, Options* o) {
  CLI::App app{
      "ckpt-inspect metadata speed (1M chunks) and ckpt-validate throughput"};
  app.add_option("--dir", o->dir,
                 "directory to write into (removed afterwards)")
      ->required();
  app.add_option("--ranks", o->ranks, "shards of the many-chunk checkpoint");
  app.add_option(
      "--tensors", o->tensors,
      "tensors of the many-chunk checkpoint (chunks = ranks x tensors)");
  app.add_option("--large-tensors", o->large_tensors,
                 "64 MiB tensors of the large checkpoint");
  app.add_option("--threads", o->threads, "validate and read threads");
  app.add_option("--repeats", o->repeats, "runs per figure (median)");
  app.add_flag("--keep", o->keep,
               "keep the checkpoints (for profiling the tools)");
  CLI11_PARSE(app, argc, argv);
  return -1;
}

// The figures of checkpoint 1 (metadata) and checkpoint 2 (throughput).
struct Figures {
  std::vector<double> inspect_ms, inspect_cpu_ms, validate_many_s;
  size_t out_bytes = 0;
  std::vector<double> validate_gbps, read_gbps, read1_gbps, ratio, validate_cpu,
      read_cpu;
};

// ckpt-inspect's text output of checkpoint `many`, `repeats` times.
void TimeInspect(const std::string& many, int repeats, Figures* f) {
  for (int i = 0; i < repeats; ++i) {
    auto t = Clock::now();
    double cpu = CpuSeconds();
    auto s = ckpt::tools::LoadSummary(many);
    Check(s.status(), "inspect");
    std::ostringstream out;
    ckpt::tools::PrintInspectText(*s, out);
    f->inspect_ms.push_back(Since(t) * 1e3);
    f->inspect_cpu_ms.push_back((CpuSeconds() - cpu) * 1e3);
    f->out_bytes = out.str().size();
  }
}

// ckpt-validate of checkpoint `path` on `threads` threads; exits when the
// checkpoint is not valid.
ckpt::tools::ValidateReport ValidateOrDie(const std::string& path, int threads,
                                          const char* what) {
  ckpt::tools::ValidateOptions o;
  o.path = path;
  o.threads = threads;
  auto r = ckpt::tools::Validate(o);
  Check(r.status(), "validate");
  if (!r->valid()) {
    std::cerr << "the " << what << " checkpoint is not valid: "
              << ckpt::tools::FindingText(r->findings[0]) << "\n";
    std::exit(1);
  }
  return *std::move(r);
}

// Where the (CPU) time of one inspect of checkpoint `many` goes.
void PrintInspectPhases(const std::string& many) {
  double c;
  c = CpuSeconds();
  std::string bytes;
  Check(ckpt::DefaultStorage()->ReadFile(many + "/MANIFEST").status(), "read");
  bytes = *ckpt::DefaultStorage()->ReadFile(many + "/MANIFEST");
  double read_ms = (CpuSeconds() - c) * 1e3;
  c = CpuSeconds();
  auto m = ckpt::format::DecodeManifest(bytes);
  Check(m.status(), "decode");
  double decode_ms = (CpuSeconds() - c) * 1e3;
  c = CpuSeconds();
  auto s = ckpt::tools::Summarize(many, *std::move(m));
  double summarize_ms = (CpuSeconds() - c) * 1e3;
  c = CpuSeconds();
  std::ostringstream out;
  ckpt::tools::PrintInspectText(s, out);
  double print_ms = (CpuSeconds() - c) * 1e3;
  c = CpuSeconds();
  s = ckpt::tools::CheckpointSummary();
  double free_ms = (CpuSeconds() - c) * 1e3;
  std::cout << absl::StrFormat(
      "inspect phases (CPU): read %.0f ms (%zu bytes), decode %.0f ms, "
      "summarize %.0f ms, print %.0f "
      "ms, free %.0f ms\n",
      read_ms, bytes.size(), decode_ms, summarize_ms, print_ms, free_ms);
}

// Checkpoint 1: inspect and validate of a million chunks of metadata.
void MeasureManyChunks(const Options& o, Figures* f) {
  auto t = Clock::now();
  const std::string many = BuildManyChunks(o.dir + "/many", o.ranks, o.tensors);
  std::cout << absl::StrFormat("built %u chunks in %u shards in %.1f s\n",
                               uint64_t{o.ranks} * o.tensors, o.ranks,
                               Since(t));
  TimeInspect(many, o.repeats, f);
  for (int i = 0; i < o.repeats; ++i) {
    f->validate_many_s.push_back(
        ValidateOrDie(many, o.threads, "generated").seconds);
  }
  PrintInspectPhases(many);
  std::cout << absl::StrFormat(
      "inspect (metadata, %u chunks, %u entries, %zu bytes of output): %.0f ms "
      "(%.0f ms CPU)\n",
      uint64_t{o.ranks} * o.tensors, o.tensors, f->out_bytes,
      Median(f->inspect_ms), Median(f->inspect_cpu_ms));
  std::cout << absl::StrFormat(
      "validate of the same (every block verified): %.2f s\n",
      Median(f->validate_many_s));
  if (!o.keep) std::filesystem::remove_all(o.dir + "/many");
}

// Checkpoint 2: validate against a plain read of the same files.
void MeasureLarge(const Options& o, Figures* f) {
  auto t = Clock::now();
  const std::string large = BuildLarge(o.dir + "/large", o.large_tensors);
  std::cout << absl::StrFormat("saved %d MiB in %.1f s\n", o.large_tensors * 64,
                               Since(t));
  for (int i = 0; i < o.repeats; ++i) {
    double c = ProcessCpuSeconds();
    double rd = PlainRead(large, o.threads);
    f->read_cpu.push_back(ProcessCpuSeconds() - c);
    c = ProcessCpuSeconds();
    ckpt::tools::ValidateReport r = ValidateOrDie(large, o.threads, "saved");
    f->validate_cpu.push_back(ProcessCpuSeconds() - c);
    double v = r.bytes_verified / r.seconds / 1e9;
    f->read1_gbps.push_back(PlainRead(large, 1));
    f->validate_gbps.push_back(v);
    f->read_gbps.push_back(rd);
    f->ratio.push_back(v / rd);
  }
}

void Report(const Options& o, const Figures& f) {
  const double gb = o.large_tensors * 64.0 * (1 << 20) / 1e9;
  std::cout << absl::StrFormat(
      "validate %.2f GB/s, plain read %.2f GB/s on %d threads (%.0f%%), %.2f "
      "GB/s on 1 thread\n"
      "CPU cost: validate %.2f s/GB, plain read %.2f s/GB: validation is "
      "I/O-bound, at the "
      "device's speed, on devices slower than about %.1f GB/s per core\n",
      Median(f.validate_gbps), Median(f.read_gbps), o.threads,
      Median(f.ratio) * 100, Median(f.read1_gbps), Median(f.validate_cpu) / gb,
      Median(f.read_cpu) / gb, gb / std::max(1e-9, Median(f.validate_cpu)));
  if (!o.keep) std::filesystem::remove_all(o.dir);
  std::cout << absl::StrFormat(
      "{\"inspect_1m_chunks_ms\":%.1f,\"inspect_1m_chunks_cpu_ms\":%.1f,"
      "\"validate_1m_chunks_s\":%.2f,\"validate_GBps\":%.2f,"
      "\"read_GBps\":%.2f,\"read_1thread_GBps\":%.2f,\"validate_vs_read\":%.2f,"
      "\"validate_cpu_s_per_GB\":%.3f,\"read_cpu_s_per_GB\":%.3f}\n",
      Median(f.inspect_ms), Median(f.inspect_cpu_ms), Median(f.validate_many_s),
      Median(f.validate_gbps), Median(f.read_gbps), Median(f.read1_gbps),
      Median(f.ratio), Median(f.validate_cpu) / gb, Median(f.read_cpu) / gb);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (int rc = ParseOptions(argc, argv, &o); rc >= 0) return rc;
  std::filesystem::remove_all(o.dir);
  std::filesystem::create_directories(o.dir);
  Figures f;
  MeasureManyChunks(o, &f);
  MeasureLarge(o, &f);
  Report(o, f);
  return 0;
}

// ckpt-bench-io: save and load throughput against the sequential bandwidth
// of the same directory, measured in the same run.
//
//   ckpt-bench-io --dir /dev/shm/b --gib 2 --threads 4
//
// Saves G GiB of float32 tensors (64 MiB each, uncompressed), loads them back
// under the same layout and under a different one (each tensor loaded as
// two column halves), and compares with a dd-like baseline: sequential
// 64 MiB writes of one file followed by fsync, and sequential reads of it.
// The page cache is what it is: on /dev/shm it is the medium itself; on a
// disk the read figures measure the cache unless the file is evicted (the
// baseline and ckpt are treated alike). The last line is one JSON object.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "ckpt/reader.h"
#include "ckpt/writer.h"

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The dd-like limit for the same bytes: the same buffers written in order
// to one file with large sequential writes + fsync, then read back in order
// into the same destination buffers.
std::pair<double, double> Baseline(const std::string& dir, const std::vector<std::string>& src,
                                   std::vector<std::string>& dst) {
  std::string path = dir + "/baseline.bin";
  uint64_t bytes = 0;
  int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  auto t = Clock::now();
  for (const std::string& s : src) {
    if (write(fd, s.data(), s.size()) != static_cast<ssize_t>(s.size())) std::abort();
    bytes += s.size();
  }
  fsync(fd);
  close(fd);
  double w = Since(t);
  fd = open(path.c_str(), O_RDONLY);
  t = Clock::now();
  for (std::string& d : dst) {
    if (read(fd, d.data(), d.size()) != static_cast<ssize_t>(d.size())) std::abort();
  }
  double r = Since(t);
  close(fd);
  unlink(path.c_str());
  return {bytes / w / 1e9, bytes / r / 1e9};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ckpt save/load throughput vs. sequential I/O on the same directory"};
  std::string dir;
  double gib = 2;
  int threads = 4;
  int repeats = 3;
  app.add_option("--dir", dir, "directory to write into (removed afterwards)")->required();
  app.add_option("--gib", gib, "GiB of data");
  app.add_option("--threads", threads, "I/O threads");
  app.add_option("--repeats", repeats, "runs; each figure is the median, each ratio the median of per-run ratios");
  CLI11_PARSE(app, argc, argv);

  const uint64_t kTensorBytes = 64ull << 20;
  const uint64_t rows = 4096, cols = kTensorBytes / 4 / rows;  // 4096 x 4096 float32
  const int ntensors = std::max<int>(1, static_cast<int>(gib * (1ull << 30) / kTensorBytes));
  const uint64_t total = ntensors * kTensorBytes;
  std::filesystem::create_directories(dir);

  std::vector<std::string> data(ntensors);
  std::mt19937_64 rng(1);
  for (auto& d : data) {
    d.resize(kTensorBytes);
    for (size_t i = 0; i < d.size(); i += 8) {
      uint64_t v = rng();
      std::memcpy(d.data() + i, &v, 8);
    }
  }
  std::vector<double> v_ws, v_rs, v_save, v_load, v_reshard, r_save, r_load, r_reshard;
  std::vector<std::string> out(ntensors, std::string(kTensorBytes, '\0'));
  for (int rep = 0; rep < repeats; ++rep) {
    // The limit is measured next to each ckpt run so that both see the
    // machine in the same state.
    auto [ws, rs] = Baseline(dir, data, out);
    v_ws.push_back(ws);
    v_rs.push_back(rs);

    std::string root = dir + "/root";
    std::filesystem::remove_all(root);
    auto writer = ckpt::Writer::Create({}).value();
    for (int i = 0; i < ntensors; ++i) {
      auto s = writer->AddTensor(absl::StrFormat("layers.%d.w", i), ckpt::DType::kFloat32,
                                 {rows, cols}, ckpt::FullBox({rows, cols}), data[i].data());
      if (!s.ok()) { std::cerr << s << "\n"; return 2; }
    }
    ckpt::SaveOptions so;
    so.io_threads = threads;
    auto t = Clock::now();
    auto saved = writer->Save(root, 1, so);
    double save_s = Since(t);
    if (!saved.ok()) { std::cerr << saved.status() << "\n"; return 2; }
    v_save.push_back(total / save_s / 1e9);
    r_save.push_back(v_save.back() / ws);

    ckpt::ReaderOptions ro;
    ro.io_threads = threads;
    auto reader = ckpt::Reader::Open(root, ro).value();
    std::vector<ckpt::LoadRequest> same, resharded;
    for (int i = 0; i < ntensors; ++i) {
      std::string name = absl::StrFormat("layers.%d.w", i);
      same.push_back({name, ckpt::DType::kFloat32, {rows, cols}, ckpt::FullBox({rows, cols}), out[i].data()});
      // Column halves: every row of the stored chunk is split in two.
      resharded.push_back({name, ckpt::DType::kFloat32, {rows, cols},
                           ckpt::Box{{0, 0}, {rows, cols / 2}}, out[i].data()});
      resharded.push_back({name, ckpt::DType::kFloat32, {rows, cols},
                           ckpt::Box{{0, cols / 2}, {rows, cols / 2}}, out[i].data() + kTensorBytes / 2});
    }
    t = Clock::now();
    auto r1 = reader->Load(same);
    double l = Since(t);
    if (!r1.ok()) { std::cerr << r1.status() << "\n"; return 2; }
    if (out[0] != data[0]) { std::cerr << "load mismatch\n"; return 2; }
    t = Clock::now();
    auto r2 = reader->Load(resharded);
    double rl = Since(t);
    if (!r2.ok()) { std::cerr << r2.status() << "\n"; return 2; }
    v_load.push_back(total / l / 1e9);
    r_load.push_back(v_load.back() / rs);
    v_reshard.push_back(total / rl / 1e9);
    r_reshard.push_back(rl / l);
    std::filesystem::remove_all(root);
  }
  const double ws = Median(v_ws), rs = Median(v_rs), save = Median(v_save),
               load = Median(v_load), reshard = Median(v_reshard);
  const double rsave = Median(r_save), rload = Median(r_load), rresh = Median(r_reshard);
  std::printf("dir %s, %.2f GiB in %d tensors of 64 MiB, %d threads, median of %d runs\n",
              dir.c_str(), total / double(1ull << 30), ntensors, threads, repeats);
  std::printf("limit: sequential write+fsync %.2f GB/s, read %.2f GB/s\n", ws, rs);
  std::printf("ckpt save %.2f GB/s (%.0f%% of the limit), load %.2f GB/s (%.0f%%), "
              "resharded load %.2f GB/s (%.2fx the same-layout time)\n",
              save, 100 * rsave, load, 100 * rload, reshard, rresh);
  std::printf("{\"dir\": \"%s\", \"bytes\": %llu, \"threads\": %d, \"repeats\": %d, "
              "\"dd_write_GBps\": %.3f, \"dd_read_GBps\": %.3f, \"save_GBps\": %.3f, "
              "\"load_GBps\": %.3f, \"reshard_load_GBps\": %.3f, \"save_vs_dd\": %.3f, "
              "\"load_vs_dd\": %.3f, \"reshard_vs_load_time\": %.3f}\n",
              dir.c_str(), static_cast<unsigned long long>(total), threads, repeats, ws, rs, save,
              load, reshard, rsave, rload, rresh);
  return 0;
}

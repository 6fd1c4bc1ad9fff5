#include "convert/hdf5_chunks.h"

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "util/mutex.h"

namespace ckpt::tools::hdf5 {
namespace {

struct Task {
  size_t slab;
  Dims offset;
};

// Copies the part of chunk `offset` that lies in the dataset from the slab
// into `dst`, laid out as a whole chunk (row-major over the chunk shape);
// the rest of `dst` is zero.
void GatherChunk(const Slab& s, const Dims& offset, char* dst,
                 size_t chunk_bytes) {
  const Shape& shape = *s.shape;
  const Dims& chunk = *s.chunk;
  const size_t n = shape.size();
  const size_t es = s.elem_size;
  Dims valid(n);
  bool partial = false;
  for (size_t d = 0; d < n; ++d) {
    valid[d] = std::min(chunk[d], shape[d] - offset[d]);
    partial |= valid[d] != chunk[d];
  }
  if (partial) std::memset(dst, 0, chunk_bytes);
  // Strides (in elements) of the slab box and of the chunk.
  Dims box_stride(n, 1), chunk_stride(n, 1);
  for (size_t d = n - 1; d > 0; --d) {
    box_stride[d - 1] = box_stride[d] * s.box.size[d];
    chunk_stride[d - 1] = chunk_stride[d] * chunk[d];
  }
  const size_t run = valid[n - 1] * es;
  Dims i(n, 0);  // position inside the valid part; the last dim is one run
  while (true) {
    uint64_t src = 0, dstoff = 0;
    for (size_t d = 0; d < n; ++d) {
      src += (offset[d] - s.box.offset[d] + i[d]) * box_stride[d];
      dstoff += i[d] * chunk_stride[d];
    }
    std::memcpy(dst + dstoff * es, s.data + src * es, run);
    size_t d = n - 1;
    while (d > 0) {
      --d;
      if (++i[d] < valid[d]) break;
      i[d] = 0;
      if (d == 0) return;
    }
    if (n == 1) return;
  }
}

}  // namespace

void ShuffleBytes(const char* in, size_t n, int elem_size, char* out) {
  const size_t count = n / elem_size;
  for (int b = 0; b < elem_size; ++b) {
    char* dst = out + b * count;
    const char* src = in + b;
    for (size_t i = 0; i < count; ++i) dst[i] = src[i * elem_size];
  }
}

absl::StatusOr<std::vector<EncodedChunk>> EncodeChunks(
    absl::Span<const Slab> slabs, const ChunkFilters& filters, int threads) {
  std::vector<Task> tasks;
  for (size_t si = 0; si < slabs.size(); ++si) {
    const Slab& s = slabs[si];
    const size_t n = s.box.size.size();
    Dims off = s.box.offset;
    while (true) {
      tasks.push_back({si, off});
      size_t d = n;
      bool done = true;
      while (d > 0) {
        --d;
        off[d] += (*s.chunk)[d];
        if (off[d] < s.box.offset[d] + s.box.size[d]) {
          done = false;
          break;
        }
        off[d] = s.box.offset[d];
      }
      if (done) break;
    }
  }
  std::vector<EncodedChunk> out(tasks.size());
  std::atomic<size_t> next{0};
  Mutex mu;
  absl::Status status;  // guarded by mu
  auto work = [&] {
    std::string chunk, shuffled;
    for (size_t t = next++; t < tasks.size(); t = next++) {
      const Slab& s = slabs[tasks[t].slab];
      uint64_t bytes = s.elem_size;
      for (uint64_t c : *s.chunk) bytes *= c;
      chunk.resize(bytes);
      GatherChunk(s, tasks[t].offset, chunk.data(), bytes);
      const char* src = chunk.data();
      if (filters.shuffle && s.elem_size > 1) {
        shuffled.resize(bytes);
        ShuffleBytes(chunk.data(), bytes, s.elem_size, shuffled.data());
        src = shuffled.data();
      }
      EncodedChunk& e = out[t];
      e.slab = tasks[t].slab;
      e.offset = std::move(tasks[t].offset);
      uLongf len = compressBound(bytes);
      e.bytes.resize(len);
      int rc =
          compress2(reinterpret_cast<Bytef*>(e.bytes.data()), &len,
                    reinterpret_cast<const Bytef*>(src), bytes, filters.level);
      if (rc != Z_OK) {
        MutexLock l(&mu);
        status = absl::InternalError(
            absl::StrCat("zlib compress2 failed (", rc, ")"));
        next = tasks.size();
        return;
      }
      e.bytes.resize(len);
    }
  };
  const int n =
      std::max(1, std::min<int>(threads, static_cast<int>(tasks.size())));
  std::vector<std::thread> pool;
  for (int i = 1; i < n; ++i) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  {
    MutexLock l(&mu);
    if (!status.ok()) return status;
  }
  return out;
}

}  // namespace ckpt::tools::hdf5

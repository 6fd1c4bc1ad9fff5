#include "ckpt/interop/hdf5/hdf5_chunks.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "util/parallel_for.h"

namespace ckpt::interop::hdf5 {
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

namespace {

// Every chunk of every slab, by slab, then in row-major order of the chunk
// grid.
std::vector<Task> ChunkTasks(absl::Span<const Slab> slabs) {
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
  return tasks;
}

// One thread's buffers: the gathered chunk and its shuffled bytes.
struct Scratch {
  std::string chunk, shuffled;
};

// Gathers, shuffles and deflates the chunk of `task` into `out`.
absl::Status EncodeChunk(const Slab& s, const ChunkFilters& filters,
                         Scratch& sc, EncodedChunk& out) {
  uint64_t bytes = s.elem_size;
  for (uint64_t c : *s.chunk) bytes *= c;
  sc.chunk.resize(bytes);
  GatherChunk(s, out.offset, sc.chunk.data(), bytes);
  const char* src = sc.chunk.data();
  if (filters.shuffle && s.elem_size > 1) {
    sc.shuffled.resize(bytes);
    ShuffleBytes(sc.chunk.data(), bytes, s.elem_size, sc.shuffled.data());
    src = sc.shuffled.data();
  }
  uLongf len = compressBound(bytes);
  out.bytes.resize(len);
  int rc = compress2(reinterpret_cast<Bytef*>(out.bytes.data()), &len,
                     reinterpret_cast<const Bytef*>(src), bytes, filters.level);
  if (rc != Z_OK) {
    return absl::InternalError(
        absl::StrCat("zlib compress2 failed (", rc, ")"));
  }
  out.bytes.resize(len);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<EncodedChunk>> EncodeChunks(
    absl::Span<const Slab> slabs, const ChunkFilters& filters, int threads) {
  std::vector<Task> tasks = ChunkTasks(slabs);
  std::vector<EncodedChunk> out(tasks.size());
  for (size_t t = 0; t < tasks.size(); ++t) {
    out[t].slab = tasks[t].slab;
    out[t].offset = std::move(tasks[t].offset);
  }
  std::vector<Scratch> scratch(std::max(1, threads));
  CKPT_RETURN_IF_ERROR(::ckpt::internal::ParallelFor(
      threads, out.size(), [&](int thread, size_t t) {
        return EncodeChunk(slabs[out[t].slab], filters, scratch[thread],
                           out[t]);
      }));
  return out;
}

}  // namespace ckpt::interop::hdf5

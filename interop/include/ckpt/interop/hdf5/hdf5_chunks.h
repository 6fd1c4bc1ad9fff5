// HDF5 chunks encoded by the exporter itself, on several threads, for
// H5Dwrite_chunk: the HDF5 library applies its filters on one thread,
// which makes deflate the bottleneck of an export by an order of magnitude.
//
// An encoded chunk is exactly what HDF5's filter pipeline stores for a
// dataset created with H5Pset_shuffle (optional) and H5Pset_deflate: the
// whole chunk (edge chunks padded with zero bytes to the full chunk shape),
// byte-shuffled (H5Z_FILTER_SHUFFLE: all first bytes of the elements, then
// all second bytes, ...), then compressed as one zlib stream
// (H5Z_FILTER_DEFLATE uses zlib's compress2). Any HDF5 reader decodes it.
#ifndef CKPT_INTEROP_HDF5_HDF5_CHUNKS_H_
#define CKPT_INTEROP_HDF5_HDF5_CHUNKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ckpt/types.h"

namespace ckpt::interop::hdf5 {

struct ChunkFilters {
  bool shuffle = true;  // applied only to elements wider than one byte
  int level = 4;        // deflate level 0..9
};

// One slab of a dataset: `box` of a dataset of `shape` chunked as `chunk`,
// made of whole chunks (clipped at the dataset's edge), its elements in
// `data` in the box's row-major layout. Pointers are not owned.
struct Slab {
  const Shape* shape = nullptr;
  const Dims* chunk = nullptr;
  int elem_size = 1;
  Box box;
  const char* data = nullptr;
};

struct EncodedChunk {
  size_t slab = 0;  // index into the slabs given
  Dims offset;      // the chunk's first element (a multiple of the chunk shape)
  std::string bytes;
};

// Encodes every chunk of every slab with `filters` on `threads` threads.
// The result is ordered by slab, then by chunk in row-major order of the
// chunk grid. Internal error if zlib fails (out of memory).
// REQUIRES: each box consists of whole chunks of its dataset.
absl::StatusOr<std::vector<EncodedChunk>> EncodeChunks(
    absl::Span<const Slab> slabs, const ChunkFilters& filters, int threads);

// The byte shuffle of HDF5's shuffle filter, for one chunk of `n` bytes
// (whole elements of `elem_size` bytes). Exposed for tests.
void ShuffleBytes(const char* in, size_t n, int elem_size, char* out);

}  // namespace ckpt::interop::hdf5

#endif  // CKPT_INTEROP_HDF5_HDF5_CHUNKS_H_

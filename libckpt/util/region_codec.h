// The one encoding of a Region in the messages ranks exchange: the local
// plans of a save (whose bytes the structure fingerprint hashes, spec/
// FORMAT.md §7.4, so they never change) and the requests of a cooperative
// load. [u8 geometry: 1 box, 2 flat range], then for a box its offsets and
// then its sizes, as many of each as its entry has dimensions (which the
// message says elsewhere), for a flat range its start and length; every
// number a varint.
#ifndef CKPT_LIBCKPT_UTIL_REGION_CODEC_H_
#define CKPT_LIBCKPT_UTIL_REGION_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt/format/coding.h"
#include "ckpt/types.h"

namespace ckpt::internal {

inline constexpr uint8_t kRegionBox = 1;
inline constexpr uint8_t kRegionFlat = 2;

// Appends `region` (geometry and coordinates).
void PutRegion(std::string* out, const Region& region);

// The count of coordinates that follow geometry `geometry` in a region of
// an entry of `ndim` dimensions: 2 * ndim for a box, 2 for a flat range
// (0 for an unknown geometry, which the caller rejects).
inline size_t RegionCoordinates(uint8_t geometry, size_t ndim) {
  return geometry == kRegionBox ? 2 * ndim : geometry == kRegionFlat ? 2 : 0;
}

// Reads a region of an entry of `ndim` dimensions. DataLoss "unknown
// geometry G", or the reader's for truncated bytes.
absl::StatusOr<Region> ReadRegion(format::ByteReader* r, size_t ndim);

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_UTIL_REGION_CODEC_H_

#include "format/checksum.h"

#include <xxhash.h>

namespace ckpt::format {

uint64_t Checksum(const void* data, size_t n) { return XXH3_64bits(data, n); }

}  // namespace ckpt::format

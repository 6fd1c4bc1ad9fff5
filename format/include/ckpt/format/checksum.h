// Block and structure checksums: XXH3-64 with seed 0 (spec/FORMAT.md §3.3).
// XXH3 was chosen over CRC-32C because it runs at memory bandwidth on any
// x86-64/ARM CPU without special instructions, has 64 bits (a random
// corruption goes undetected with probability 2^-64 rather than 2^-32), and
// is available as a Debian package (libxxhash).
#ifndef CKPT_FORMAT_CHECKSUM_H_
#define CKPT_FORMAT_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace ckpt::format {

uint64_t Checksum(const void* data, size_t n);
inline uint64_t Checksum(absl::string_view s) {
  return Checksum(s.data(), s.size());
}

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_CHECKSUM_H_

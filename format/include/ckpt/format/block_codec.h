// Per-block payload codec (spec/FORMAT.md §5.3). A chunk's payload is cut
// into blocks of `block_size` raw bytes (the last may be shorter). With codec
// zstd each block is stored as one zstd frame, unless the frame would not be
// smaller than the raw block, in which case the raw bytes are stored; the
// reader tells the two apart by size (stored == raw size means raw). The
// checksum covers the stored bytes, so a block is verified before it is
// decompressed.
#ifndef CKPT_FORMAT_BLOCK_CODEC_H_
#define CKPT_FORMAT_BLOCK_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ckpt/format/format_constants.h"

namespace ckpt::format {

// Number of blocks of a payload of `raw_bytes`. REQUIRES: block_size > 0.
inline uint64_t NumBlocks(uint64_t raw_bytes, uint64_t block_size) {
  return raw_bytes / block_size + (raw_bytes % block_size != 0);
}

// Compresses blocks. Not thread-safe: use one per thread.
class BlockEncoder {
 public:
  // level: zstd level (1..19; 0 means zstd's default).
  explicit BlockEncoder(int level);
  ~BlockEncoder();
  BlockEncoder(const BlockEncoder&) = delete;
  BlockEncoder& operator=(const BlockEncoder&) = delete;

  // Sets *out to the stored form of `raw` under codec zstd (a frame, or the
  // raw bytes if the frame is not smaller). Internal error only if zstd
  // fails, which it does not for valid input.
  [[nodiscard]] absl::Status EncodeZstd(absl::string_view raw,
                                        std::string* out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Verifies and decodes blocks. Not thread-safe: use one per thread.
class BlockDecoder {
 public:
  BlockDecoder();
  ~BlockDecoder();
  BlockDecoder(const BlockDecoder&) = delete;
  BlockDecoder& operator=(const BlockDecoder&) = delete;

  // Checks `stored` against `checksum`, then writes exactly `raw_size` bytes
  // to `out`. DataLoss "checksum 0x.. != 0x.." or "zstd: ..." on mismatch,
  // corrupt frames, a frame whose content is not exactly raw_size bytes, or
  // a compressed block that is not exactly one frame ("zstd block has N
  // trailing bytes after its frame").
  [[nodiscard]] absl::Status Decode(Codec codec, absl::string_view stored,
                                    uint64_t checksum, uint64_t raw_size,
                                    char* out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "checksum 0x1234 != 0x5678 (expected != actual)"-style message helper.
absl::Status ChecksumMismatch(uint64_t expected, uint64_t actual);

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_BLOCK_CODEC_H_

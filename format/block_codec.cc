#include "ckpt/format/block_codec.h"

#include <zstd.h>

#include <cstring>
#include <memory>

#include "absl/strings/str_format.h"
#include "ckpt/format/checksum.h"

namespace ckpt::format {

struct BlockEncoder::Impl {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  int level;
  ~Impl() { ZSTD_freeCCtx(cctx); }
};

BlockEncoder::BlockEncoder(int level) : impl_(new Impl) {
  impl_->level = level;
}
BlockEncoder::~BlockEncoder() = default;

absl::Status BlockEncoder::EncodeZstd(absl::string_view raw, std::string* out) {
  // The frame goes to a buffer that is not zero-filled, so that only the
  // bytes zstd writes take memory: the bound is the raw size and more (a
  // block of zeros of 1 GiB makes a frame of 33 KiB).
  const size_t bound = ZSTD_compressBound(raw.size());
  std::unique_ptr<char[]> frame(new char[bound]);
  size_t n = ZSTD_compressCCtx(impl_->cctx, frame.get(), bound, raw.data(),
                               raw.size(), impl_->level);
  if (ZSTD_isError(n)) {
    return absl::InternalError(
        absl::StrFormat("zstd compression failed: %s", ZSTD_getErrorName(n)));
  }
  if (n >= raw.size()) {
    out->assign(raw.data(), raw.size());
  } else {
    out->assign(frame.get(), n);
  }
  return absl::OkStatus();
}

struct BlockDecoder::Impl {
  ZSTD_DCtx* dctx = ZSTD_createDCtx();
  ~Impl() { ZSTD_freeDCtx(dctx); }
};

BlockDecoder::BlockDecoder() : impl_(new Impl) {}
BlockDecoder::~BlockDecoder() = default;

absl::Status ChecksumMismatch(uint64_t expected, uint64_t actual) {
  return absl::DataLossError(absl::StrFormat(
      "checksum 0x%016x != 0x%016x (stored != computed)", expected, actual));
}

absl::Status BlockDecoder::Decode(Codec codec, absl::string_view stored,
                                  uint64_t checksum, uint64_t raw_size,
                                  char* out) {
  uint64_t actual = Checksum(stored);
  if (actual != checksum) return ChecksumMismatch(checksum, actual);
  if (stored.size() == raw_size) {
    // Raw block (codec none, or zstd that did not shrink it).
    std::memcpy(out, stored.data(), raw_size);
    return absl::OkStatus();
  }
  if (codec != Codec::kZstd) {
    return absl::DataLossError(
        absl::StrFormat("stored block is %d bytes, expected %d for codec none",
                        stored.size(), raw_size));
  }
  if (stored.size() > raw_size) {
    return absl::DataLossError(absl::StrFormat(
        "zstd block of %d bytes is not smaller than its %d raw bytes",
        stored.size(), raw_size));
  }
  unsigned long long content =
      ZSTD_getFrameContentSize(stored.data(), stored.size());
  if (content != raw_size) {
    return absl::DataLossError(absl::StrFormat(
        "zstd frame declares %d bytes, expected %d", content, raw_size));
  }
  // Exactly one frame (§5.3): no second frame, skippable frame or garbage
  // after it, which the decompressor would otherwise read or ignore.
  size_t frame = ZSTD_findFrameCompressedSize(stored.data(), stored.size());
  if (ZSTD_isError(frame)) {
    return absl::DataLossError(
        absl::StrFormat("zstd: %s", ZSTD_getErrorName(frame)));
  }
  if (frame != stored.size()) {
    return absl::DataLossError(
        absl::StrFormat("zstd block has %d trailing bytes after its frame",
                        stored.size() - frame));
  }
  size_t n = ZSTD_decompressDCtx(impl_->dctx, out, raw_size, stored.data(),
                                 stored.size());
  if (ZSTD_isError(n)) {
    return absl::DataLossError(
        absl::StrFormat("zstd: %s", ZSTD_getErrorName(n)));
  }
  if (n != raw_size) {
    return absl::DataLossError(absl::StrFormat(
        "zstd frame decoded to %d bytes, expected %d", n, raw_size));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::format

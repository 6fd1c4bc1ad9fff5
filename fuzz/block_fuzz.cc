// Fuzzes BlockDecoder::Decode (format/block_codec.h).
//
// Input layout:
//   byte 0      bits 0-6: codec value v; v < 64 gives codec v & 1 (0 none,
//               1 zstd), v >= 64 is passed through as is (a value outside
//               the enum's names); bit 7: pass a wrong checksum
//   bytes 1-4   raw size, u32le, reduced modulo 1 MiB + 1 (no huge
//               allocations)
//   bytes 5..   the stored block
// The checksum given to Decode is that of the stored bytes (or, with bit 7,
// that plus one), so the fuzzer gets past the check that guards the zstd
// decoder. The output buffer is exactly raw_size bytes on the heap, so ASan
// sees any write past it. A successful decode must have written raw_size
// bytes equal to the stored bytes when stored size == raw size.
//
// The same bytes then go the other way as a raw block: BlockEncoder (zstd
// level 1) and back through Decode must reproduce them.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "ckpt/format/block_codec.h"
#include "ckpt/format/checksum.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/format_constants.h"
#include "fuzz_util.h"

namespace {

using namespace ckpt::format;

constexpr uint64_t kMaxRawSize = 1u << 20;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static BlockDecoder* decoder = new BlockDecoder;  // reused, as readers do
  static BlockEncoder* encoder = new BlockEncoder(1);
  absl::string_view in = ckpt::fuzz::AsView(data, size);
  if (size < 5) return 0;

  const uint8_t mode = data[0];
  const uint8_t v = mode & 0x7f;
  const Codec codec = static_cast<Codec>(v < 64 ? (v & 1) : v);
  const uint64_t raw_size = LoadFixed32(in.data() + 1) % (kMaxRawSize + 1);
  absl::string_view stored = in.substr(5);
  uint64_t checksum = Checksum(stored);
  if (mode & 0x80) checksum += 1;

  std::unique_ptr<char[]> out(new char[raw_size]);
  absl::Status s =
      decoder->Decode(codec, stored, checksum, raw_size, out.get());
  if (s.ok()) {
    FUZZ_CHECK((mode & 0x80) == 0);
    if (stored.size() == raw_size) {
      FUZZ_CHECK(std::memcmp(out.get(), stored.data(), raw_size) == 0);
    } else {
      FUZZ_CHECK(codec == Codec::kZstd);
      FUZZ_CHECK(stored.size() < raw_size);
    }
  }

  // Encoder round trip of the stored bytes taken as raw data.
  std::string enc;
  FUZZ_CHECK(encoder->EncodeZstd(stored, &enc).ok());
  FUZZ_CHECK(enc.size() <= stored.size());
  std::unique_ptr<char[]> back(new char[stored.size()]);
  absl::Status s2 = decoder->Decode(Codec::kZstd, enc, Checksum(enc),
                                    stored.size(), back.get());
  if (!s2.ok()) {
    std::fprintf(stderr, "encoded block rejected: %s\n",
                 std::string(s2.message()).c_str());
  }
  FUZZ_CHECK(s2.ok());
  FUZZ_CHECK(std::memcmp(back.get(), stored.data(), stored.size()) == 0);
  return 0;
}

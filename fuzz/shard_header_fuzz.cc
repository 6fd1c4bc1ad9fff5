// Fuzzes DecodeShardHeader (format/shard.h).
//
// Each input is decoded as given and, when it has 64 bytes, with the header
// checksum at offset 56 recomputed, so mutations reach the field checks
// behind it. A decoded header must re-encode to exactly the 64 bytes it came
// from (every byte of the v1 header is a field, a reserved zero or the
// checksum) and decode back to the same value.
#include <cstddef>
#include <cstdint>
#include <string>

#include "ckpt/format/checksum.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/shard.h"
#include "fuzz_util.h"

namespace {

using namespace ckpt::format;

void Check(absl::string_view bytes) {
  absl::StatusOr<ShardHeader> h = DecodeShardHeader(bytes);
  if (!h.ok()) return;
  FUZZ_CHECK(bytes.size() >= static_cast<size_t>(kShardHeaderSize));
  std::string re = EncodeShardHeader(*h);
  FUZZ_CHECK(re.size() == static_cast<size_t>(kShardHeaderSize));
  FUZZ_CHECK(re == bytes.substr(0, kShardHeaderSize));
  absl::StatusOr<ShardHeader> h2 = DecodeShardHeader(re);
  FUZZ_CHECK(h2.ok());
  FUZZ_CHECK(*h2 == *h);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view in = ckpt::fuzz::AsView(data, size);
  Check(in);
  if (size >= static_cast<size_t>(kShardHeaderSize)) {
    std::string fixed(in);
    StoreFixed64(fixed.data() + 56, Checksum(fixed.data(), 56));
    if (fixed != in) Check(fixed);
  }
  return 0;
}

// Fuzzes DecodeManifest and ValidateCoverage (format/manifest.h).
//
// Each input is decoded twice: as given (exercises the checks up to and
// including the checksum), and with the checksum at M-16 recomputed, so
// mutations reach the section and entry decoders behind it. Whenever a
// decode succeeds, ValidateCoverage runs on the result and the manifest must
// survive EncodeManifest -> DecodeManifest unchanged, and encode to the same
// bytes again.
#include <cstddef>
#include <cstdint>
#include <string>

#include "ckpt/format/checksum.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/manifest.h"
#include "fuzz_util.h"

namespace {

using namespace ckpt::format;

void Check(absl::string_view bytes) {
  absl::StatusOr<Manifest> m = DecodeManifest(bytes);
  if (!m.ok()) return;
  (void)ValidateCoverage(*m);

  std::string re = EncodeManifest(*m);
  absl::StatusOr<Manifest> m2 = DecodeManifest(re);
  if (!m2.ok()) {
    std::fprintf(stderr, "re-encoded manifest rejected: %s\n",
                 std::string(m2.status().message()).c_str());
  }
  FUZZ_CHECK(m2.ok());
  FUZZ_CHECK(*m2 == *m);
  FUZZ_CHECK(EncodeManifest(*m2) == re);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view in = ckpt::fuzz::AsView(data, size);
  Check(in);
  constexpr size_t kMin = kManifestHeaderSize + kManifestTailSize;
  if (size >= kMin) {
    std::string fixed(in);
    const size_t tail = size - kManifestTailSize;
    StoreFixed64(fixed.data() + tail, Checksum(fixed.data(), tail));
    if (fixed != in) Check(fixed);
  }
  return 0;
}

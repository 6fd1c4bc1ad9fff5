// Fuzzes DecodeLatest (format/latest.h), plus ParseStepDirName on what it
// returns.
//
// Each input is tried as given and, when it has the shape
// "...<space><16 bytes>\n", with those 16 bytes replaced by the checksum of
// the bytes before the space, so mutations reach the directory-name checks.
// The format has one encoding per directory name, so a decoded pointer must
// re-encode to exactly the input bytes, and decode again to the same name.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"
#include "ckpt/format/checksum.h"
#include "ckpt/format/latest.h"
#include "fuzz_util.h"

namespace {

using namespace ckpt::format;

void Check(absl::string_view bytes) {
  absl::StatusOr<std::string> dir = DecodeLatest(bytes);
  if (!dir.ok()) return;
  std::string re = EncodeLatest(*dir);
  FUZZ_CHECK(re == bytes);
  absl::StatusOr<std::string> dir2 = DecodeLatest(re);
  FUZZ_CHECK(dir2.ok());
  FUZZ_CHECK(*dir2 == *dir);

  uint64_t step = 0;
  if (ParseStepDirName(*dir, &step)) FUZZ_CHECK(StepDirName(step) == *dir);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view in = ckpt::fuzz::AsView(data, size);
  Check(in);
  // "<head> <16 hex>\n": 18 bytes after the head.
  if (size >= 18 && in.back() == '\n' && in[size - 18] == ' ') {
    absl::string_view head = in.substr(0, size - 18);
    std::string fixed = absl::StrFormat("%s %016x\n", head, Checksum(head));
    if (fixed != in) Check(fixed);
  }
  // Also the step-directory parser on the raw input.
  uint64_t step = 0;
  if (ParseStepDirName(in, &step)) FUZZ_CHECK(StepDirName(step) == in);
  return 0;
}

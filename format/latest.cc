#include "ckpt/format/latest.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/format/checksum.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/names.h"

namespace ckpt::format {

namespace {

// Exactly 16 digits from [0-9a-f] (§4.2). Written by hand: the absl parsers
// also take "0x", a sign, surrounding whitespace and upper case.
bool ParseChecksumHex(absl::string_view hex, uint64_t* out) {
  if (hex.size() != 16) return false;
  uint64_t v = 0;
  for (char c : hex) {
    uint64_t d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | d;
  }
  *out = v;
  return true;
}

}  // namespace

std::string EncodeLatest(absl::string_view dir_name) {
  std::string head = absl::StrCat(kLatestPrefix, dir_name);
  return absl::StrFormat("%s %016x\n", head, Checksum(head));
}

absl::StatusOr<std::string> DecodeLatest(absl::string_view bytes) {
  const absl::string_view prefix = kLatestPrefix;
  if (bytes.size() > 512) {
    return absl::DataLossError(absl::StrCat(
        "latest: ", bytes.size(), " bytes; a pointer is one short line"));
  }
  if (bytes.substr(0, prefix.size()) != prefix) {
    return absl::DataLossError("latest: does not start with 'ckpt-latest v1 '");
  }
  if (bytes.empty() || bytes.back() != '\n') {
    return absl::DataLossError("latest: truncated (no final newline)");
  }
  absl::string_view line = bytes.substr(0, bytes.size() - 1);
  size_t sp = line.rfind(' ');
  if (sp == absl::string_view::npos || sp < prefix.size()) {
    return absl::DataLossError("latest: missing checksum");
  }
  absl::string_view head = line.substr(0, sp);
  absl::string_view hex = line.substr(sp + 1);
  uint64_t stored = 0;
  if (!ParseChecksumHex(hex, &stored)) {
    return absl::DataLossError(
        absl::StrCat("latest: bad checksum field '", EscapeText(hex),
                     "': expected 16 lowercase hex digits"));
  }
  uint64_t actual = Checksum(head);
  if (stored != actual) {
    return absl::DataLossError(absl::StrFormat(
        "latest: checksum 0x%016x != 0x%016x (stored != computed)", stored,
        actual));
  }
  std::string dir(head.substr(prefix.size()));
  absl::Status s = ValidateFileName(dir);
  if (!s.ok())
    return absl::DataLossError(absl::StrCat("latest: ", s.message()));
  return dir;
}

std::string StepDirName(uint64_t step) {
  return absl::StrFormat("%s%08d", kStepDirPrefix, step);
}

bool ParseStepDirName(absl::string_view name, uint64_t* step) {
  const absl::string_view prefix = kStepDirPrefix;
  if (name.substr(0, prefix.size()) != prefix) return false;
  absl::string_view digits = name.substr(prefix.size());
  if (digits.size() < 8 || digits.size() > 20) return false;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(digits, step) && StepDirName(*step) == name;
}

}  // namespace ckpt::format

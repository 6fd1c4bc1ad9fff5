#include "ckpt/format/names.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/format_constants.h"

namespace ckpt::format {
namespace {

absl::Status Bad(absl::string_view what, absl::string_view name,
                 absl::string_view why) {
  std::string shown(name.substr(0, 80));
  return absl::InvalidArgumentError(
      absl::StrCat("invalid ", what, " '", absl::CHexEscape(shown),
                   name.size() > 80 ? "..." : "", "': ", why));
}

}  // namespace

bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    int n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (int k = 1; k <= n; ++k) {
      unsigned char cc = s[i + k];
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong encodings, surrogates and values past U+10FFFF.
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) ||
        (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

absl::Status ValidateEntryName(absl::string_view name) {
  if (name.empty()) return Bad("name", name, "empty");
  if (name.size() > kMaxNameLength) {
    return Bad(
        "name", name,
        absl::StrCat(name.size(), " bytes, the limit is ", kMaxNameLength));
  }
  for (char ch : name) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7F) return Bad("name", name, "control character");
    if (c == '/' || c == '\\') return Bad("name", name, "path separator");
  }
  if (name.find("..") != absl::string_view::npos) {
    return Bad("name", name, "contains '..'");
  }
  if (!IsValidUtf8(name)) return Bad("name", name, "not valid UTF-8");
  return absl::OkStatus();
}

absl::Status ValidateFileName(absl::string_view name) {
  if (name.empty()) return Bad("file name", name, "empty");
  if (name.size() > kMaxFileNameLength)
    return Bad("file name", name, "too long");
  if (name[0] == '.') return Bad("file name", name, "starts with '.'");
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return Bad("file name", name, "character outside [A-Za-z0-9._-]");
  }
  return absl::OkStatus();
}

}  // namespace ckpt::format

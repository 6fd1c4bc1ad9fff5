#include "json_string.h"

#include <array>
#include <cstdint>

#include "absl/strings/str_format.h"

namespace ckpt::ops::internal {
namespace {

constexpr uint8_t kAccept = 0;
constexpr uint8_t kReject = 1;

// Bjoern Hoehrmann's UTF-8 decoder (the one nlohmann::json uses): the
// character class of each byte, then the transitions of each state.
constexpr std::array<uint8_t, 400> kUtf8d = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,   // 00..0f
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,   // 10..1f
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,   // 20..2f
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,   // 30..3f
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,   // 40..4f
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,   // 50..5f
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,   // 60..6f
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,   // 70..7f
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,   // 80..8f
    9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9,   // 90..9f
    7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,   // a0..af
    7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,   // b0..bf
    8, 8, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,   // c0..cf
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,   // d0..df
    10, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 3, 3,  // e0..ef
    11, 6, 6, 6, 5, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8,  // f0..ff
    // Transitions: 16 per state (0 accept, 1 reject).
    0, 1, 2, 3, 5, 8, 7, 1, 1, 1, 4, 6, 1, 1, 1, 1,  //
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,  //
    1, 0, 1, 1, 1, 1, 1, 0, 1, 0, 1, 1, 1, 1, 1, 1,  //
    1, 2, 1, 1, 1, 1, 1, 2, 1, 2, 1, 1, 1, 1, 1, 1,  //
    1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1,  //
    1, 2, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1,  //
    1, 1, 1, 1, 1, 1, 1, 3, 1, 3, 1, 1, 1, 1, 1, 1,  //
    1, 3, 1, 1, 1, 1, 1, 3, 1, 3, 1, 1, 1, 1, 1, 1,  //
    1, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,  //
};

uint8_t Decode(uint8_t& state, uint32_t& cp, uint8_t byte) {
  const uint8_t type = kUtf8d[byte];
  cp = state != kAccept ? (byte & 0x3fu) | (cp << 6u) : (0xffu >> type) & byte;
  state = kUtf8d[256u + state * 16u + type];
  return state;
}

void AppendCodePoint(uint32_t cp, std::string& out) {
  switch (cp) {
    case 0x08:
      out += "\\b";
      return;
    case 0x09:
      out += "\\t";
      return;
    case 0x0a:
      out += "\\n";
      return;
    case 0x0c:
      out += "\\f";
      return;
    case 0x0d:
      out += "\\r";
      return;
    case 0x22:
      out += "\\\"";
      return;
    case 0x5c:
      out += "\\\\";
      return;
    default:
      break;
  }
  if (cp > 0x1f && cp < 0x7f) {
    out += static_cast<char>(cp);
  } else if (cp <= 0xffff) {
    absl::StrAppendFormat(&out, "\\u%04x", cp);
  } else {
    absl::StrAppendFormat(&out, "\\u%04x\\u%04x", 0xd7c0u + (cp >> 10u),
                          0xdc00u + (cp & 0x3ffu));
  }
}

}  // namespace

std::string JsonStringLiteral(absl::string_view s) {
  std::string out = "\"";
  uint8_t state = kAccept;
  uint32_t cp = 0;
  size_t pending = 0;  // bytes of an unfinished sequence
  for (size_t i = 0; i < s.size(); ++i) {
    switch (Decode(state, cp, static_cast<uint8_t>(s[i]))) {
      case kAccept:
        AppendCodePoint(cp, out);
        pending = 0;
        break;
      case kReject:
        // The byte may start a sequence of its own: read it again, unless
        // it was the first of the rejected one.
        if (pending > 0) --i;
        out += "\\ufffd";
        pending = 0;
        state = kAccept;
        break;
      default:
        ++pending;
        break;
    }
  }
  if (state != kAccept) out += "\\ufffd";  // an unfinished sequence at the end
  out += '"';
  return out;
}

}  // namespace ckpt::ops::internal

// JsonStringLiteral against nlohmann::json's own dump (what the tools'
// JsonText writes): the same bytes for ASCII, escapes, every code point
// class, invalid and truncated UTF-8, and random byte strings.
#include "json_string.h"

#include <random>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ckpt::ops::internal {
namespace {

std::string Nlohmann(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', /*ensure_ascii=*/true,
                                nlohmann::json::error_handler_t::replace);
}

TEST(JsonStringLiteral, Examples) {
  EXPECT_EQ(JsonStringLiteral("emb"), "\"emb\"");
  EXPECT_EQ(JsonStringLiteral("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(JsonStringLiteral("\t\n\x01\x7f"), "\"\\t\\n\\u0001\\u007f\"");
  EXPECT_EQ(JsonStringLiteral("\xc3\xa9t\xc3\xa9"), "\"\\u00e9t\\u00e9\"");
  EXPECT_EQ(JsonStringLiteral("\xf0\x9f\x98\x80"), "\"\\ud83d\\ude00\"");
  EXPECT_EQ(JsonStringLiteral("a\xff"
                              "b"),
            "\"a\\ufffdb\"");
  EXPECT_EQ(JsonStringLiteral("\xc3"), "\"\\ufffd\"");
}

TEST(JsonStringLiteral, SameAsNlohmannOnEdgeCases) {
  const std::string cases[] = {
      "",
      std::string("\0", 1),
      "\x08\x0c\x0d\x1f /",
      "\xc3\x28",          // bad continuation: both bytes read
      "\xe2\x82",          // truncated at the end
      "\xe2\x82\x28",      // truncated, then ASCII
      "\xed\xa0\x80",      // a surrogate
      "\xf4\x90\x80\x80",  // above U+10FFFF
      "\xc0\xaf",          // overlong
      "\x80\x80",          // lone continuations
      "\xf0\x9f\x98",      // truncated 4-byte sequence
      "x\xf0\x9f\x98\x80y\xe2\x82\xac",
  };
  for (const std::string& s : cases)
    EXPECT_EQ(JsonStringLiteral(s), Nlohmann(s));
}

TEST(JsonStringLiteral, SameAsNlohmannOnRandomBytes) {
  std::mt19937 rng(27);
  std::uniform_int_distribution<int> len(0, 24), byte(0, 255), pick(0, 3);
  const char kBiased[] = {'\xc3', '\xe2', '\xf0', '\x80', '\xbf', '"', '\\'};
  for (int i = 0; i < 20000; ++i) {
    std::string s(len(rng), '\0');
    for (char& c : s) {
      c = pick(rng) == 0 ? kBiased[byte(rng) % sizeof(kBiased)]
                         : static_cast<char>(byte(rng));
    }
    ASSERT_EQ(JsonStringLiteral(s), Nlohmann(s)) << i;
  }
}

}  // namespace
}  // namespace ckpt::ops::internal

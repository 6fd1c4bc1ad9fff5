#include "ckpt/format/names.h"

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::format {
namespace {

using ::ckpt::testing::StatusIs;
constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

TEST(NamesTest, AcceptsTypicalNames) {
  CKPT_EXPECT_OK(ValidateEntryName("layers.3.mlp.w1"));
  CKPT_EXPECT_OK(ValidateEntryName("optimizer.state.0.exp_avg"));
  CKPT_EXPECT_OK(ValidateEntryName("rng:rank-3"));
  CKPT_EXPECT_OK(ValidateEntryName("\xc3\xa9t\xc3\xa9"));  // UTF-8
}

TEST(NamesTest, EmptyName) {
  EXPECT_THAT(ValidateEntryName(""), StatusIs(kInvalid, "empty"));
}
TEST(NamesTest, PathSeparator) {
  EXPECT_THAT(ValidateEntryName("a/b"), StatusIs(kInvalid, "path separator"));
  EXPECT_THAT(ValidateEntryName("a\\b"), StatusIs(kInvalid, "path separator"));
}
TEST(NamesTest, DotDot) {
  EXPECT_THAT(ValidateEntryName(".."), StatusIs(kInvalid, "'..'"));
}
TEST(NamesTest, NulAndControlCharacters) {
  EXPECT_THAT(ValidateEntryName(std::string("a\0b", 3)),
              StatusIs(kInvalid, "control character"));
  EXPECT_THAT(ValidateEntryName("a\nb"),
              StatusIs(kInvalid, "control character"));
  EXPECT_THAT(ValidateEntryName("a\x7f"),
              StatusIs(kInvalid, "control character"));
}
TEST(NamesTest, InvalidUtf8) {
  EXPECT_THAT(ValidateEntryName("\xff"), StatusIs(kInvalid, "UTF-8"));
  EXPECT_THAT(ValidateEntryName("\xc0\xaf"),
              StatusIs(kInvalid, "UTF-8"));  // overlong '/'
  EXPECT_THAT(ValidateEntryName("\xe2\x82"),
              StatusIs(kInvalid, "UTF-8"));  // truncated
}
TEST(NamesTest, TooLong) {
  EXPECT_THAT(ValidateEntryName(std::string(1025, 'a')),
              StatusIs(kInvalid, "1025 bytes"));
}
TEST(NamesTest, FileNames) {
  CKPT_EXPECT_OK(ValidateFileName("shard-00001.ckpt"));
  EXPECT_THAT(ValidateFileName("../etc"),
              StatusIs(kInvalid, "starts with '.'"));
  EXPECT_THAT(ValidateFileName("a/b"),
              StatusIs(kInvalid, "outside [A-Za-z0-9._-]"));
  EXPECT_THAT(ValidateFileName(""), StatusIs(kInvalid, "empty"));
}

// EscapeText (SECURITY.md "Names"): what is shown for each kind of byte.
TEST(EscapeTextTest, KeepsPrintableTextAndOtherCharacters) {
  EXPECT_EQ(EscapeText("layers.3.mlp.w1"), "layers.3.mlp.w1");
  EXPECT_EQ(EscapeText("a\\b 'c'"), "a\\b 'c'");  // backslash not escaped
  EXPECT_EQ(EscapeText("\xc3\xa9t\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80"),
            "\xc3\xa9t\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80");
  EXPECT_EQ(EscapeText("\xc2\xa0"), "\xc2\xa0");  // U+00A0 follows C1
  EXPECT_EQ(EscapeText(""), "");
}
TEST(EscapeTextTest, C0ControlsAndDel) {
  EXPECT_EQ(EscapeText(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(EscapeText("\x1b[2J\x1b]0;title\x07"),
            "\\x1b[2J\\x1b]0;title\\x07");
  EXPECT_EQ(EscapeText("a\rb\x7f"), "a\\x0db\\x7f");
}
TEST(EscapeTextTest, TabAndNewlineEscapedInAField) {
  EXPECT_EQ(EscapeText("a\tb\nc"), "a\\x09b\\x0ac");
}
TEST(EscapeTextTest, TabAndNewlineKeptInAWholeMessage) {
  EXPECT_EQ(EscapeText("a\tb\nc\x1b\r", LineBreaks::kKeep),
            "a\tb\nc\\x1b\\x0d");
}
TEST(EscapeTextTest, C1Controls) {
  EXPECT_EQ(EscapeText("\xc2\x9b"
                       "31m"),
            "\\u009b31m");  // CSI
  EXPECT_EQ(EscapeText("\xc2\x80\xc2\x85\xc2\x9f"), "\\u0080\\u0085\\u009f");
}
TEST(EscapeTextTest, InvalidUtf8ByteByByte) {
  EXPECT_EQ(EscapeText("\xff"), "\\xff");
  EXPECT_EQ(EscapeText("a\x80"
                       "b"),
            "a\\x80b");                             // stray continuation
  EXPECT_EQ(EscapeText("\xe2\x82"), "\\xe2\\x82");  // truncated
  EXPECT_EQ(EscapeText("\xc0\xaf"), "\\xc0\\xaf");  // overlong '/'
  EXPECT_EQ(EscapeText("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // surrogate
  EXPECT_EQ(EscapeText("\xc2"), "\\xc2");                    // C1 lead alone
  EXPECT_EQ(EscapeText("\xc2\x1b"), "\\xc2\\x1b");
}

bool IsPrintable(const std::string& s) {
  if (!IsValidUtf8(s)) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = s[i];
    if (c < 0x20 || c == 0x7F) return false;
    if (c == 0xC2 && i + 1 < s.size() &&
        static_cast<unsigned char>(s[i + 1]) <= 0x9F)
      return false;
  }
  return true;
}

// Every string of up to two bytes and the three-byte strings of the bytes
// that matter: the result is printable and escaping it again changes
// nothing.
TEST(EscapeTextTest, ResultIsPrintableAndIdempotent) {
  std::vector<std::string> inputs;
  for (int a = 0; a < 256; ++a) {
    inputs.push_back(std::string(1, static_cast<char>(a)));
    for (int b = 0; b < 256; ++b)
      inputs.push_back({static_cast<char>(a), static_cast<char>(b)});
  }
  const unsigned char kEdges[] = {0x00, 0x0a, 0x1b, 0x41, 0x7f, 0x80, 0x9b,
                                  0xa0, 0xbf, 0xc2, 0xe2, 0xed, 0xf0, 0xff};
  for (unsigned char a : kEdges)
    for (unsigned char b : kEdges)
      for (unsigned char c : kEdges)
        inputs.push_back(
            {static_cast<char>(a), static_cast<char>(b), static_cast<char>(c)});
  for (const std::string& in : inputs) {
    const std::string out = EscapeText(in);
    ASSERT_TRUE(IsPrintable(out)) << absl::CHexEscape(in);
    ASSERT_EQ(EscapeText(out), out) << absl::CHexEscape(in);
    ASSERT_EQ(EscapeText(out, LineBreaks::kKeep), out) << absl::CHexEscape(in);
  }
}

}  // namespace
}  // namespace ckpt::format

#include "ckpt/format/names.h"

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

}  // namespace
}  // namespace ckpt::format

#include "ckpt/format/latest.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::format {
namespace {

using ::ckpt::testing::StatusIs;
constexpr auto kDataLoss = absl::StatusCode::kDataLoss;

TEST(LatestTest, RoundTrip) {
  std::string s = EncodeLatest("step-00000100");
  EXPECT_EQ(s.substr(0, 29), "ckpt-latest v1 step-00000100 ");
  auto d = DecodeLatest(s);
  CKPT_ASSERT_OK(d);
  EXPECT_EQ(*d, "step-00000100");
}

TEST(LatestTest, Truncated) {
  std::string s = EncodeLatest("step-00000100");
  for (size_t n = 0; n < s.size(); ++n) {
    EXPECT_THAT(DecodeLatest(s.substr(0, n)), StatusIs(kDataLoss, "latest"));
  }
}

TEST(LatestTest, BitFlipIsDetected) {
  std::string s = EncodeLatest("step-00000100");
  s[20] ^= 1;  // '0' -> '1' in the directory name
  EXPECT_THAT(DecodeLatest(s), StatusIs(kDataLoss, "latest: checksum"));
}

TEST(LatestTest, PathTraversalIsRejected) {
  // Checksum is valid but the name would escape the root.
  EXPECT_THAT(DecodeLatest(EncodeLatest("../x")),
              StatusIs(kDataLoss, "invalid file name"));
}

// `latest` with its checksum field replaced by `field`.
std::string WithChecksumField(absl::string_view field) {
  std::string s = EncodeLatest("step-00000100");
  return absl::StrCat(s.substr(0, s.size() - 17), field, "\n");
}

// The valid checksum field of EncodeLatest("step-00000100").
std::string ValidField() {
  std::string s = EncodeLatest("step-00000100");
  return s.substr(s.size() - 17, 16);
}

TEST(LatestTest, ValidFieldIsAccepted) {
  EXPECT_EQ(ValidField(), "10978e48109e2be1");  // spec/FORMAT.md §12.3
  CKPT_EXPECT_OK(DecodeLatest(WithChecksumField(ValidField())));
}

TEST(LatestTest, UppercaseChecksumIsRejected) {
  std::string upper = ValidField();
  for (char& c : upper)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_THAT(
      DecodeLatest(WithChecksumField(upper)),
      StatusIs(kDataLoss, "latest: bad checksum field '10978E48109E2BE1'"));
}

TEST(LatestTest, ChecksumWith0xPrefixIsRejected) {
  EXPECT_THAT(DecodeLatest(WithChecksumField("0x" + ValidField().substr(2))),
              StatusIs(kDataLoss, "latest: bad checksum field '0x"));
}

TEST(LatestTest, ChecksumWithSignIsRejected) {
  EXPECT_THAT(DecodeLatest(WithChecksumField("+" + ValidField().substr(1))),
              StatusIs(kDataLoss, "expected 16 lowercase hex digits"));
}

TEST(LatestTest, ChecksumWithWhitespaceIsRejected) {
  EXPECT_THAT(DecodeLatest(WithChecksumField("\t" + ValidField().substr(1))),
              StatusIs(kDataLoss, "latest: bad checksum field '\\x09"));
  EXPECT_THAT(DecodeLatest(WithChecksumField(ValidField() + "\r")),
              StatusIs(kDataLoss, "latest: bad checksum field"));
}

TEST(LatestTest, ChecksumOfWrongLengthIsRejected) {
  EXPECT_THAT(DecodeLatest(WithChecksumField(ValidField().substr(1))),
              StatusIs(kDataLoss, "latest: bad checksum field"));
  EXPECT_THAT(DecodeLatest(WithChecksumField("0" + ValidField())),
              StatusIs(kDataLoss, "latest: bad checksum field"));
}

TEST(LatestTest, StepDirNames) {
  EXPECT_EQ(StepDirName(100), "step-00000100");
  EXPECT_EQ(StepDirName(123456789), "step-123456789");
  uint64_t step;
  EXPECT_TRUE(ParseStepDirName("step-00000100", &step));
  EXPECT_EQ(step, 100u);
  EXPECT_FALSE(ParseStepDirName("step-100", &step));
  EXPECT_FALSE(ParseStepDirName("step-0000010x", &step));
  EXPECT_FALSE(ParseStepDirName(".tmp-step-00000100", &step));
}

}  // namespace
}  // namespace ckpt::format

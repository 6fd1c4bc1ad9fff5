#include "format/latest.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

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
  EXPECT_THAT(DecodeLatest(EncodeLatest("../x")), StatusIs(kDataLoss, "invalid file name"));
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

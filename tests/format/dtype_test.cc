#include "ckpt/format/dtype.h"

#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

TEST(DTypeTest, SizesAndNamesRoundTrip) {
  int count = 0;
  for (DType d : kAllDTypes) {
    auto parsed = DTypeFromName(DTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
    EXPECT_EQ(*DTypeFromCode(static_cast<uint8_t>(d)), d);
    EXPECT_TRUE(DTypeSize(d) == 1 || DTypeSize(d) == 2 || DTypeSize(d) == 4 ||
                DTypeSize(d) == 8);
    ++count;
  }
  EXPECT_EQ(count, 15);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2);
  EXPECT_EQ(DTypeSize(DType::kFloat8E4M3FN), 1);
  EXPECT_EQ(DTypeSize(DType::kFloat64), 8);
  EXPECT_EQ(DTypeName(DType::kFloat8E5M2), "float8_e5m2");
}

TEST(DTypeTest, UnknownCodeIsDataLoss) {
  EXPECT_THAT(DTypeFromCode(0),
              StatusIs(absl::StatusCode::kDataLoss, "unknown dtype code 0"));
  EXPECT_THAT(DTypeFromCode(16), StatusIs(absl::StatusCode::kDataLoss, "16"));
}

TEST(DTypeTest, UnknownNameIsInvalidArgument) {
  EXPECT_THAT(
      DTypeFromName("float128"),
      StatusIs(absl::StatusCode::kInvalidArgument, "unknown dtype 'float128'"));
}

}  // namespace
}  // namespace ckpt

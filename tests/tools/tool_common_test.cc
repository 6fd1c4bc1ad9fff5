#include "common/tool_util.h"
#include "gtest/gtest.h"

namespace ckpt::tools {
namespace {

TEST(HumanBytes, UnitsAndRounding) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1024), "1.00 KiB");
  EXPECT_EQ(HumanBytes(1536), "1.50 KiB");
  EXPECT_EQ(HumanBytes(12ull << 20), "12.0 MiB");
  EXPECT_EQ(HumanBytes(123ull << 30), "123 GiB");
  EXPECT_EQ(HumanBytes(1023ull << 20), "1.00 GiB");
  EXPECT_EQ(HumanBytes(~0ull), "16.0 EiB");
}

TEST(VersionText, NamesToolLibraryAndFormat) {
  std::string v = VersionText("ckpt-x");
  EXPECT_EQ(v.rfind("ckpt-x ", 0), 0u);
  EXPECT_NE(v.find("format v1.0"), std::string::npos);
}

TEST(ShapeText, Formats) {
  EXPECT_EQ(ShapeText(std::vector<int>{}), "[]");
  EXPECT_EQ(ShapeText(std::vector<int>{4, 5}), "[4, 5]");
}

}  // namespace
}  // namespace ckpt::tools

#include "ckpt/format/block_table.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::format {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

std::vector<BlockRecord> Copy(const BlockTable& t) {
  return std::vector<BlockRecord>(t.begin(), t.end());
}

TEST(BlockTableTest, EmptyTableIsOnePointerAndAllocatesNothing) {
  static_assert(sizeof(BlockTable) == sizeof(void*));
  BlockTable t;
  EXPECT_THAT(t, IsEmpty());
  EXPECT_EQ(t.capacity(), 0u);
  EXPECT_EQ(t.data(), nullptr);
  EXPECT_EQ(t.begin(), t.end());
  EXPECT_EQ(t, BlockTable{});
}

TEST(BlockTableTest, PushBackGrowsAndKeepsRecords) {
  BlockTable t;
  std::vector<BlockRecord> want;
  for (uint64_t i = 0; i < 100; ++i) {
    t.push_back({i + 1, 1000 + i});
    want.push_back({i + 1, 1000 + i});
    ASSERT_EQ(t.size(), i + 1);
    ASSERT_GE(t.capacity(), t.size());
  }
  EXPECT_EQ(Copy(t), want);
  EXPECT_EQ(t.front(), (BlockRecord{1, 1000}));
  EXPECT_EQ(t.back(), (BlockRecord{100, 1099}));
  t.pop_back();
  EXPECT_THAT(t, SizeIs(99));
}

TEST(BlockTableTest, ReserveKeepsRecordsAndNeverShrinks) {
  BlockTable t = {{1, 2}, {3, 4}};
  t.reserve(10);
  EXPECT_EQ(t.capacity(), 10u);
  t.reserve(1);
  EXPECT_EQ(t.capacity(), 10u);
  EXPECT_THAT(Copy(t), ElementsAre(BlockRecord{1, 2}, BlockRecord{3, 4}));
}

TEST(BlockTableTest, ResizeFillsWithZeroRecords) {
  BlockTable t = {{1, 2}};
  t.resize(3);
  EXPECT_THAT(Copy(t),
              ElementsAre(BlockRecord{1, 2}, BlockRecord{}, BlockRecord{}));
  t.resize(1);
  EXPECT_THAT(Copy(t), ElementsAre(BlockRecord{1, 2}));
  BlockTable e;
  e.resize(0);
  EXPECT_THAT(e, IsEmpty());
}

TEST(BlockTableTest, CopyMoveAndAssignAreByValue) {
  BlockTable a = {{1, 2}, {3, 4}};
  BlockTable b = a;
  b[0].stored_size = 9;
  EXPECT_EQ(a[0].stored_size, 1u);
  EXPECT_NE(a, b);
  b = a;
  EXPECT_EQ(a, b);
  const BlockTable& self = b;
  b = self;
  EXPECT_EQ(a, b);
  BlockTable c = std::move(b);
  EXPECT_EQ(c, a);
  b = {{5, 6}};
  EXPECT_THAT(Copy(b), ElementsAre(BlockRecord{5, 6}));
  b = {};
  EXPECT_THAT(b, IsEmpty());
  a.clear();
  EXPECT_THAT(a, IsEmpty());
  EXPECT_EQ(a.capacity(), 0u);
}

}  // namespace
}  // namespace ckpt::format

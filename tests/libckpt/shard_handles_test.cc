// ShardHandles: at most `capacity` files open, the least recently used idle
// one closed first, a file in use never closed.
#include "read/shard_handles.h"

#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::internal {
namespace {

using ::ckpt::testing::StatusIs;

// A File that records its closing in `closed`.
class FakeFile final : public File {
 public:
  FakeFile(uint32_t id, std::map<uint32_t, int>* closed)
      : id_(id), closed_(closed), path_(absl::StrCat("f", id)) {}
  ~FakeFile() override { ++(*closed_)[id_]; }
  absl::StatusOr<size_t> PRead(uint64_t, size_t, char*) override { return 0; }
  absl::Status PWrite(uint64_t, absl::string_view) override {
    return absl::OkStatus();
  }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::StatusOr<uint64_t> Size() override { return 0; }
  absl::Status Close() override { return absl::OkStatus(); }
  const std::string& path() const override { return path_; }

 private:
  uint32_t id_;
  std::map<uint32_t, int>* closed_;
  std::string path_;
};

class ShardHandlesTest : public ::testing::Test {
 protected:
  absl::StatusOr<ShardHandles::Lease> Get(uint32_t id) {
    return handles_.Get(id, [&]() -> absl::StatusOr<std::unique_ptr<File>> {
      ++opened_[id];
      return std::make_unique<FakeFile>(id, &closed_);
    });
  }
  std::map<uint32_t, int> opened_, closed_;
  ShardHandles handles_{2};
};

TEST_F(ShardHandlesTest, ReusesAnOpenFile) {
  { CKPT_ASSERT_OK(Get(1).status()); }
  CKPT_ASSERT_OK_AND_ASSIGN(ShardHandles::Lease l, Get(1));
  EXPECT_EQ(l.file().path(), "f1");
  EXPECT_EQ(opened_[1], 1);
  EXPECT_EQ(handles_.InUse(), 1);
}

TEST_F(ShardHandlesTest, ClosesTheLeastRecentlyUsedIdleFile) {
  { CKPT_ASSERT_OK(Get(1).status()); }
  { CKPT_ASSERT_OK(Get(2).status()); }
  { CKPT_ASSERT_OK(Get(1).status()); }  // 2 is now the least recent
  { CKPT_ASSERT_OK(Get(3).status()); }
  EXPECT_EQ(closed_[2], 1);
  EXPECT_EQ(closed_[1], 0);
  EXPECT_EQ(handles_.InUse(), 2);
}

TEST_F(ShardHandlesTest, AFileInUseIsNeverClosed) {
  CKPT_ASSERT_OK_AND_ASSIGN(ShardHandles::Lease held, Get(1));
  { CKPT_ASSERT_OK(Get(2).status()); }
  { CKPT_ASSERT_OK(Get(3).status()); }  // closes 2, the only idle one
  EXPECT_EQ(closed_[1], 0);
  EXPECT_EQ(closed_[2], 1);
  EXPECT_EQ(held.file().path(), "f1");
}

TEST_F(ShardHandlesTest, FailedOpenFreesItsSlot) {
  auto failed = handles_.Get(7, []() -> absl::StatusOr<std::unique_ptr<File>> {
    return absl::NotFoundError("gone");
  });
  EXPECT_THAT(failed, StatusIs(absl::StatusCode::kNotFound, "gone"));
  EXPECT_EQ(handles_.InUse(), 0);
}

TEST_F(ShardHandlesTest, FilledSlotIsCachedIdle) {
  {
    ShardHandles::Slot slot = handles_.Reserve();
    slot.Fill(4, std::make_unique<FakeFile>(4, &closed_));
  }
  CKPT_ASSERT_OK_AND_ASSIGN(ShardHandles::Lease l, Get(4));
  EXPECT_EQ(opened_[4], 0);
  { ShardHandles::Slot unused = handles_.Reserve(); }
  EXPECT_EQ(handles_.InUse(), 1);
}

}  // namespace
}  // namespace ckpt::internal

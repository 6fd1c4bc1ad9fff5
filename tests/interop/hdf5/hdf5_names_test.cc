// Entry names <-> HDF5 dataset paths (ckpt/interop/hdf5/hdf5_names.h).
#include "ckpt/interop/hdf5/hdf5_names.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::interop::hdf5 {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;

MATCHER_P(IsOkAndHolds, m, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status().ToString();
    return false;
  }
  return ::testing::ExplainMatchResult(m, *arg, result_listener);
}

TEST(Hdf5DatasetPaths, DotsBecomeGroups) {
  EXPECT_THAT(
      DatasetPaths({"layers.0.attn.w", "norm", "a b.ünï"}),
      IsOkAndHolds(ElementsAre("/layers/0/attn/w", "/norm", "/a b/ünï")));
}

TEST(Hdf5DatasetPaths, AnEntryThatIsAlsoAGroupIsStoredAsSelf) {
  EXPECT_THAT(DatasetPaths({"w.exp_avg", "w", "w.exp_avg.x", "v"}),
              IsOkAndHolds(ElementsAre("/w/exp_avg/.self", "/w/.self",
                                       "/w/exp_avg/x", "/v")));
}

TEST(Hdf5DatasetPaths, EmptyPartsAtTheEnds) {
  EXPECT_THAT(
      DatasetPaths({".a", "a.", ".", "a", ".a.b"}),
      IsOkAndHolds(ElementsAre("/.empty/a/.self", "/a/.empty", "/.empty/.empty",
                               "/a/.self", "/.empty/a/b")));
}

TEST(Hdf5DatasetPaths, InvalidOrDuplicateName) {
  EXPECT_THAT(DatasetPaths({"a..b"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "'..'"));
  EXPECT_THAT(DatasetPaths({"a/b"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "separator"));
  EXPECT_THAT(DatasetPaths({"x", "x"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "entry name 'x' given twice"));
}

TEST(Hdf5EntryNameOfPath, InverseOfDatasetPaths) {
  const std::vector<std::string> names = {
      "layers.0.attn.w", "w", "w.exp_avg", ".a", "a.", ".", "x.y.", "ünï.b"};
  auto paths = DatasetPaths(names);
  CKPT_ASSERT_OK(paths.status());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_THAT(EntryNameOfPath((*paths)[i]), IsOkAndHolds(names[i]))
        << (*paths)[i];
  }
}

TEST(Hdf5EntryNameOfPath, PlainH5pyPaths) {
  EXPECT_THAT(EntryNameOfPath("model/emb.weight"),
              IsOkAndHolds(std::string("model.emb.weight")));
  EXPECT_THAT(EntryNameOfPath("/.self"), IsOkAndHolds(std::string(".self")));
  EXPECT_THAT(EntryNameOfPath("/a//b/"), IsOkAndHolds(std::string("a.b")));
}

TEST(Hdf5EntryNameOfPath, NotAnEntryName) {
  EXPECT_THAT(EntryNameOfPath("/a/.self/b"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "dataset '/a/.self/b' has no valid entry name: invalid "
                       "name 'a..self.b': "
                       "contains '..'"));
  EXPECT_THAT(
      EntryNameOfPath("/.empty"),
      StatusIs(absl::StatusCode::kInvalidArgument, "has no valid entry name"));
  EXPECT_THAT(EntryNameOfPath("/"),
              StatusIs(absl::StatusCode::kInvalidArgument, "empty"));
  EXPECT_THAT(EntryNameOfPath("/a\\b"),
              StatusIs(absl::StatusCode::kInvalidArgument, "separator"));
  EXPECT_THAT(
      EntryNameOfPath("/" + std::string(1100, 'x')),
      StatusIs(absl::StatusCode::kInvalidArgument, "the limit is 1024"));
}

}  // namespace
}  // namespace ckpt::interop::hdf5

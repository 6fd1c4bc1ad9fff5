// The progress the operations of ops/ report through their callback: each
// phase begins at 0, grows to its total and ends with one finished update.
#include "ckpt/ops/progress.h"

#include <string>
#include <vector>

#include "ckpt/format/status_macros.h"
#include "ckpt/ops/diff.h"
#include "ckpt/ops/reshard.h"
#include "ckpt/ops/validate.h"
#include "ckpt/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "testing/status_matchers.h"

namespace ckpt::ops {
namespace {

using ::ckpt::testing::TempDir;

struct Update {
  std::string phase;
  uint64_t done, total;
  bool finished;
};

class Recorder {
 public:
  ProgressFn Fn() {
    return [this](const ProgressUpdate& u) {
      updates.push_back({std::string(u.phase), u.done, u.total, u.finished});
    };
  }
  // The phases in order, each once.
  std::vector<std::string> Phases() const {
    std::vector<std::string> p;
    for (const Update& u : updates) {
      if (u.done == 0 && !u.finished) p.push_back(u.phase);
    }
    return p;
  }
  // Every phase begins at 0, never goes back, ends finished at its total.
  void ExpectWellFormed() const {
    const Update* begin = nullptr;
    uint64_t done = 0;
    for (const Update& u : updates) {
      if (begin == nullptr) {
        ASSERT_EQ(u.done, 0u) << u.phase;
        ASSERT_FALSE(u.finished) << u.phase;
        begin = &u;
        done = 0;
        continue;
      }
      ASSERT_EQ(u.phase, begin->phase);
      ASSERT_EQ(u.total, begin->total);
      ASSERT_GE(u.done, done);
      done = u.done;
      if (u.finished) {
        EXPECT_EQ(u.done, u.total) << u.phase;
        begin = nullptr;
      }
    }
    EXPECT_EQ(begin, nullptr) << "a phase did not finish";
  }
  std::vector<Update> updates;
};

// A 64x32 float32 tensor of one process, and an object.
void WriteCheckpoint(const std::string& root) {
  static std::vector<float> w(64 * 32);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f;
  auto writer = Writer::Create(Writer::Options()).value();
  ASSERT_THAT(writer->AddTensor("w", DType::kFloat32, {64, 32},
                                FullBox({64, 32}), w.data()),
              ::ckpt::testing::IsOk());
  ASSERT_THAT(writer->SetObject("note", "hello"), ::ckpt::testing::IsOk());
  ASSERT_THAT(writer->Save(root, 7, SaveOptions()).status(),
              ::ckpt::testing::IsOk());
}

TEST(OpsProgress, ValidateReportsTheVerifyingPhase) {
  TempDir tmp;
  WriteCheckpoint(tmp / "run");
  Recorder rec;
  ValidateOptions o;
  o.path = tmp / "run";
  o.threads = 2;
  o.on_progress = rec.Fn();
  CKPT_ASSERT_OK_AND_ASSIGN(ValidateReport r, Validate(o));
  EXPECT_TRUE(r.valid());
  EXPECT_THAT(rec.Phases(), ::testing::ElementsAre(kPhaseVerifying));
  rec.ExpectWellFormed();
  EXPECT_GE(rec.updates.back().total, 64u * 32 * 4);  // read in file order
}

TEST(OpsProgress, DiffReportsTheComparingPhase) {
  TempDir tmp;
  WriteCheckpoint(tmp / "run");
  Recorder rec;
  DiffOptions o;
  o.a = o.b = tmp / "run";
  o.on_progress = rec.Fn();
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport r, Diff(o));
  EXPECT_TRUE(r.equal());
  EXPECT_THAT(rec.Phases(), ::testing::ElementsAre(kPhaseComparing));
  rec.ExpectWellFormed();
  EXPECT_EQ(rec.updates.back().total, r.bytes_compared);
}

TEST(OpsProgress, ReshardWithVerifyReportsWritingThenComparing) {
  TempDir tmp;
  WriteCheckpoint(tmp / "run");
  Recorder rec;
  ReshardOptions o;
  o.src = tmp / "run";
  o.dst = tmp / "out";
  o.to = 3;
  o.verify = true;
  o.on_progress = rec.Fn();
  CKPT_ASSERT_OK_AND_ASSIGN(ReshardReport r, Reshard(o));
  ASSERT_TRUE(r.verify.has_value());
  EXPECT_TRUE(r.verify->equal());
  EXPECT_THAT(rec.Phases(),
              ::testing::ElementsAre(kPhaseWriting, kPhaseComparing));
  rec.ExpectWellFormed();
  EXPECT_EQ(rec.updates.front().total, r.tensor_bytes);
}

TEST(OpsProgress, NothingIsReportedWithoutACallback) {
  TempDir tmp;
  WriteCheckpoint(tmp / "run");
  ValidateOptions o;
  o.path = tmp / "run";
  CKPT_ASSERT_OK_AND_ASSIGN(ValidateReport r, Validate(o));
  EXPECT_TRUE(r.valid());
}

}  // namespace
}  // namespace ckpt::ops

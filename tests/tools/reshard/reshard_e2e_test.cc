// ckpt-reshard end to end with the other tools: checkpoints written by
// ckpt-synth under every layout are resharded, then must pass ckpt-validate
// (the full payload check), equal their source under ckpt-diff, and verify
// against ckpt-synth's generator when loaded on the new world size.
#include <string>

#include "ckpt/format/status_macros.h"
#include "diff/diff.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "reshard/reshard.h"
#include "synth/synth.h"
#include "testing/status_matchers.h"
#include "validate/validate.h"

namespace ckpt::tools {
namespace {

using ::ckpt::testing::TempDir;

struct E2eCase {
  synth::SynthLayout layout;
  int from, to;
};

class ReshardE2eTest : public ::testing::TestWithParam<E2eCase> {};

TEST_P(ReshardE2eTest, ValidEqualAndVerifiesOnTheNewWorldSize) {
  const E2eCase c = GetParam();
  TempDir tmp;
  CKPT_ASSERT_OK(
      synth::WriteTestCheckpoint(tmp / "src", c.from, c.layout).status());
  ReshardOptions o;
  o.src = tmp / "src";
  o.dst = tmp / "dst";
  o.to = c.to;
  o.from = c.from;
  o.progress = false;
  CKPT_ASSERT_OK_AND_ASSIGN(ReshardReport report, Reshard(o));

  ValidateOptions v;
  v.path = tmp / "dst";
  v.threads = 2;
  CKPT_ASSERT_OK_AND_ASSIGN(ValidateReport valid, Validate(v));
  std::ostringstream text;
  PrintValidateText(valid, text);
  EXPECT_TRUE(valid.valid()) << text.str();
  EXPECT_EQ(valid.info.world_size, static_cast<uint32_t>(c.to));

  DiffOptions d;
  d.a = o.src;
  d.b = o.dst;
  d.progress = false;
  CKPT_ASSERT_OK_AND_ASSIGN(DiffReport diff, Diff(d));
  EXPECT_TRUE(diff.equal());

  synth::VerifyOptions vo;
  vo.path = tmp / "dst";
  vo.ranks = c.to;
  CKPT_ASSERT_OK_AND_ASSIGN(synth::VerifyResult verified,
                            synth::VerifySynth(vo));
  for (const auto& m : verified.mismatches) ADD_FAILURE() << m.message;
}

INSTANTIATE_TEST_SUITE_P(
    SynthLayouts, ReshardE2eTest,
    ::testing::Values(E2eCase{synth::SynthLayout::kTp, 4, 3},
                      E2eCase{synth::SynthLayout::kFsdp, 4, 2},
                      E2eCase{synth::SynthLayout::kReplicated, 2, 4},
                      E2eCase{synth::SynthLayout::kMixed, 4, 3},
                      E2eCase{synth::SynthLayout::kMixed, 3, 1}),
    [](const auto& info) {
      return std::string(synth::LayoutName(info.param.layout)) + "_" +
             std::to_string(info.param.from) + "to" +
             std::to_string(info.param.to);
    });

}  // namespace
}  // namespace ckpt::tools

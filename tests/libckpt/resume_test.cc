// End-to-end resume (docs/FAILURE-MODES.md §1, §2): a small trainer with fp32
// master weights, a bfloat16 compute copy derived from them, Adam state,
// an RNG and a data-loader position. Saving at step k on 2 ranks (uneven
// flat shards, like FSDP) and resuming on 3 ranks in a fresh process state
// must give, bit for bit, the losses of a run that never stopped, provided
// the load's per-destination callbacks refresh the compute copy.
#include <cmath>
#include <cstring>
#include <memory>

#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "ckpt/reader.h"
#include "ckpt/writer.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::TempDir;
using ::ckpt::testing::UnevenSplit;

constexpr int kIn = 8, kHidden = 16, kBatch = 4;

uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
float FromBf16(uint16_t h) {
  uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Param {
  std::string name;
  Shape shape;
  std::vector<float> master, exp_avg, exp_avg_sq;
  std::vector<uint16_t> compute;  // bf16 copy used by forward/backward
  void Refresh() {
    compute.resize(master.size());
    for (size_t i = 0; i < master.size(); ++i) compute[i] = ToBf16(master[i]);
  }
};

// y = w2 . relu(w1 x); MSE against a fixed teacher; Adam on the master.
struct Trainer {
  Param w1{"model.w1", {kHidden, kIn}}, w2{"model.w2", {1, kHidden}};
  uint64_t rng = 0;              // data RNG (xorshift64*), an object
  uint64_t loader_position = 0;  // samples consumed, an object
  uint64_t step = 0;

  explicit Trainer(uint64_t init_seed) {
    uint64_t s = init_seed * 0x9E3779B97F4A7C15ull + 1;
    for (Param* p : {&w1, &w2}) {
      size_t n = p->shape[0] * p->shape[1];
      p->master.resize(n);
      p->exp_avg.assign(n, 0);
      p->exp_avg_sq.assign(n, 0);
      for (float& v : p->master)
        v = (static_cast<int64_t>(Next(&s) % 2001) - 1000) / 4000.0f;
      p->Refresh();
    }
    rng = init_seed ^ 0xabcdef;
  }
  static uint64_t Next(uint64_t* s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
  }
  float Sample() {
    return (static_cast<int64_t>(Next(&rng) % 2001) - 1000) / 1000.0f;
  }

  float TrainStep() {
    std::vector<float> g1(w1.master.size(), 0), g2(w2.master.size(), 0);
    float loss = 0;
    for (int b = 0; b < kBatch; ++b) {
      float x[kIn];
      for (float& v : x) v = Sample();
      ++loader_position;
      float target = 0;
      for (int i = 0; i < kIn; ++i) target += (i % 3 - 1) * x[i];
      float h[kHidden], y = 0;
      for (int j = 0; j < kHidden; ++j) {
        float a = 0;
        for (int i = 0; i < kIn; ++i)
          a += FromBf16(w1.compute[j * kIn + i]) * x[i];
        h[j] = a > 0 ? a : 0;
        y += FromBf16(w2.compute[j]) * h[j];
      }
      float d = y - target;
      loss += d * d / kBatch;
      for (int j = 0; j < kHidden; ++j) {
        g2[j] += 2 * d * h[j] / kBatch;
        if (h[j] > 0) {
          for (int i = 0; i < kIn; ++i)
            g1[j * kIn + i] += 2 * d * FromBf16(w2.compute[j]) * x[i] / kBatch;
        }
      }
    }
    ++step;
    Adam(&w1, g1);
    Adam(&w2, g2);
    return loss;
  }
  void Adam(Param* p, const std::vector<float>& g) {
    const float lr = 0.01f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    float c1 = 1 - std::pow(b1, static_cast<float>(step));
    float c2 = 1 - std::pow(b2, static_cast<float>(step));
    for (size_t i = 0; i < g.size(); ++i) {
      p->exp_avg[i] = b1 * p->exp_avg[i] + (1 - b1) * g[i];
      p->exp_avg_sq[i] = b2 * p->exp_avg_sq[i] + (1 - b2) * g[i] * g[i];
      p->master[i] -=
          lr * (p->exp_avg[i] / c1) / (std::sqrt(p->exp_avg_sq[i] / c2) + eps);
    }
    p->Refresh();  // the optimizer's hook keeps the compute copy in sync
  }
  std::string Objects() const {
    std::string s(24, '\0');
    std::memcpy(&s[0], &rng, 8);
    std::memcpy(&s[8], &loader_position, 8);
    std::memcpy(&s[16], &step, 8);
    return s;
  }
  void SetObjects(const std::string& s) {
    std::memcpy(&rng, &s[0], 8);
    std::memcpy(&loader_position, &s[8], 8);
    std::memcpy(&step, &s[16], 8);
  }
};

// Saves `t` from `world` ranks, each holding an uneven flat shard of every
// master weight and optimizer state (the trainer's buffers are shared).
absl::Status Save(const std::string& root, Trainer& t, int world) {
  InProcessWorld w(world);
  return RunRanks(w, [&](Communicator& comm) -> absl::Status {
    Writer::Options wo;
    wo.comm = &comm;
    CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
    for (Param* p : {&t.w1, &t.w2}) {
      auto [start, len] = UnevenSplit(p->master.size(), world)[comm.rank()];
      FlatRange piece{start, len};
      CKPT_RETURN_IF_ERROR(writer->AddTensor(p->name, DType::kFloat32, p->shape,
                                             piece, p->master.data() + start));
      CKPT_RETURN_IF_ERROR(writer->AddTensor("optimizer.exp_avg." + p->name,
                                             DType::kFloat32, p->shape, piece,
                                             p->exp_avg.data() + start));
      CKPT_RETURN_IF_ERROR(writer->AddTensor("optimizer.exp_avg_sq." + p->name,
                                             DType::kFloat32, p->shape, piece,
                                             p->exp_avg_sq.data() + start));
    }
    if (comm.rank() == 0)
      CKPT_RETURN_IF_ERROR(writer->SetObject("trainer.state", t.Objects()));
    return writer->Save(root, t.step, SaveOptions{}).status();
  });
}

// Loads into `t` from `world` ranks (3 = resharded), each loading its own
// uneven flat shard; the master weights' callbacks refresh the compute
// copy when `refresh` is set.
absl::Status Load(const std::string& root, Trainer& t, int world,
                  bool refresh) {
  CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(root));
  InProcessWorld w(world);
  std::string objects;
  CKPT_RETURN_IF_ERROR(RunRanks(w, [&](Communicator& comm) -> absl::Status {
    std::vector<LoadRequest> reqs;
    for (Param* p : {&t.w1, &t.w2}) {
      auto [start, len] = UnevenSplit(p->master.size(), world)[comm.rank()];
      FlatRange piece{start, len};
      reqs.push_back({p->name, DType::kFloat32, p->shape, piece,
                      p->master.data() + start});
      if (refresh) {
        // The shard's compute copy is refreshed as soon as it is loaded.
        reqs.back().on_complete = [p, start = start, len = len] {
          for (uint64_t i = start; i < start + len; ++i)
            p->compute[i] = ToBf16(p->master[i]);
        };
      }
      reqs.push_back({"optimizer.exp_avg." + p->name, DType::kFloat32, p->shape,
                      piece, p->exp_avg.data() + start});
      reqs.push_back({"optimizer.exp_avg_sq." + p->name, DType::kFloat32,
                      p->shape, piece, p->exp_avg_sq.data() + start});
    }
    LoadOptions lo;
    if (comm.rank() == 0) {
      reqs.emplace_back();
      reqs.back().name = "trainer.state";
      reqs.back().object = &objects;
    } else {
      lo.filter = [](const std::string& n) { return n != "trainer.state"; };
    }
    return reader->Load(reqs, lo).status();
  }));
  t.SetObjects(objects);
  return absl::OkStatus();
}

constexpr int kSteps = 12, kSaveAt = 5;

std::vector<float> Uninterrupted() {
  Trainer t(1);
  std::vector<float> losses;
  for (int s = 0; s < kSteps; ++s) losses.push_back(t.TrainStep());
  return losses;
}

TEST(ResumeTest, LossAfterResumeEqualsUninterruptedRunBitForBit) {
  const std::vector<float> want = Uninterrupted();
  for (float l : want) ASSERT_TRUE(std::isfinite(l));
  ASSERT_NE(want[kSaveAt], want[kSaveAt + 1]);  // losses move from step to step
  TempDir dir;
  {
    Trainer t(1);
    for (int s = 0; s < kSaveAt; ++s) ASSERT_EQ(t.TrainStep(), want[s]);
    CKPT_ASSERT_OK(Save(dir.path(), t, 2));
  }
  Trainer resumed(777);  // a new process: different random init everywhere
  CKPT_ASSERT_OK(Load(dir.path(), resumed, 3, /*refresh=*/true));
  EXPECT_EQ(resumed.step, static_cast<uint64_t>(kSaveAt));
  for (int s = kSaveAt; s < kSteps; ++s) {
    float loss = resumed.TrainStep();
    EXPECT_EQ(std::memcmp(&loss, &want[s], 4), 0)
        << "step " << s + 1 << ": " << loss << " vs uninterrupted " << want[s];
  }
}

// The control that shows the test above can fail: without the refresh the
// compute copy keeps the new process's random init (FAILURE-MODES.md §1), and
// the first step after resume computes a different loss.
TEST(ResumeTest, WithoutTheRefreshCallbackTheFirstLossDiffers) {
  const std::vector<float> want = Uninterrupted();
  TempDir dir;
  {
    Trainer t(1);
    for (int s = 0; s < kSaveAt; ++s) t.TrainStep();
    CKPT_ASSERT_OK(Save(dir.path(), t, 2));
  }
  Trainer resumed(777);
  CKPT_ASSERT_OK(Load(dir.path(), resumed, 3, /*refresh=*/false));
  float loss = resumed.TrainStep();
  EXPECT_NE(std::memcmp(&loss, &want[kSaveAt], 4), 0);
}

// docs/FAILURE-MODES.md §2: a model-only load is explicit (a filter), and the
// report names every entry it did not write, so hidden copies are never
// silently left at their initial values.
TEST(ResumeTest, ModelOnlyLoadReportsEveryEntryNotLoaded) {
  TempDir dir;
  Trainer t(1);
  for (int s = 0; s < kSaveAt; ++s) t.TrainStep();
  CKPT_ASSERT_OK(Save(dir.path(), t, 2));
  Trainer fresh(9);
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir.path()));
  std::vector<LoadRequest> reqs;
  for (Param* p : {&fresh.w1, &fresh.w2}) {
    reqs.push_back({p->name, DType::kFloat32, p->shape,
                    FlatRange{0, p->master.size()}, p->master.data()});
  }
  // Without a filter, leaving the optimizer state out is an error.
  EXPECT_THAT(reader->Load(reqs).status(),
              ::ckpt::testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                        "optimizer.exp_avg.model.w1"));
  LoadOptions lo;
  lo.filter = [](const std::string& n) { return n.rfind("model.", 0) == 0; };
  CKPT_ASSERT_OK_AND_ASSIGN(LoadReport report, reader->Load(reqs, lo));
  EXPECT_EQ(report.loaded, (std::vector<std::string>{"model.w1", "model.w2"}));
  std::vector<std::pair<std::string, std::string>> want = {
      {"optimizer.exp_avg.model.w1", "excluded by filter"},
      {"optimizer.exp_avg.model.w2", "excluded by filter"},
      {"optimizer.exp_avg_sq.model.w1", "excluded by filter"},
      {"optimizer.exp_avg_sq.model.w2", "excluded by filter"},
      {"trainer.state", "excluded by filter"}};
  EXPECT_EQ(report.not_loaded, want);
  EXPECT_EQ(fresh.w1.master, t.w1.master);
}

}  // namespace
}  // namespace ckpt

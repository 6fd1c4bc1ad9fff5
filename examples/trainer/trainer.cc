// A toy trainer on 2 in-process ranks (threads), doing with ckpt what a real
// one does: register its sharded state once, save a checkpoint every few
// steps, and after a restart resume from the latest checkpoint, here under a
// different sharding of the optimizer state.
//
// State of rank r of 2:
//   model.weight                float32 [64, 48]  tensor parallel: rows [32r,
//   32r + 32) model.norm                  float32 [48]      replicated on both
//   ranks optim.exp_avg.model.weight  float32 [64, 48]  ZeRO: an uneven flat
//   range
//                                                 (rank 0: 1000 elements, rank
//                                                 1: 2072)
//   rng.rank<r>                 object            this rank's RNG state
//
//   trainer [DIR]    (default: a new temporary directory, removed at the end)
//
// Exit status 0 when the resumed state equals the state saved last.
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ckpt/in_process.h"
#include "ckpt/reader.h"
#include "ckpt/writer.h"

namespace {

constexpr int kRanks = 2;
constexpr uint64_t kRows = 64, kCols = 48;
constexpr uint64_t kZeroSplit =
    1000;  // rank 0's share of the flat optimizer state

// What one rank holds in memory.
struct RankState {
  int rank = 0;
  std::vector<float> weight;   // its rows of model.weight
  std::vector<float> norm;     // the whole model.norm
  std::vector<float> exp_avg;  // its flat range of the Adam moment
  uint64_t rng = 0;

  ckpt::Box WeightRows() const {
    return ckpt::Box{{static_cast<uint64_t>(rank) * kRows / kRanks, 0},
                     {kRows / kRanks, kCols}};
  }
  ckpt::FlatRange ExpAvgRange() const {
    return rank == 0 ? ckpt::FlatRange{0, kZeroSplit}
                     : ckpt::FlatRange{kZeroSplit, kRows * kCols - kZeroSplit};
  }
};

// The value "training" leaves in element i (global index) of a tensor at
// `step`: exact in float, different for every step, tensor and element.
float Value(uint64_t step, int tensor, uint64_t i) {
  return static_cast<float>(tensor * 10000 + i) +
         0.5f * static_cast<float>(step);
}

std::string RngName(int rank) { return absl::StrCat("rng.rank", rank); }
std::string RngBytes(uint64_t rng) {
  return std::string(reinterpret_cast<const char*>(&rng), sizeof(rng));
}

// One "training step" up to `step`: every value of this rank's state moves.
void Train(RankState& s, uint64_t step) {
  const ckpt::Box rows = s.WeightRows();
  for (uint64_t i = 0; i < s.weight.size(); ++i) {
    s.weight[i] = Value(step, 0, rows.offset[0] * kCols + i);
  }
  for (uint64_t i = 0; i < kCols; ++i) s.norm[i] = Value(step, 1, i);
  const ckpt::FlatRange f = s.ExpAvgRange();
  for (uint64_t i = 0; i < f.length; ++i)
    s.exp_avg[i] = Value(step, 2, f.start + i);
  s.rng = step * 1000 + s.rank;
}

absl::Status TrainAndSave(ckpt::Communicator& comm, const std::string& root) {
  RankState s;
  s.rank = comm.rank();
  s.weight.resize(kRows / kRanks * kCols);
  s.norm.resize(kCols);
  s.exp_avg.resize(s.ExpAvgRange().length);

  ckpt::Writer::Options wo;
  wo.comm = &comm;
  auto writer = ckpt::Writer::Create(wo);
  if (!writer.ok()) return writer.status();
  // Registered once: the writer keeps pointers and reads them at each Save.
  ckpt::Writer& w = **writer;
  absl::Status st =
      w.AddTensor("model.weight", ckpt::DType::kFloat32, {kRows, kCols},
                  s.WeightRows(), s.weight.data());
  ckpt::TensorOptions replica;
  replica.replica = true;
  if (st.ok()) {
    st = w.AddTensor("model.norm", ckpt::DType::kFloat32, {kCols},
                     ckpt::FullBox({kCols}), s.norm.data(), replica);
  }
  if (st.ok()) {
    st = w.AddTensor("optim.exp_avg.model.weight", ckpt::DType::kFloat32,
                     {kRows, kCols}, s.ExpAvgRange(), s.exp_avg.data());
  }
  if (!st.ok()) return st;

  for (uint64_t step : {100, 200}) {
    Train(s, step);
    // Objects are copied when set: set them again before each save.
    if (absl::Status o = w.SetObject(RngName(s.rank), RngBytes(s.rng)); !o.ok())
      return o;
    ckpt::SaveOptions so;
    so.keep_last = 2;
    so.metadata = {{"trainer.example", "examples/trainer"}};
    auto saved = w.Save(root, step, so);  // collective: every rank calls it
    if (!saved.ok()) return saved.status();
    if (s.rank == 0) {
      std::printf("trainer: saved step %llu to %s (%llu bytes)\n",
                  static_cast<unsigned long long>(step), saved->path.c_str(),
                  static_cast<unsigned long long>(saved->logical_bytes));
    }
  }
  return absl::OkStatus();
}

// A restarted job: fresh memory, state loaded from the latest checkpoint.
// The optimizer state is now sharded by rows like the weight (ZeRO off),
// not as it was saved: the reader reshards.
absl::Status Resume(ckpt::Communicator& comm, const std::string& root,
                    uint64_t* step, std::string* path, int* mismatches) {
  RankState s;
  s.rank = comm.rank();
  s.weight.assign(kRows / kRanks * kCols, 0.0f);
  s.norm.assign(kCols, 0.0f);
  std::vector<float> exp_avg_rows(kRows / kRanks * kCols, 0.0f);
  std::string rng;

  auto reader = ckpt::Reader::Open(root);  // follows `latest`
  if (!reader.ok()) return reader.status();
  const uint64_t resumed = (*reader)->description().step;

  std::vector<ckpt::LoadRequest> reqs(4);
  reqs[0] = {"model.weight",
             ckpt::DType::kFloat32,
             {kRows, kCols},
             s.WeightRows(),
             s.weight.data()};
  reqs[1] = {"model.norm",
             ckpt::DType::kFloat32,
             {kCols},
             ckpt::FullBox({kCols}),
             s.norm.data()};
  reqs[2] = {"optim.exp_avg.model.weight",
             ckpt::DType::kFloat32,
             {kRows, kCols},
             s.WeightRows(),
             exp_avg_rows.data()};
  reqs[3].name = RngName(s.rank);
  reqs[3].object = &rng;
  ckpt::LoadOptions lo;
  // The other ranks' RNG states are theirs to load.
  const std::string mine = RngName(s.rank);
  lo.filter = [&mine](const std::string& name) {
    return name.rfind("rng.", 0) != 0 || name == mine;
  };
  auto report = (*reader)->Load(reqs, lo);
  if (!report.ok()) return report.status();

  int bad = 0;
  const uint64_t first = s.WeightRows().offset[0] * kCols;
  for (uint64_t i = 0; i < s.weight.size(); ++i) {
    bad += s.weight[i] != Value(resumed, 0, first + i);
    bad += exp_avg_rows[i] != Value(resumed, 2, first + i);
  }
  for (uint64_t i = 0; i < kCols; ++i) bad += s.norm[i] != Value(resumed, 1, i);
  bad += rng != RngBytes(resumed * 1000 + s.rank);
  mismatches[s.rank] = bad;
  if (s.rank == 0) {
    *step = resumed;
    *path = (*reader)->path();
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  std::string root;
  bool temporary = argc < 2;
  if (temporary) {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "ckpt-trainer-XXXXXX")
            .string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::perror("trainer: mkdtemp");
      return 1;
    }
    root = tmpl;
  } else {
    root = argv[1];
  }

  ckpt::InProcessWorld world(kRanks);
  absl::Status st = ckpt::RunRanks(world, [&](ckpt::Communicator& comm) {
    return TrainAndSave(comm, root);
  });
  uint64_t step = 0;
  std::string path;
  int mismatches[kRanks] = {};
  if (st.ok()) {
    ckpt::InProcessWorld restarted(kRanks);
    st = ckpt::RunRanks(restarted, [&](ckpt::Communicator& comm) {
      return Resume(comm, root, &step, &path, mismatches);
    });
  }
  if (temporary) std::filesystem::remove_all(root);
  if (!st.ok()) {
    std::fprintf(stderr, "trainer: %s\n", st.ToString().c_str());
    return 1;
  }
  const int bad = mismatches[0] + mismatches[1];
  if (bad != 0) {
    std::printf("trainer: resumed from %s at step %llu: %d values differ\n",
                path.c_str(), static_cast<unsigned long long>(step), bad);
    return 1;
  }
  std::printf("trainer: resumed from %s at step %llu: every value matches\n",
              path.c_str(), static_cast<unsigned long long>(step));
  return 0;
}

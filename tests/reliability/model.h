// A small training state whose every byte is a function of the step, for the
// reliability suites: the writer processes (crash_writer.cc) and the tests
// that check what they left behind use it, so that a check knows the exact
// bytes of any checkpoint from its step alone.
//
// Per rank of a world of W ranks (scale s, about 200 KiB * s in all):
//   embed        float32  [64s, 256]   rows split unevenly over the ranks
//   layers.0.w   bfloat16 [256, 64s]   columns split unevenly
//   layers.1.w   bfloat16 [256, 64s]   columns split unevenly
//   opt.exp_avg  float32  flat 16384s  uneven flat ranges (FSDP)
//   norm         float32  [256]        replicated on every rank
//   rng.rank<r>  object, 96 bytes      one per rank
//   trainer      object, 40 bytes      rank 0 only
// embed and opt.exp_avg are incompressible; the layers and norm are
// low-entropy, so zstd saves compress them. The manifest's metadata holds
// "step" = the decimal step, checked against CHECKPOINT_INFO.
//
// Header-only; no gtest, so that the writer program can use it.
#ifndef CKPT_TESTS_RELIABILITY_MODEL_H_
#define CKPT_TESTS_RELIABILITY_MODEL_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/reader.h"
#include "ckpt/storage.h"
#include "ckpt/writer.h"

namespace ckpt::reliability {

enum class Split { kRows, kCols, kFlat, kReplica };

struct TensorSpec {
  std::string name;
  DType dtype;
  Shape shape;
  Split split;
  bool compressible;
};

inline std::vector<TensorSpec> ModelTensors(int scale) {
  const uint64_t s = static_cast<uint64_t>(std::max(scale, 1));
  return {
      {"embed", DType::kFloat32, {64 * s, 256}, Split::kRows, false},
      {"layers.0.w", DType::kBFloat16, {256, 64 * s}, Split::kCols, true},
      {"layers.1.w", DType::kBFloat16, {256, 64 * s}, Split::kCols, true},
      {"norm", DType::kFloat32, {256}, Split::kReplica, true},
      {"opt.exp_avg", DType::kFloat32, {16384 * s}, Split::kFlat, false},
  };
}

inline uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t NameHash(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The element with global (row-major) index `g` of tensor `t` at step
// `step`, as DTypeSize bytes at `out`. `salt` is ElementSalt(t, step).
inline uint64_t ElementSalt(const TensorSpec& t, uint64_t step) {
  return t.compressible ? 3 * (step % 1000) + NameHash(t.name) % 7
                        : Mix(step * 0x100000001b3ull ^ NameHash(t.name));
}
inline void ElementBytes(const TensorSpec& t, uint64_t salt, uint64_t g,
                         char* out) {
  const uint64_t v = t.compressible ? (g % 61) + salt : Mix(salt ^ g);
  std::memcpy(out, &v, DTypeSize(t.dtype));  // little-endian host
}

// [begin, begin + size) of the uneven split of [0, n) into `world` parts:
// part k gets a share proportional to k + 1 (so no two parts are equal).
inline std::pair<uint64_t, uint64_t> UnevenPart(uint64_t n, int world, int k) {
  const uint64_t total = static_cast<uint64_t>(world) * (world + 1) / 2;
  auto edge = [&](int i) {
    return i >= world ? n
                      : n * (static_cast<uint64_t>(i) * (i + 1) / 2) / total;
  };
  return {edge(k), edge(k + 1) - edge(k)};
}

// Rank `rank`'s piece of `t`.
inline Region PieceOf(const TensorSpec& t, int rank, int world) {
  switch (t.split) {
    case Split::kRows: {
      auto [b, n] = UnevenPart(t.shape[0], world, rank);
      return Box{{b, 0}, {n, t.shape[1]}};
    }
    case Split::kCols: {
      auto [b, n] = UnevenPart(t.shape[1], world, rank);
      return Box{{0, b}, {t.shape[0], n}};
    }
    case Split::kFlat: {
      uint64_t numel = 1;
      for (uint64_t d : t.shape) numel *= d;
      auto [b, n] = UnevenPart(numel, world, rank);
      return FlatRange{b, n};
    }
    case Split::kReplica:
      return FullBox(t.shape);
  }
  return FullBox(t.shape);
}

// The bytes of region `r` of `t` at `step` (1-d or 2-d boxes, flat ranges).
inline void FillRegion(const TensorSpec& t, uint64_t step, const Region& r,
                       char* out) {
  const int es = DTypeSize(t.dtype);
  const uint64_t salt = ElementSalt(t, step);
  if (const FlatRange* f = std::get_if<FlatRange>(&r)) {
    for (uint64_t i = 0; i < f->length; ++i)
      ElementBytes(t, salt, f->start + i, out + i * es);
    return;
  }
  const Box& b = std::get<Box>(r);
  if (b.size.size() == 1) {
    for (uint64_t i = 0; i < b.size[0]; ++i)
      ElementBytes(t, salt, b.offset[0] + i, out + i * es);
    return;
  }
  uint64_t k = 0;
  for (uint64_t i = 0; i < b.size[0]; ++i) {
    const uint64_t row = (b.offset[0] + i) * t.shape[1] + b.offset[1];
    for (uint64_t j = 0; j < b.size[1]; ++j, ++k)
      ElementBytes(t, salt, row + j, out + k * es);
  }
}

inline std::string RegionBytes(const TensorSpec& t, uint64_t step,
                               const Region& r) {
  std::string out(RegionElements(r) * DTypeSize(t.dtype), '\0');
  FillRegion(t, step, r, out.data());
  return out;
}

inline std::string RngObject(uint64_t step, int rank) {
  std::string out(96, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] =
        static_cast<char>(Mix(step * 1315423911u + rank * 2654435761u + i));
  }
  return out;
}

inline std::string TrainerObject(uint64_t step) {
  return absl::StrCat("{\"step\": ", step, ", \"tokens\": ", step * 4096,
                      "}     ")
      .substr(0, 40);
}

struct SaveConfig {
  int scale = 1;
  int keep_last = 0;
  int io_threads = 2;
  // Even steps are saved with zstd, odd ones without.
  bool zstd_on_even_steps = true;
};

inline SaveOptions SaveOptionsFor(uint64_t step, const SaveConfig& c) {
  SaveOptions o;
  o.codec = (c.zstd_on_even_steps && step % 2 == 0) ? format::Codec::kZstd
                                                    : format::Codec::kNone;
  o.zstd_level = 1;
  o.io_threads = c.io_threads;
  o.block_size = 64 << 10;
  o.alignment = 4096;
  o.keep_last = c.keep_last;
  o.metadata = {{"step", absl::StrCat(step)}};
  return o;
}

// One rank's training state, registered once with its Writer; Fill
// rewrites every byte for a step (the registered pointers stay valid).
class ModelRank {
 public:
  ModelRank(int rank, int world, int scale)
      : rank_(rank), tensors_(ModelTensors(scale)) {
    for (const TensorSpec& t : tensors_) {
      Region r = PieceOf(t, rank, world);
      buffers_.emplace_back(RegionElements(r) * DTypeSize(t.dtype), '\0');
      regions_.push_back(r);
    }
  }

  absl::Status Register(Writer& w) {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const TensorSpec& t = tensors_[i];
      TensorOptions o;
      o.replica = t.split == Split::kReplica;
      CKPT_RETURN_IF_ERROR(w.AddTensor(t.name, t.dtype, t.shape, regions_[i],
                                       buffers_[i].data(), o));
    }
    return absl::OkStatus();
  }

  // REQUIRES: Register(w) was called.
  absl::Status Fill(Writer& w, uint64_t step) {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      FillRegion(tensors_[i], step, regions_[i], buffers_[i].data());
    }
    CKPT_RETURN_IF_ERROR(
        w.SetObject(absl::StrCat("rng.rank", rank_), RngObject(step, rank_)));
    if (rank_ == 0)
      CKPT_RETURN_IF_ERROR(w.SetObject("trainer", TrainerObject(step)));
    return absl::OkStatus();
  }

 private:
  const int rank_;
  std::vector<TensorSpec> tensors_;
  std::vector<Region> regions_;
  std::vector<std::string> buffers_;
};

// A Writer with its ModelRank: what one rank of a training job holds.
struct RankState {
  ModelRank model;
  std::unique_ptr<Writer> writer;

  static absl::StatusOr<std::unique_ptr<RankState>> Create(
      Communicator* comm, int scale, Storage* storage = nullptr) {
    const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
    auto st = std::unique_ptr<RankState>(
        new RankState{ModelRank(rank, world, scale), nullptr});
    Writer::Options wo;
    wo.comm = comm;
    wo.storage = storage;
    CKPT_ASSIGN_OR_RETURN(st->writer, Writer::Create(wo));
    CKPT_RETURN_IF_ERROR(st->model.Register(*st->writer));
    return st;
  }

  absl::StatusOr<SaveResult> Save(const std::string& root, uint64_t step,
                                  const SaveConfig& c) {
    CKPT_RETURN_IF_ERROR(model.Fill(*writer, step));
    return writer->Save(root, step, SaveOptionsFor(step, c));
  }

  // As a trainer with asynchronous checkpoints: snapshot `step`, then
  // overwrite every registered byte (with values no checkpoint holds)
  // while the save is in flight, then wait for it to commit.
  absl::StatusOr<SaveResult> SaveAsyncAndTrainOn(const std::string& root,
                                                 uint64_t step,
                                                 const SaveConfig& c) {
    CKPT_RETURN_IF_ERROR(model.Fill(*writer, step));
    CKPT_ASSIGN_OR_RETURN(
        SaveHandle h, writer->SaveAsync(root, step, SaveOptionsFor(step, c)));
    CKPT_RETURN_IF_ERROR(model.Fill(*writer, step + (uint64_t{1} << 40)));
    return h.Wait();
  }
};

// Marks a status as "a load returned bytes that differ from what was saved":
// the one outcome the reliability suites never accept.
inline constexpr char kWrongDataPayload[] = "ckpt.reliability/wrong-data";

inline absl::Status WrongData(const std::string& what) {
  absl::Status s = absl::InternalError(absl::StrCat("WRONG DATA: ", what));
  s.SetPayload(kWrongDataPayload, absl::Cord("1"));
  return s;
}
inline bool IsWrongData(const absl::Status& s) {
  return s.GetPayload(kWrongDataPayload).has_value();
}

// Opens `path` (a checkpoint or a root: `latest` is followed), loads every
// entry whole and compares each byte with the model at the manifest's step;
// also checks the step against the metadata and the directory name. Returns
// the step. Errors of the library come back unchanged; differences are
// WrongData.
inline absl::StatusOr<uint64_t> VerifyCheckpoint(
    const std::string& path, int scale, Storage* storage = nullptr,
    std::string* dir_out = nullptr) {
  ReaderOptions ro;
  ro.storage = storage;
  ro.io_threads = 2;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader, Reader::Open(path, ro));
  const format::Manifest& m = reader->manifest();
  const uint64_t step = m.info.step;
  const int world = static_cast<int>(m.info.world_size);
  if (dir_out) *dir_out = reader->path();
  const std::string dir_name =
      reader->path().substr(reader->path().rfind('/') + 1);
  if (dir_name != format::StepDirName(step)) {
    return WrongData(absl::StrCat(reader->path(), ": holds step ", step));
  }
  bool meta_ok = false;
  for (const auto& [k, v] : m.metadata)
    meta_ok |= (k == "step" && v == absl::StrCat(step));
  if (!meta_ok)
    return WrongData(absl::StrCat(reader->path(), ": metadata step != ", step));

  std::vector<TensorSpec> tensors = ModelTensors(scale);
  std::vector<std::string> got(tensors.size());
  std::vector<LoadRequest> reqs;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    uint64_t numel = 1;
    for (uint64_t d : t.shape) numel *= d;
    got[i].assign(numel * DTypeSize(t.dtype), '\0');
    reqs.push_back({t.name, t.dtype, t.shape, FullBox(t.shape), got[i].data()});
  }
  std::vector<std::string> objects(world + 1);
  for (int r = 0; r <= world; ++r) {
    reqs.emplace_back();
    reqs.back().name = r < world ? absl::StrCat("rng.rank", r) : "trainer";
    reqs.back().object = &objects[r];
  }
  // Strict: every entry of the checkpoint must be requested, so an extra
  // entry fails as well as a missing one.
  CKPT_RETURN_IF_ERROR(reader->Load(reqs).status());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (got[i] != RegionBytes(tensors[i], step, FullBox(tensors[i].shape))) {
      return WrongData(
          absl::StrCat(reader->path(), ": '", tensors[i].name, "' differs"));
    }
  }
  for (int r = 0; r < world; ++r) {
    if (objects[r] != RngObject(step, r)) {
      return WrongData(
          absl::StrCat(reader->path(), ": rng.rank", r, " differs"));
    }
  }
  if (objects[world] != TrainerObject(step)) {
    return WrongData(absl::StrCat(reader->path(), ": 'trainer' differs"));
  }
  return step;
}

// What a root holds, by kind of name.
struct RootListing {
  std::vector<uint64_t> committed;       // step-* directories with a MANIFEST
  std::vector<std::string> uncommitted;  // step-* directories without one
  std::vector<std::string> temporaries;  // .tmp-*
  std::vector<std::string>
      other;  // anything else but latest and the lock files
  bool has_latest = false;
};

inline absl::StatusOr<RootListing> ListRoot(const std::string& root,
                                            Storage* fs = DefaultStorage()) {
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, fs->List(root));
  RootListing out;
  for (const std::string& n : names) {
    uint64_t step;
    if (format::ParseStepDirName(n, &step)) {
      if (fs->Stat(JoinPath(JoinPath(root, n), format::kManifestFileName))
              .ok()) {
        out.committed.push_back(step);
      } else {
        out.uncommitted.push_back(n);
      }
    } else if (n.rfind(format::kTempDirPrefix, 0) == 0) {
      out.temporaries.push_back(n);
    } else if (n == format::kLatestFileName) {
      out.has_latest = true;
    } else if (n != ".ckpt-save.lock" && n != ".ckpt-commit.lock") {
      out.other.push_back(n);
    }
  }
  return out;
}

}  // namespace ckpt::reliability

#endif  // CKPT_TESTS_RELIABILITY_MODEL_H_

// Small checkpoints for the ckpt-diff and ckpt-reshard tests, written by the
// real library from several in-process ranks (ckpt::InProcessWorld).
#ifndef CKPT_TESTS_TOOLS_DIFF_FIXTURES_H_
#define CKPT_TESTS_TOOLS_DIFF_FIXTURES_H_

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "ckpt/writer.h"
#include "libckpt/test_util.h"
#include "testing/files.h"

namespace ckpt::testing {

struct FixtureTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  Layout layout = Layout::kRows;
  std::string global;  // all elements, row-major; ReferenceBytes if empty
  // If not empty: rank r's piece (overrides `layout`), one per rank.
  std::vector<Piece> pieces;
  bool partial = false;
};

struct FixtureObject {
  std::string name;
  std::string bytes;
  int rank = 0;
};

// FNV-1a of `s`: a seed that is the same on every platform.
inline uint64_t SeedOf(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

// The global bytes of `t` (its `global`, or reference bytes seeded by name).
inline std::string GlobalOf(const FixtureTensor& t) {
  if (!t.global.empty()) return t.global;
  return ReferenceBytes(t.dtype, t.shape, SeedOf(t.name));
}

// n float32 values start, start + step, ... as bytes.
inline std::string FloatRamp(uint64_t n, float start = 0, float step = 0.25f) {
  std::string out(n * 4, '\0');
  for (uint64_t i = 0; i < n; ++i) {
    float v = start + step * static_cast<float>(i);
    std::memcpy(&out[i * 4], &v, 4);
  }
  return out;
}

// Writes `tensors` and `objects` from `world` ranks as checkpoint `step`
// under `root`.
inline absl::Status WriteFixture(const std::string& root, uint64_t step,
                                 int world,
                                 const std::vector<FixtureTensor>& tensors,
                                 const std::vector<FixtureObject>& objects = {},
                                 SaveOptions options = {}) {
  InProcessWorld w(world);
  std::vector<std::string> globals;
  for (const auto& t : tensors) globals.push_back(GlobalOf(t));
  std::vector<std::vector<std::string>> bufs(
      world, std::vector<std::string>(tensors.size()));
  return RunRanks(w, [&](Communicator& comm) -> absl::Status {
    const int r = comm.rank();
    Writer::Options wo;
    wo.comm = &comm;
    CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
    for (size_t i = 0; i < tensors.size(); ++i) {
      const FixtureTensor& t = tensors[i];
      Piece piece =
          t.pieces.empty() ? PieceOf(t.layout, t.shape, r, world) : t.pieces[r];
      std::string& buf = bufs[r][i];
      buf = Extract(globals[i], t.dtype, t.shape, piece.region);
      TensorOptions to;
      to.replica = piece.replica;
      to.partial = t.partial;
      static const char kEmpty = 0;
      CKPT_RETURN_IF_ERROR(
          writer->AddTensor(t.name, t.dtype, t.shape, piece.region,
                            buf.empty() ? &kEmpty : buf.data(), to));
    }
    for (const auto& o : objects) {
      if (o.rank == r) CKPT_RETURN_IF_ERROR(writer->SetObject(o.name, o.bytes));
    }
    return writer->Save(root, step, options).status();
  });
}

// A box piece (for explicit, e.g. irregular, layouts).
inline Piece BoxPiece(Dims offset, Dims size) {
  return Piece{Box{offset, size}, false};
}

// What a failed save may leave in checkpoint root `root`: nothing but the
// root's lock files (spec/FORMAT.md §4.1), so the names of anything else
// (a step directory, `latest`, a temporary directory). Empty if `root` does
// not exist.
inline std::vector<std::string> LeftoversIn(const std::string& root) {
  std::vector<std::string> out;
  if (!std::filesystem::exists(root)) return out;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (name == ".ckpt-save.lock" || name == ".ckpt-commit.lock") continue;
    out.push_back(name);
  }
  return out;
}

// Sets element `index` of a float32 global buffer.
inline void SetFloat(std::string* global, uint64_t index, float v) {
  std::memcpy(&(*global)[index * 4], &v, 4);
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TOOLS_DIFF_FIXTURES_H_

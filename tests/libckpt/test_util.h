// Helpers shared by libckpt tests: temp dirs, reference tensors, layouts.
#ifndef CKPT_TESTS_LIBCKPT_TEST_UTIL_H_
#define CKPT_TESTS_LIBCKPT_TEST_UTIL_H_

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "ckpt/types.h"
#include "gtest/gtest.h"
#include "testing/geometry_reference.h"

namespace ckpt::testing {

// The unsigned value of environment variable `name` (a test's trial count,
// seed, delay or scale, which scripts/sanitize may lower), or `fallback`
// when it is unset or empty.
inline uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return strtoull(v, nullptr, 10);
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "ckpt-test-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& s) const { return path_ + "/" + s; }

 private:
  std::string path_;
};

inline uint64_t Numel(const Shape& s) {
  uint64_t n = 1;
  for (uint64_t d : s) n *= d;
  return n;
}

// Deterministic global bytes for a tensor (bool stays 0/1).
inline std::string ReferenceBytes(DType dtype, const Shape& shape,
                                  uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(Numel(shape) * DTypeSize(dtype), '\0');
  for (auto& c : out)
    c = static_cast<char>(dtype == DType::kBool ? rng() % 2 : rng());
  return out;
}

// The bytes of region r cut out of the global tensor, by brute force.
inline std::string Extract(const std::string& global, DType dtype,
                           const Shape& shape, const Region& r) {
  int es = DTypeSize(dtype);
  std::string out(RegionElements(r) * es, '\0');
  for (uint64_t g = 0; g < Numel(shape); ++g) {
    int64_t l = LocalIndexOf(shape, r, g);
    if (l >= 0) out.replace(l * es, es, global, g * es, es);
  }
  return out;
}

struct Piece {
  Region region;
  bool replica = false;
};

enum class Layout { kWhole, kRows, kCols, kGrid, kFlatUneven, kReplicated };
inline const char* LayoutName(Layout l) {
  switch (l) {
    case Layout::kWhole:
      return "whole";
    case Layout::kRows:
      return "rows";
    case Layout::kCols:
      return "cols";
    case Layout::kGrid:
      return "grid";
    case Layout::kFlatUneven:
      return "flat";
    case Layout::kReplicated:
      return "replicated";
  }
  return "?";
}
inline constexpr Layout kAllLayouts[] = {
    Layout::kWhole, Layout::kRows,       Layout::kCols,
    Layout::kGrid,  Layout::kFlatUneven, Layout::kReplicated};

// Uneven split of [0, n) into k parts (some may be empty).
inline std::vector<std::pair<uint64_t, uint64_t>> UnevenSplit(uint64_t n,
                                                              int k) {
  std::vector<std::pair<uint64_t, uint64_t>> parts;
  uint64_t begin = 0;
  for (int i = 0; i < k; ++i) {
    // Weights 1, 2, 3, ... make every split uneven.
    uint64_t end =
        (i == k - 1) ? n : n * ((i + 1) * (i + 2) / 2) / (k * (k + 1) / 2);
    end = std::max(end, begin);
    parts.emplace_back(begin, end - begin);
    begin = end;
  }
  return parts;
}

// What rank `rank` of `world` holds of a tensor of `shape` under `layout`.
// Every layout covers the tensor exactly once (replicas aside).
inline Piece PieceOf(Layout layout, const Shape& shape, int rank, int world) {
  const size_t n = shape.size();
  Box full = FullBox(shape);
  switch (layout) {
    case Layout::kWhole:
      if (rank == 0) return {full, false};
      return {FlatRange{0, 0}, false};  // nothing
    case Layout::kReplicated:
      return {full, true};
    case Layout::kRows:
    case Layout::kCols: {
      if (n == 0) return PieceOf(Layout::kWhole, shape, rank, world);
      size_t d = layout == Layout::kRows ? 0 : n - 1;
      auto p = UnevenSplit(shape[d], world)[rank];
      Box b = full;
      b.offset[d] = p.first;
      b.size[d] = p.second;
      return {b, false};
    }
    case Layout::kGrid: {
      if (n < 2 || world % 2 != 0)
        return PieceOf(Layout::kRows, shape, rank, world);
      auto p0 = UnevenSplit(shape[0], world / 2)[rank / 2];
      auto p1 = UnevenSplit(shape[n - 1], 2)[rank % 2];
      Box b = full;
      b.offset[0] = p0.first;
      b.size[0] = p0.second;
      b.offset[n - 1] = p1.first;
      b.size[n - 1] = p1.second;
      return {b, false};
    }
    case Layout::kFlatUneven: {
      auto p = UnevenSplit(Numel(shape), world)[rank];
      return {FlatRange{p.first, p.second}, false};
    }
  }
  return {full, false};
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_LIBCKPT_TEST_UTIL_H_

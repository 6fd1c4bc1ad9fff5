#include "ckpt/ops/reshard_layout.h"

#include <algorithm>
#include <set>
#include <utility>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "json_string.h"

namespace ckpt::ops {
namespace {

using format::EntryRecord;
using format::EscapeText;

bool IsPartial(const EntryRecord& e) {
  return (e.flags & format::kEntryFlagPartial) != 0;
}

uint64_t Numel(const Shape& s) {
  uint64_t n = 1;
  for (uint64_t d : s) n *= d;
  return n;
}

// [start, start + len) of part `rank` of `n` of `total` items.
std::pair<uint64_t, uint64_t> EvenPart(uint64_t total, int rank, int n) {
  const uint64_t base = total / n, rem = total % n,
                 r = static_cast<uint64_t>(rank);
  return {r * base + std::min(r, rem), base + (r < rem ? 1 : 0)};
}

absl::Status CannotInfer(const EntryRecord& e, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "entry '", EscapeText(e.name), "': cannot infer its layout: ", why,
      "; give it in an override file (--layout FILE)"));
}

// Boxes: per dim, the distinct intervals must partition the dim, and the
// chunks must be every combination of them (coverage is already checked,
// so counting suffices). The number of parts along each dim.
absl::StatusOr<std::vector<size_t>> GridParts(
    const EntryRecord& e, const std::vector<const Region*>& regions) {
  const size_t nd = e.shape.size();
  std::vector<size_t> parts(nd);
  uint64_t combos = 1;
  for (size_t d = 0; d < nd; ++d) {
    std::set<std::pair<uint64_t, uint64_t>> iv;
    for (const Region* r : regions) {
      const Box& b = std::get<Box>(*r);
      iv.emplace(b.offset[d], b.size[d]);
    }
    uint64_t next = 0;
    for (const auto& [off, size] : iv) {
      if (off != next) {
        return CannotInfer(
            e, absl::StrCat("its ", regions.size(),
                            " chunks are not a regular grid (along dim", d,
                            ", a chunk starts at ", off, " where ",
                            off < next ? "another part is" : "none ends", ")"));
      }
      next = off + size;
    }
    parts[d] = iv.size();
    combos *= iv.size();
    if (combos > regions.size()) break;
  }
  if (combos != regions.size()) {
    return CannotInfer(e, absl::StrCat("its ", regions.size(),
                                       " chunks are not a regular grid"));
  }
  return parts;
}

}  // namespace

absl::StatusOr<Split> InferSplit(const EntryRecord& e,
                                 std::string* description) {
  Split s;
  std::vector<const Region*> regions;
  for (const auto& c : e.chunks)
    if (RegionElements(c.region) != 0) regions.push_back(&c.region);
  const uint64_t numel = Numel(e.shape);
  if (numel == 0 ||
      (regions.size() == 1 && RegionElements(*regions[0]) == numel)) {
    *description = numel == 0 ? "empty" : "whole";
    s.kind = Split::Kind::kReplicated;
    return s;
  }
  size_t flats = 0;
  for (const Region* r : regions)
    flats += std::holds_alternative<FlatRange>(*r);
  if (flats == regions.size()) {
    *description = absl::StrCat(regions.size(), " flat ranges");
    s.kind = Split::Kind::kFlat;
    return s;
  }
  if (flats != 0) {
    return CannotInfer(
        e, absl::StrCat(flats, " of its ", regions.size(),
                        " chunks are flat ranges, the others boxes"));
  }
  CKPT_ASSIGN_OR_RETURN(const std::vector<size_t> parts, GridParts(e, regions));
  size_t best = 0;
  std::vector<std::string> split_dims;
  for (size_t d = 0; d < parts.size(); ++d) {
    if (parts[d] > parts[best]) best = d;
    if (parts[d] > 1) split_dims.push_back(absl::StrCat(parts[d]));
  }
  if (split_dims.size() == 1) {
    *description = absl::StrCat(parts[best], " parts along dim", best);
  } else {
    *description = absl::StrCat(absl::StrJoin(split_dims, " x "), " grid");
  }
  s.kind = Split::Kind::kDim;
  s.dim = static_cast<int>(best);
  return s;
}

Region PieceOf(const Split& split, const Shape& shape, int rank, int n) {
  switch (split.kind) {
    case Split::Kind::kReplicated:
      return FullBox(shape);
    case Split::Kind::kFlat: {
      auto [start, len] = EvenPart(Numel(shape), rank, n);
      return FlatRange{start, len};
    }
    case Split::Kind::kDim: {
      Box b = FullBox(shape);
      auto [start, len] = EvenPart(shape[split.dim], rank, n);
      b.offset[split.dim] = start;
      b.size[split.dim] = len;
      return b;
    }
  }
  return FullBox(shape);
}

std::optional<Region> EntryLayout::Piece(int r) const {
  if (object || partial) {
    if (static_cast<size_t>(r) < kept.size()) return kept[r];
    return std::nullopt;
  }
  return PieceOf(split, shape, r, ranks);
}

std::string EntryLayout::LayoutName() const {
  if (object) return "object";
  if (partial) return "partial";
  return split.ToString();
}

absl::StatusOr<EntryLayout> PlanEntry(const EntryRecord& e, int n,
                                      const OverrideRule* rule) {
  EntryLayout out;
  out.name = e.name;
  out.ranks = n;
  out.shape = e.shape;
  auto bad_rule = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "override ", EscapeText(rule->pattern), " -> ", rule->split.ToString(),
        " for entry '", EscapeText(e.name), "': ", why));
  };
  if (e.kind == format::EntryKind::kObject) {
    if (rule != nullptr)
      return bad_rule("it is an object (objects are copied as they are)");
    out.object = true;
    out.source = "object";
    out.kept = {FlatRange{0, e.shape[0]}};
    return out;
  }
  if (IsPartial(e)) {
    if (rule != nullptr) {
      return bad_rule(
          "it is partial (its chunks need not cover it) and is copied chunk by "
          "chunk");
    }
    if (e.chunks.size() > static_cast<size_t>(n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "entry '", EscapeText(e.name), "' is partial with ", e.chunks.size(),
          " chunks: its chunks are kept as stored, one per rank, "
          "so it needs --to >= ",
          e.chunks.size()));
    }
    out.partial = true;
    out.source = absl::StrCat(e.chunks.size(), " chunks (partial)");
    for (const auto& c : e.chunks) out.kept.push_back(c.region);
    return out;
  }
  if (rule != nullptr) {
    out.from_override = true;
    out.split = rule->split;
    if (out.split.kind == Split::Kind::kDim &&
        static_cast<size_t>(out.split.dim) >= e.shape.size()) {
      return bad_rule(absl::StrCat("the tensor has ", e.shape.size(),
                                   " dims (shape ", ShapeToString(e.shape),
                                   ")"));
    }
    std::string ignored;
    auto inferred = InferSplit(e, &ignored);
    out.source = inferred.ok() ? ignored : "irregular";
  } else {
    auto inferred = InferSplit(e, &out.source);
    if (!inferred.ok()) return inferred.status();
    out.split = *inferred;
  }
  out.replica = out.split.kind == Split::Kind::kReplicated;
  return out;
}

std::string QuotedForMessage(absl::string_view s) {
  std::string out = internal::JsonStringLiteral(s.substr(0, 80));
  if (s.size() > 80) out.insert(out.size() - 1, "...");
  return out;
}

std::string Split::ToString() const {
  switch (kind) {
    case Kind::kDim:
      return absl::StrCat("dim", dim);
    case Kind::kFlat:
      return "flat";
    case Kind::kReplicated:
      return "replicated";
  }
  return "?";
}

absl::StatusOr<Split> ParseSplit(absl::string_view text) {
  Split s;
  if (text == "flat") {
    s.kind = Split::Kind::kFlat;
    return s;
  }
  if (text == "replicated") {
    s.kind = Split::Kind::kReplicated;
    return s;
  }
  if (absl::StartsWith(text, "dim")) {
    absl::string_view digits = text.substr(3);
    int dim = 0;
    const bool canonical =
        !digits.empty() && digits.size() <= 2 &&
        absl::ascii_isdigit(digits[0]) &&
        (digits.size() == 1 ||
         (digits[0] != '0' && absl::ascii_isdigit(digits[1])));
    if (canonical && absl::SimpleAtoi(digits, &dim) &&
        dim < static_cast<int>(format::kMaxDims)) {
      s.kind = Split::Kind::kDim;
      s.dim = dim;
      return s;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "split: expected ", kSplitForms, ", got ", QuotedForMessage(text)));
}

bool OverrideRule::is_glob() const {
  return pattern.find_first_of("*?") != std::string::npos;
}

absl::StatusOr<const OverrideRule*> Overrides::Find(
    absl::string_view name) const {
  const OverrideRule* found = nullptr;
  std::vector<std::string> globs;
  for (const OverrideRule& r : rules) {
    if (r.pattern == name) return &r;
    if (r.is_glob() && GlobMatch(r.pattern, name)) {
      if (found == nullptr) found = &r;
      globs.push_back(QuotedForMessage(r.pattern));
    }
  }
  if (globs.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "entry '", EscapeText(name), "' matches several patterns: ",
        absl::StrJoin(globs, ", "), " (give it its own key)"));
  }
  return found;
}

bool GlobMatch(absl::string_view p, absl::string_view s) {
  // Greedy with one backtrack point (the last '*'): O(|p| * |s|).
  size_t pi = 0, si = 0, star = absl::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == s[si])) {
      ++pi;
      ++si;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (star != absl::string_view::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

}  // namespace ckpt::ops

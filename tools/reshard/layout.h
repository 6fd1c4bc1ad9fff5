// Layouts of ckpt-reshard: inferring how an entry is split from its stored
// chunks, and the piece each of the N output ranks holds.
//
// Inference (tools/README.md (ckpt-reshard)):
//  - a single chunk holding the whole tensor (or a tensor with no elements)
//    -> replicated: every rank's part is the whole tensor, written once;
//  - box chunks forming a regular grid split along one dim -> re-split
//    evenly along that dim; a grid split along several dims -> along the
//    dim with the most parts (ties: the lowest dim);
//  - flat ranges -> N contiguous flat ranges;
//  - anything else (irregular boxes, boxes mixed with flat ranges) cannot be
//    inferred: the override file must give the layout.
// Even splits give the first (n mod N) ranks one element (or index) more.
// Entries flagged partial keep their chunks as stored, chunk i on rank i.
#ifndef CKPT_TOOLS_RESHARD_LAYOUT_H_
#define CKPT_TOOLS_RESHARD_LAYOUT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/format/records.h"
#include "ckpt/types.h"
#include "reshard/overrides.h"

namespace ckpt::tools {

// The split inferred from `e`'s stored chunks, and a description of them
// ("4 parts along dim0", "2 x 2 grid", "3 flat ranges", "whole").
// REQUIRES: e is a tensor, not partial, with chunks that cover it exactly
// (as ckpt::Reader::Open checks). InvalidArgument naming the entry when no
// layout can be inferred.
absl::StatusOr<Split> InferSplit(const format::EntryRecord& e,
                                 std::string* description);

// Part `rank` of `n` of a tensor of `shape` split as `split`. Replicated
// gives the whole tensor. REQUIRES: a kDim split's dim < shape.size().
Region PieceOf(const Split& split, const Shape& shape, int rank, int n);

// What the output holds of one entry.
struct EntryLayout {
  std::string name;
  bool object = false;
  bool partial = false;  // chunks kept as stored
  Split split;           // tensors that are not partial
  bool from_override = false;
  std::string source;  // the stored layout, described
  bool replica = false;
  // What rank r of `ranks` registers (nullopt: nothing), computed on demand
  // so that a plan for N ranks does not hold N regions per entry.
  // Replicated tensors hold the whole tensor on every rank, as replicas
  // written once. REQUIRES: 0 <= r < ranks.
  std::optional<Region> Piece(int r) const;
  int ranks = 0;
  Shape shape;
  std::vector<Region> kept;  // objects and partial entries: piece r = kept[r]
  // "dim0", "flat", "replicated", "partial", "object".
  std::string LayoutName() const;
};

// Plans entry `e` for `n` ranks, using the rule `rule` (or nullptr: infer).
// InvalidArgument naming the entry for a layout that cannot be inferred,
// an override that does not fit (a dim the tensor lacks, an object, a
// partial entry), or a partial entry with more chunks than ranks.
absl::StatusOr<EntryLayout> PlanEntry(const format::EntryRecord& e, int n,
                                      const OverrideRule* rule);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RESHARD_LAYOUT_H_

// Layouts of Reshard (reshard.h): how an entry is split over the N ranks of
// the output, the override rules that say it for some entries (ckpt-reshard
// reads them from its --layout file, tools/reshard/overrides.h), inferring
// it from the stored chunks for the others, and the piece each rank holds.
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
#ifndef CKPT_OPS_RESHARD_LAYOUT_H_
#define CKPT_OPS_RESHARD_LAYOUT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/format/records.h"
#include "ckpt/types.h"

namespace ckpt::ops {

// How an entry is laid out over the N ranks of the output.
struct Split {
  enum class Kind { kDim, kFlat, kReplicated };
  Kind kind = Kind::kReplicated;
  int dim = 0;  // kDim only
  // "dim0", "flat", "replicated".
  std::string ToString() const;
  friend bool operator==(const Split& a, const Split& b) {
    return a.kind == b.kind && (a.kind != Kind::kDim || a.dim == b.dim);
  }
};

// The forms ParseSplit accepts, as messages name them.
inline constexpr char kSplitForms[] =
    "\"dim<k>\" (k < 32), \"flat\" or \"replicated\"";

// Parses "dim<k>" (k in [0, 32), no leading zeros), "flat" or
// "replicated". InvalidArgument naming the expected forms and `text`.
absl::StatusOr<Split> ParseSplit(absl::string_view text);

// An override: entries named `pattern` (or matching it, a glob) get `split`.
struct OverrideRule {
  std::string pattern;  // an entry name or a glob
  Split split;
  bool is_glob() const;
};

struct Overrides {
  std::vector<OverrideRule> rules;  // in file order, patterns unique

  // The rule for entry `name`, or nullptr: a rule whose key is `name`
  // itself, else the one glob that matches. InvalidArgument naming the
  // patterns if several globs match.
  absl::StatusOr<const OverrideRule*> Find(absl::string_view name) const;
};

// True iff `name` matches the glob `pattern` ('*' matches any run of
// characters, '?' one character; no escapes). Linear in |pattern| * |name|
// at worst.
bool GlobMatch(absl::string_view pattern, absl::string_view name);

// `s` in messages about override rules: a JSON string, ASCII only (as
// nlohmann::json's dump with ensure_ascii and invalid UTF-8 replaced by
// U+FFFD writes it), cut after 80 bytes ("...") so that a fuzzed megabyte
// key stays readable.
std::string QuotedForMessage(absl::string_view s);

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

}  // namespace ckpt::ops

#endif  // CKPT_OPS_RESHARD_LAYOUT_H_

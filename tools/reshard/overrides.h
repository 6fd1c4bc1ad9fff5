// The layout override file of ckpt-reshard: how to split entries whose
// layout cannot be inferred from the stored chunks (or should differ).
//
//   {"entries": {
//      "layers.0.w":  {"split": "dim1"},
//      "emb":         {"split": "flat"},
//      "norm":        {"split": "replicated"},
//      "layers.*.b":  {"split": "dim0"}
//   }}
//
// A key is an entry name or a glob pattern ('*' matches any run of
// characters, '?' one character). A key equal to an entry's name applies to
// it before any pattern; an entry that several patterns match is an error.
// The parser is strict (it is fuzzed): the document must be exactly this
// shape, with no other keys, no duplicate keys, and valid split values.
#ifndef CKPT_TOOLS_RESHARD_OVERRIDES_H_
#define CKPT_TOOLS_RESHARD_OVERRIDES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::tools {

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

// Parses "dim<k>" (k in [0, 32), no leading zeros), "flat" or
// "replicated". InvalidArgument naming the expected forms and `text`.
absl::StatusOr<Split> ParseSplit(absl::string_view text);

struct OverrideRule {
  std::string pattern;  // an entry name or a glob
  Split split;
  bool is_glob() const;
};

struct Overrides {
  std::vector<OverrideRule> rules;  // in file order, keys unique

  // The rule for entry `name`, or nullptr: a rule whose key is `name`
  // itself, else the one glob that matches. InvalidArgument naming the
  // patterns if several globs match.
  absl::StatusOr<const OverrideRule*> Find(absl::string_view name) const;
};

// Parses the text of an override file. Errors are InvalidArgument and say
// where and what: "line 3, column 9: syntax error ..." for malformed JSON,
// else the key path and the expected and actual value, e.g.
// "entries.\"emb\".split: expected \"dim<k>\", \"flat\" or \"replicated\",
// got \"dim\"". The caller adds the file name. Never throws.
absl::StatusOr<Overrides> ParseOverrides(absl::string_view text);

// True iff `name` matches the glob `pattern` ('*', '?'; no escapes).
// Linear in |pattern| * |name| at worst.
bool GlobMatch(absl::string_view pattern, absl::string_view name);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RESHARD_OVERRIDES_H_

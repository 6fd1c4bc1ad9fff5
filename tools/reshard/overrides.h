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

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/ops/reshard_layout.h"

namespace ckpt::tools {

// The rules are ops' (ckpt/ops/reshard_layout.h); this file is their text.
using ops::GlobMatch;
using ops::OverrideRule;
using ops::Overrides;
using ops::ParseSplit;
using ops::Split;

// Parses the text of an override file. Errors are InvalidArgument and say
// where and what: "line 3, column 9: syntax error ..." for malformed JSON,
// else the key path and the expected and actual value, e.g.
// "entries.\"emb\".split: expected \"dim<k>\", \"flat\" or \"replicated\",
// got \"dim\"". The caller adds the file name. Never throws.
absl::StatusOr<Overrides> ParseOverrides(absl::string_view text);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RESHARD_OVERRIDES_H_

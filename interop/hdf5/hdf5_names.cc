#include "ckpt/interop/hdf5/hdf5_names.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::interop::hdf5 {

absl::StatusOr<std::vector<std::string>> DatasetPaths(
    const std::vector<std::string>& names) {
  // Every path, and every group that some path lies in.
  std::vector<std::string> paths;
  paths.reserve(names.size());
  absl::flat_hash_set<std::string> seen, groups;
  for (const std::string& name : names) {
    CKPT_RETURN_IF_ERROR(format::ValidateEntryName(name));
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("entry name '", name, "' given twice"));
    }
    std::string path;
    bool first = true;
    for (absl::string_view part : absl::StrSplit(name, '.')) {
      if (!first) groups.insert(path);
      first = false;
      absl::StrAppend(&path, "/",
                      part.empty() ? absl::string_view(kEmptyLink) : part);
    }
    paths.push_back(std::move(path));
  }
  for (std::string& p : paths) {
    if (groups.contains(p)) absl::StrAppend(&p, "/", kSelfLink);
  }
  return paths;
}

absl::StatusOr<std::string> EntryNameOfPath(absl::string_view path) {
  std::vector<absl::string_view> links =
      absl::StrSplit(path, '/', absl::SkipEmpty());
  if (links.size() >= 2 && links.back() == kSelfLink) links.pop_back();
  std::vector<absl::string_view> parts;
  parts.reserve(links.size());
  // "" (not a default string_view): StrJoin copies from every part's data().
  for (absl::string_view l : links)
    parts.push_back(l == kEmptyLink ? absl::string_view("") : l);
  std::string name = absl::StrJoin(parts, ".");
  absl::Status s = format::ValidateEntryName(name);
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset '", format::EscapeText(path.substr(0, 200)),
                     "' has no valid entry name: ", s.message()));
  }
  return name;
}

}  // namespace ckpt::interop::hdf5

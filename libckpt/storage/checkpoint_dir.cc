#include "storage/checkpoint_dir.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::internal {

absl::StatusOr<bool> IsCheckpointDir(Storage* storage,
                                     const std::string& path) {
  auto st = storage->Stat(path);
  if (!st.ok()) {
    if (absl::IsNotFound(st.status())) {
      return absl::NotFoundError(
          absl::StrCat(path, ": no such checkpoint or checkpoint root"));
    }
    return st.status();
  }
  if (!st->is_dir) {
    return absl::NotFoundError(absl::StrCat(path, ": not a directory"));
  }
  auto manifest = storage->Stat(JoinPath(path, format::kManifestFileName));
  if (manifest.ok()) return true;
  // EIO, EACCES: as is, rather than guessing that this is a root.
  if (!absl::IsNotFound(manifest.status())) return manifest.status();
  return false;
}

absl::StatusOr<std::optional<std::string>> FollowLatest(
    Storage* storage, const std::string& root) {
  auto bytes = storage->ReadFile(JoinPath(root, format::kLatestFileName));
  if (!bytes.ok()) {
    if (absl::IsNotFound(bytes.status())) return std::nullopt;
    return bytes.status();
  }
  auto dir = format::DecodeLatest(*bytes);
  if (!dir.ok()) {
    absl::string_view why = dir.status().message();
    absl::ConsumePrefix(&why, "latest: ");
    return absl::DataLossError(absl::StrCat("broken pointer: ", why));
  }
  auto m =
      storage->Stat(JoinPath(JoinPath(root, *dir), format::kManifestFileName));
  if (!m.ok()) {
    if (!absl::IsNotFound(m.status())) return m.status();
    return absl::NotFoundError(absl::StrCat(
        "points to '", *dir, "', which is not a committed checkpoint"));
  }
  return std::optional<std::string>(*std::move(dir));
}

absl::Status NotACheckpoint(const std::string& path) {
  return absl::NotFoundError(absl::StrCat(
      path,
      ": not a checkpoint (no MANIFEST) nor a checkpoint root (no 'latest')"));
}

absl::StatusOr<RootListing> ListRoot(Storage* storage,
                                     const std::string& root) {
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, storage->List(root));
  RootListing out;
  for (const std::string& n : names) {
    uint64_t step;
    if (n == format::kLatestFileName) {
      out.has_latest = true;
    } else if (absl::StartsWith(n, format::kTempDirPrefix)) {
      out.temps.push_back(n);
    } else if (format::ParseStepDirName(n, &step) &&
               storage
                   ->Stat(
                       JoinPath(JoinPath(root, n), format::kManifestFileName))
                   .ok()) {
      out.committed.emplace_back(step, n);
    }
  }
  return out;
}

absl::StatusOr<std::string> ResolveCheckpointDir(Storage* storage,
                                                 const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(bool is_checkpoint, IsCheckpointDir(storage, path));
  if (is_checkpoint) return path;
  auto dir = FollowLatest(storage, path);
  if (!dir.ok()) {
    return Annotate(dir.status(), JoinPath(path, format::kLatestFileName));
  }
  if (!dir->has_value()) return NotACheckpoint(path);
  return JoinPath(path, **dir);
}

absl::Status EntryNotInCheckpoint(absl::string_view name,
                                  const std::string& dir) {
  return absl::NotFoundError(absl::StrCat("entry '", format::EscapeText(name),
                                          "' is not in the checkpoint ", dir));
}

absl::StatusOr<format::Manifest> ReadManifest(Storage* storage,
                                              const std::string& dir) {
  const std::string path = JoinPath(dir, format::kManifestFileName);
  CKPT_ASSIGN_OR_RETURN(std::string bytes, storage->ReadFile(path));
  return DecodeManifestFile(dir, bytes);
}

absl::StatusOr<format::Manifest> DecodeManifestFile(const std::string& dir,
                                                    absl::string_view bytes) {
  auto m = format::DecodeManifest(bytes);
  if (!m.ok()) {
    return Annotate(m.status(), JoinPath(dir, format::kManifestFileName));
  }
  return m;
}

}  // namespace ckpt::internal

// Internal to ckpt, shared by ckpt::Reader, the writer and the tools (not
// part of the installed API): which checkpoint directory a path names
// (spec/FORMAT.md §4, §4.2). One implementation, so that every program
// tells a root from a checkpoint directory the same way and reports the
// same messages.
#ifndef CKPT_LIBCKPT_STORAGE_CHECKPOINT_DIR_H_
#define CKPT_LIBCKPT_STORAGE_CHECKPOINT_DIR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/format/records.h"
#include "ckpt/storage.h"

namespace ckpt::internal {

// Whether the directory `path` is a checkpoint directory, i.e. holds a file
// named MANIFEST (§4); false means it is to be treated as a root. NotFound
// "PATH: no such checkpoint or checkpoint root" when `path` does not
// exist, NotFound "PATH: not a directory"; other storage errors as is.
absl::StatusOr<bool> IsCheckpointDir(Storage* storage, const std::string& path);

// The directory name that root/latest names (§4.2), or nullopt when there
// is no `latest` file. Errors name no file (the caller adds
// root/latest): DataLoss "broken pointer: WHY" when the pointer does not
// decode; NotFound "points to 'DIR', which is not a committed checkpoint"
// when DIR has no MANIFEST; other storage errors as is.
absl::StatusOr<std::optional<std::string>> FollowLatest(
    Storage* storage, const std::string& root);

// NotFound "PATH: not a checkpoint (no MANIFEST) nor a checkpoint root (no
// 'latest')".
absl::Status NotACheckpoint(const std::string& path);

// The names of a root that ckpt recognizes (§4). Other names are ignored.
struct RootListing {
  bool has_latest = false;
  // (step, directory name) of every step-* directory holding MANIFEST.
  std::vector<std::pair<uint64_t, std::string>> committed;
  std::vector<std::string> temps;  // names starting with ".tmp-"
};
absl::StatusOr<RootListing> ListRoot(Storage* storage, const std::string& root);

// A checkpoint directory is returned as is; a root is resolved through
// `latest`. NotFound naming `path` (or root/latest) when neither; the
// errors of IsCheckpointDir and FollowLatest, annotated with root/latest.
absl::StatusOr<std::string> ResolveCheckpointDir(Storage* storage,
                                                 const std::string& path);

// NotFound "entry 'NAME' is not in the checkpoint DIR" (the name shown
// through format::EscapeText).
absl::Status EntryNotInCheckpoint(absl::string_view name,
                                  const std::string& dir);

// Reads and decodes DIR/MANIFEST (§6.2). The storage's errors as they are;
// the decoder's (DataLoss, FailedPrecondition for a newer version) with
// their message prefixed by the manifest's path.
absl::StatusOr<format::Manifest> ReadManifest(Storage* storage,
                                              const std::string& dir);

// The decoding half of ReadManifest, on bytes read elsewhere (rank 0 of a
// cooperative open): the same errors.
absl::StatusOr<format::Manifest> DecodeManifestFile(const std::string& dir,
                                                    absl::string_view bytes);

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_STORAGE_CHECKPOINT_DIR_H_

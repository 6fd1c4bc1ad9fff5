#include "ckpt/storage.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "storage/posix_storage.h"

namespace ckpt {

absl::StatusOr<std::string> Storage::ReadFile(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                        Open(path, OpenMode::kRead));
  CKPT_ASSIGN_OR_RETURN(uint64_t size, file->Size());
  if (size > std::string().max_size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("read ", path, ": file of ", size, " bytes is too large"));
  }
  std::string out(static_cast<size_t>(size), '\0');
  CKPT_ASSIGN_OR_RETURN(size_t n, file->PRead(0, out.size(), out.data()));
  out.resize(n);  // the file shrank since Size()
  CKPT_RETURN_IF_ERROR(file->Close());
  return out;
}

absl::Status Storage::WriteFileAndSync(const std::string& path,
                                       absl::string_view data) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                        Open(path, OpenMode::kCreateNew));
  CKPT_RETURN_IF_ERROR(file->PWrite(0, data));
  CKPT_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

absl::StatusOr<std::unique_ptr<FileLock>> Storage::Lock(const std::string& path,
                                                        LockMode, bool) {
  return absl::UnimplementedError(
      absl::StrCat("lock ", path, ": this storage has no locks"));
}

StorageTraits Storage::traits(const std::string&) const {
  return StorageTraits();
}

namespace {

// A name for a temporary file beside `path`: "<dir>/.tmp-<base>-<random>".
std::string TempBeside(const std::string& path) {
  std::random_device rd;
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string base =
      slash == std::string::npos ? path : path.substr(slash + 1);
  return absl::StrCat(dir, ".tmp-", base, "-", absl::Hex(rd(), absl::kZeroPad8),
                      absl::Hex(rd(), absl::kZeroPad8));
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

absl::Status Storage::CreateExclusive(const std::string& path,
                                      absl::string_view data) {
  const std::string tmp = TempBeside(path);
  absl::Status s = WriteFileAndSync(tmp, data);
  if (s.ok()) s = RenameNoReplace(tmp, path);
  if (!s.ok()) {
    (void)RemoveFile(tmp);
    return s;
  }
  return SyncDir(DirOf(path));
}

absl::Status Storage::ReplaceFile(const std::string& path,
                                  absl::string_view data) {
  const std::string tmp = TempBeside(path);
  absl::Status s = WriteFileAndSync(tmp, data);
  if (s.ok()) s = Rename(tmp, path);
  if (!s.ok()) {
    (void)RemoveFile(tmp);
    return s;
  }
  return SyncDir(DirOf(path));
}

Storage* DefaultStorage() {
  // Leaked on purpose: usable from static destructors and other threads at
  // exit.
  static Storage* const storage = new internal::PosixStorage();
  return storage;
}

std::string JoinPath(absl::string_view a, absl::string_view b) {
  if (a.empty()) return std::string(b);
  if (a.back() == '/') return absl::StrCat(a, b);
  return absl::StrCat(a, "/", b);
}

}  // namespace ckpt

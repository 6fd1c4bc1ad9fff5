#include "ckpt/testing/fault_injection.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"

namespace ckpt {
namespace {

size_t Index(StorageOp op) { return static_cast<size_t>(op); }

absl::Status NonOk(absl::Status error) {
  if (error.ok()) return absl::InternalError("injected fault");
  return error;
}

}  // namespace

const char* StorageOpName(StorageOp op) {
  switch (op) {
    case StorageOp::kOpen:
      return "open";
    case StorageOp::kRead:
      return "read";
    case StorageOp::kWrite:
      return "write";
    case StorageOp::kSync:
      return "sync";
    case StorageOp::kClose:
      return "close";
    case StorageOp::kCreateDir:
      return "create_dir";
    case StorageOp::kSyncDir:
      return "sync_dir";
    case StorageOp::kRename:
      return "rename";
    case StorageOp::kList:
      return "list";
    case StorageOp::kStat:
      return "stat";
    case StorageOp::kRemove:
      return "remove";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& os, StorageOp op) {
  return os << StorageOpName(op);
}

// Wraps a File of the base storage so that its calls go through Check().
class FaultInjectingStorage::FaultFile final : public File {
 public:
  FaultFile(FaultInjectingStorage* owner, std::unique_ptr<File> base)
      : owner_(owner), base_(std::move(base)) {}

  absl::StatusOr<size_t> PRead(uint64_t offset, size_t n, char* dst) override {
    Decision d = owner_->Check(StorageOp::kRead, false, What("pread"), path());
    if (!d.error.ok()) return d.error;
    if (d.short_read) n = std::min(n, d.bytes);
    CKPT_ASSIGN_OR_RETURN(size_t got, base_->PRead(offset, n, dst));
    if (d.corrupt_read && got > 0)
      dst[d.bytes % got] ^= static_cast<char>(1 << (d.bit % 8));
    return got;
  }

  absl::Status PWrite(uint64_t offset, absl::string_view data) override {
    Decision d = owner_->Check(StorageOp::kWrite, true, What("pwrite"), path());
    if (d.error.ok()) return base_->PWrite(offset, data);
    if (d.short_write) {
      const size_t n = std::min(d.bytes, data.size());
      if (n > 0) CKPT_RETURN_IF_ERROR(base_->PWrite(offset, data.substr(0, n)));
    }
    return d.error;
  }

  absl::Status Sync() override {
    CKPT_RETURN_IF_ERROR(
        owner_->CheckStatus(StorageOp::kSync, true, What("fsync"), path()));
    return base_->Sync();
  }

  absl::StatusOr<uint64_t> Size() override {
    CKPT_RETURN_IF_ERROR(
        owner_->CheckStatus(StorageOp::kStat, false, What("fstat"), path()));
    return base_->Size();
  }

  absl::Status Close() override {
    CKPT_RETURN_IF_ERROR(
        owner_->CheckStatus(StorageOp::kClose, false, What("close"), path()));
    return base_->Close();
  }

  const std::string& path() const override { return base_->path(); }

 private:
  std::string What(absl::string_view op) const {
    return absl::StrCat(op, " ", path());
  }

  FaultInjectingStorage* const owner_;
  const std::unique_ptr<File> base_;
};

FaultInjectingStorage::FaultInjectingStorage(Storage* base) : base_(base) {}
FaultInjectingStorage::~FaultInjectingStorage() = default;

void FaultInjectingStorage::AddRule(Rule rule) {
  MutexLock lock(&mu_);
  rules_.push_back(std::move(rule));
}

void FaultInjectingStorage::FailAt(StorageOp op, int64_t nth,
                                   absl::Status error) {
  AddRule({RuleKind::kFail, op, nth, NonOk(std::move(error))});
}

void FaultInjectingStorage::ShortWriteAt(int64_t nth_write,
                                         size_t bytes_written,
                                         absl::Status error) {
  AddRule({RuleKind::kShortWrite, StorageOp::kWrite, nth_write,
           NonOk(std::move(error)), bytes_written});
}

void FaultInjectingStorage::ShortReadAt(int64_t nth_read, size_t bytes_read) {
  AddRule({RuleKind::kShortRead, StorageOp::kRead, nth_read, absl::OkStatus(),
           bytes_read});
}

void FaultInjectingStorage::CorruptReadAt(int64_t nth_read, uint64_t byte,
                                          int bit) {
  AddRule({RuleKind::kCorruptRead, StorageOp::kRead, nth_read, absl::OkStatus(),
           static_cast<size_t>(byte), bit});
}

void FaultInjectingStorage::FailAllAfter(StorageOp op, int64_t nth,
                                         absl::Status error) {
  AddRule({RuleKind::kFailAllAfter, op, nth, NonOk(std::move(error))});
}

void FaultInjectingStorage::CrashAt(StorageOp op, int64_t nth) {
  AddRule(
      {RuleKind::kCrash, op, nth, absl::UnavailableError("injected crash")});
}

void FaultInjectingStorage::OnlyPathsContaining(std::string substr) {
  MutexLock lock(&mu_);
  path_filter_ = std::move(substr);
}

void FaultInjectingStorage::Reset() {
  MutexLock lock(&mu_);
  counts_ = {};
  matched_ = {};
  rules_.clear();
  path_filter_.clear();
  crashed_ = false;
  failing_ = absl::OkStatus();
  injected_ = 0;
}

int64_t FaultInjectingStorage::count(StorageOp op) const {
  MutexLock lock(&mu_);
  return counts_[Index(op)];
}

int64_t FaultInjectingStorage::injected() const {
  MutexLock lock(&mu_);
  return injected_;
}

FaultInjectingStorage::Decision FaultInjectingStorage::Check(
    StorageOp op, bool mutating, absl::string_view what, absl::string_view path,
    absl::string_view path2) {
  const std::string prefix = absl::StrCat("injected fault: ", what);
  MutexLock lock(&mu_);
  ++counts_[Index(op)];
  const bool matches =
      path_filter_.empty() || absl::StrContains(path, path_filter_) ||
      (!path2.empty() && absl::StrContains(path2, path_filter_));
  // Numbered before the crash / failing state is applied, so that a rule's
  // number does not depend on whether earlier rules fired.
  const int64_t n = matches ? ++matched_[Index(op)] : 0;

  Decision d;
  if (crashed_) {
    ++injected_;
    d.error = Annotate(absl::UnavailableError("injected crash"), prefix);
    return d;
  }
  if (mutating && !failing_.ok()) {
    ++injected_;
    d.error = Annotate(failing_, prefix);
    return d;
  }
  if (!matches) return d;
  for (const Rule& rule : rules_) {
    if (rule.op != op || rule.nth != n) continue;
    ++injected_;
    if (rule.kind == RuleKind::kShortRead ||
        rule.kind == RuleKind::kCorruptRead) {
      // The call succeeds, with fewer or other bytes.
      d.short_read = rule.kind == RuleKind::kShortRead;
      d.corrupt_read = rule.kind == RuleKind::kCorruptRead;
      d.bytes = rule.bytes;
      d.bit = rule.bit;
      return d;
    }
    d.error = Annotate(rule.error, prefix);
    switch (rule.kind) {
      case RuleKind::kFail:
        break;
      case RuleKind::kShortWrite:
        d.short_write = true;
        d.bytes = rule.bytes;
        break;
      case RuleKind::kFailAllAfter:
        failing_ = rule.error;
        break;
      case RuleKind::kCrash:
        crashed_ = true;
        break;
      case RuleKind::kShortRead:
      case RuleKind::kCorruptRead:
        break;
    }
    return d;
  }
  return d;
}

absl::Status FaultInjectingStorage::CheckStatus(StorageOp op, bool mutating,
                                                absl::string_view what,
                                                absl::string_view path,
                                                absl::string_view path2) {
  return Check(op, mutating, what, path, path2).error;
}

absl::StatusOr<std::unique_ptr<File>> FaultInjectingStorage::Open(
    const std::string& path, OpenMode mode, const OpenOptions& options) {
  CKPT_RETURN_IF_ERROR(CheckStatus(StorageOp::kOpen, mode != OpenMode::kRead,
                                   absl::StrCat("open ", path), path));
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                        base_->Open(path, mode, options));
  return std::unique_ptr<File>(new FaultFile(this, std::move(file)));
}

absl::Status FaultInjectingStorage::CreateExclusive(const std::string& path,
                                                    absl::string_view data) {
  if (base_->traits(path).atomic_rename) {
    return Storage::CreateExclusive(path, data);
  }
  CKPT_RETURN_IF_ERROR(
      CheckStatus(StorageOp::kOpen, true, absl::StrCat("create ", path), path));
  return base_->CreateExclusive(path, data);
}

absl::Status FaultInjectingStorage::ReplaceFile(const std::string& path,
                                                absl::string_view data) {
  if (base_->traits(path).atomic_rename) {
    return Storage::ReplaceFile(path, data);
  }
  CKPT_RETURN_IF_ERROR(CheckStatus(StorageOp::kOpen, true,
                                   absl::StrCat("replace ", path), path));
  return base_->ReplaceFile(path, data);
}

absl::Status FaultInjectingStorage::CreateDir(const std::string& path) {
  CKPT_RETURN_IF_ERROR(CheckStatus(StorageOp::kCreateDir, true,
                                   absl::StrCat("mkdir ", path), path));
  return base_->CreateDir(path);
}

absl::Status FaultInjectingStorage::SyncDir(const std::string& path) {
  CKPT_RETURN_IF_ERROR(CheckStatus(StorageOp::kSyncDir, true,
                                   absl::StrCat("fsync ", path), path));
  return base_->SyncDir(path);
}

absl::Status FaultInjectingStorage::Rename(const std::string& from,
                                           const std::string& to) {
  CKPT_RETURN_IF_ERROR(CheckStatus(StorageOp::kRename, true,
                                   absl::StrCat("rename ", from, " to ", to),
                                   from, to));
  return base_->Rename(from, to);
}

absl::Status FaultInjectingStorage::RenameNoReplace(const std::string& from,
                                                    const std::string& to) {
  CKPT_RETURN_IF_ERROR(CheckStatus(StorageOp::kRename, true,
                                   absl::StrCat("rename ", from, " to ", to),
                                   from, to));
  return base_->RenameNoReplace(from, to);
}

absl::StatusOr<std::vector<std::string>> FaultInjectingStorage::List(
    const std::string& dir) {
  CKPT_RETURN_IF_ERROR(
      CheckStatus(StorageOp::kList, false, absl::StrCat("opendir ", dir), dir));
  return base_->List(dir);
}

absl::StatusOr<FileInfo> FaultInjectingStorage::Stat(const std::string& path) {
  CKPT_RETURN_IF_ERROR(
      CheckStatus(StorageOp::kStat, false, absl::StrCat("stat ", path), path));
  return base_->Stat(path);
}

absl::Status FaultInjectingStorage::RemoveFile(const std::string& path) {
  CKPT_RETURN_IF_ERROR(CheckStatus(StorageOp::kRemove, true,
                                   absl::StrCat("unlink ", path), path));
  return base_->RemoveFile(path);
}

absl::Status FaultInjectingStorage::RemoveAll(const std::string& path) {
  CKPT_RETURN_IF_ERROR(CheckStatus(StorageOp::kRemove, true,
                                   absl::StrCat("remove_all ", path), path));
  return base_->RemoveAll(path);
}

}  // namespace ckpt

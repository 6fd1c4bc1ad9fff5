#include "ckpt/testing/power_loss.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ckpt/format/status_macros.h"

namespace ckpt {

// A file or directory. Volatile state is what running processes see;
// durable state is what the disk holds.
struct PowerLossStorage::Node {
  bool is_dir = false;
  std::string data, durable_data;                   // files
  std::map<std::string, NodePtr> entries, durable;  // directories
};

namespace {

absl::Status NoEntry(const std::string& what) {
  return absl::NotFoundError(absl::StrCat(what, ": No such file or directory"));
}

std::vector<std::string> Components(const std::string& path) {
  std::vector<std::string> out;
  for (absl::string_view c : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (c != ".") out.emplace_back(c);
  }
  return out;
}

}  // namespace

// A file handle: reads and writes the node's volatile bytes.
class PowerLossStorage::MemFile final : public File {
 public:
  MemFile(PowerLossStorage* owner, NodePtr node, std::string path,
          bool writable, uint64_t epoch)
      : owner_(owner),
        node_(std::move(node)),
        path_(std::move(path)),
        writable_(writable),
        epoch_(epoch) {}

  absl::StatusOr<size_t> PRead(uint64_t offset, size_t n, char* dst) override {
    MutexLock l(&owner_->mu_);
    CKPT_RETURN_IF_ERROR(Check("pread"));
    const std::string& d = node_->data;
    if (offset >= d.size()) return size_t{0};
    n = std::min<uint64_t>(n, d.size() - offset);
    std::memcpy(dst, d.data() + offset, n);
    return n;
  }

  absl::Status PWrite(uint64_t offset, absl::string_view data) override {
    MutexLock l(&owner_->mu_);
    CKPT_RETURN_IF_ERROR(Check("pwrite"));
    if (!writable_) {
      return absl::PermissionDeniedError(
          absl::StrCat("pwrite ", path_, ": read-only file"));
    }
    std::string& d = node_->data;
    if (d.size() < offset + data.size()) d.resize(offset + data.size(), '\0');
    d.replace(offset, data.size(), data.data(), data.size());
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    MutexLock l(&owner_->mu_);
    CKPT_RETURN_IF_ERROR(Check("fsync"));
    node_->durable_data = node_->data;
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Size() override {
    MutexLock l(&owner_->mu_);
    CKPT_RETURN_IF_ERROR(Check("fstat"));
    return node_->data.size();
  }

  absl::Status Close() override {
    MutexLock l(&owner_->mu_);
    if (closed_) return absl::OkStatus();
    closed_ = true;
    return owner_->Enter(absl::StrCat("close ", path_));
  }

  const std::string& path() const override { return path_; }

 private:
  // Counts the call and fails it when halted, closed or stale.
  absl::Status Check(absl::string_view op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(owner_->mu_) {
    const std::string what = absl::StrCat(op, " ", path_);
    if (closed_)
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": file is closed"));
    CKPT_RETURN_IF_ERROR(owner_->Enter(what));
    if (epoch_ != owner_->epoch_) {
      return absl::UnavailableError(
          absl::StrCat(what, ": opened before a power loss"));
    }
    return absl::OkStatus();
  }

  PowerLossStorage* const owner_;
  const NodePtr node_;
  const std::string path_;
  const bool writable_;
  const uint64_t epoch_;
  bool closed_ = false;
};

PowerLossStorage::PowerLossStorage() : root_(std::make_shared<Node>()) {
  root_->is_dir = true;
}

PowerLossStorage::~PowerLossStorage() = default;

std::unique_ptr<PowerLossStorage> PowerLossStorage::Fork() const {
  MutexLock l(&mu_);
  // Deep copy that keeps sharing: a node reachable twice (a rename made
  // durable in one directory only) stays one node.
  std::unordered_map<const Node*, NodePtr> copies;
  for (const NodePtr& n : AllNodes())
    copies[n.get()] = std::make_shared<Node>(*n);
  auto map = [&](const NodePtr& n) { return n ? copies.at(n.get()) : nullptr; };
  for (auto& [old, copy] : copies) {
    for (auto& [name, child] : copy->entries) child = map(child);
    for (auto& [name, child] : copy->durable) child = map(child);
  }
  auto fork = std::make_unique<PowerLossStorage>();
  MutexLock fl(&fork->mu_);
  fork->root_ = map(root_);
  for (const DirOp& op : pending_) {
    DirOp c = op;
    for (Change& ch : c) {
      ch.dir = map(ch.dir);
      ch.target = map(ch.target);
    }
    fork->pending_.push_back(std::move(c));
  }
  return fork;
}

void PowerLossStorage::HaltAtCall(int64_t nth) {
  MutexLock l(&mu_);
  halt_at_ = calls_ + std::max<int64_t>(nth, 1);
}

void PowerLossStorage::PowerCut(size_t keep_pending) {
  MutexLock l(&mu_);
  std::vector<bool> keep(pending_.size(), false);
  for (size_t i = 0; i < keep.size() && i < keep_pending; ++i) keep[i] = true;
  CutLocked(keep);
}

void PowerLossStorage::PowerCutKeepingOnly(size_t index) {
  MutexLock l(&mu_);
  std::vector<bool> keep(pending_.size(), false);
  if (index < keep.size()) keep[index] = true;
  CutLocked(keep);
}

void PowerLossStorage::CutLocked(const std::vector<bool>& keep) {
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (!keep[i]) continue;
    for (const Change& c : pending_[i]) {
      if (c.target) {
        c.dir->durable[c.name] = c.target;
      } else {
        c.dir->durable.erase(c.name);
      }
    }
  }
  pending_.clear();
  for (const NodePtr& n : AllNodes()) {
    n->data = n->durable_data;
    n->entries = n->durable;
  }
  ++epoch_;
  halted_ = false;
  halt_at_ = 0;
}

size_t PowerLossStorage::pending_dir_ops() const {
  MutexLock l(&mu_);
  return pending_.size();
}

int64_t PowerLossStorage::calls() const {
  MutexLock l(&mu_);
  return calls_;
}

absl::Status PowerLossStorage::Enter(const std::string& what) {
  ++calls_;
  if (halt_at_ != 0 && calls_ >= halt_at_) halted_ = true;
  if (halted_)
    return absl::UnavailableError(absl::StrCat(what, ": power lost"));
  return absl::OkStatus();
}

absl::StatusOr<PowerLossStorage::NodePtr> PowerLossStorage::Lookup(
    const std::string& path, const std::string& what) const {
  NodePtr n = root_;
  for (const std::string& c : Components(path)) {
    if (!n->is_dir) {
      return absl::InternalError(absl::StrCat(what, ": Not a directory"));
    }
    auto it = n->entries.find(c);
    if (it == n->entries.end()) return NoEntry(what);
    n = it->second;
  }
  return n;
}

absl::StatusOr<std::pair<PowerLossStorage::NodePtr, std::string>>
PowerLossStorage::Parent(const std::string& path,
                         const std::string& what) const {
  std::vector<std::string> parts = Components(path);
  if (parts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the root has no parent"));
  }
  NodePtr n = root_;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    auto it = n->entries.find(parts[i]);
    if (it == n->entries.end()) return NoEntry(what);
    n = it->second;
    if (!n->is_dir)
      return absl::InternalError(absl::StrCat(what, ": Not a directory"));
  }
  return std::make_pair(n, parts.back());
}

void PowerLossStorage::Apply(DirOp op) {
  for (const Change& c : op) {
    if (c.target) {
      c.dir->entries[c.name] = c.target;
    } else {
      c.dir->entries.erase(c.name);
    }
  }
  pending_.push_back(std::move(op));
}

std::vector<PowerLossStorage::NodePtr> PowerLossStorage::AllNodes() const {
  std::vector<NodePtr> out = {root_};
  std::unordered_set<const Node*> seen = {root_.get()};
  // Pending operations may refer to directories no longer reachable (the
  // changes inside a removed directory).
  for (const DirOp& op : pending_) {
    for (const Change& c : op) {
      for (const NodePtr& n : {c.dir, c.target}) {
        if (n && seen.insert(n.get()).second) out.push_back(n);
      }
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const NodePtr n = out[i];  // out grows below
    for (const auto* m : {&n->entries, &n->durable}) {
      for (const auto& [name, child] : *m) {
        if (seen.insert(child.get()).second) out.push_back(child);
      }
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<File>> PowerLossStorage::Open(
    const std::string& path, OpenMode mode, const OpenOptions&) {
  MutexLock l(&mu_);
  const std::string what = absl::StrCat("open ", path);
  CKPT_RETURN_IF_ERROR(Enter(what));
  NodePtr node;
  if (mode == OpenMode::kCreateNew) {
    auto parent = Parent(path, what);
    if (!parent.ok()) return parent.status();
    auto& [dir, name] = *parent;
    if (dir->entries.count(name)) {
      return absl::AlreadyExistsError(absl::StrCat(what, ": File exists"));
    }
    node = std::make_shared<Node>();
    Apply({Change{dir, name, node}});
  } else {
    auto found = Lookup(path, what);
    if (!found.ok()) return found.status();
    node = *found;
    if (node->is_dir)
      return absl::InternalError(absl::StrCat(what, ": Is a directory"));
  }
  return std::unique_ptr<File>(
      new MemFile(this, node, path, mode != OpenMode::kRead, epoch_));
}

absl::Status PowerLossStorage::CreateDir(const std::string& path) {
  MutexLock l(&mu_);
  const std::string what = absl::StrCat("mkdir ", path);
  CKPT_RETURN_IF_ERROR(Enter(what));
  CKPT_ASSIGN_OR_RETURN(auto parent, Parent(path, what));
  auto& [dir, name] = parent;
  if (dir->entries.count(name)) {
    return absl::AlreadyExistsError(absl::StrCat(what, ": File exists"));
  }
  auto node = std::make_shared<Node>();
  node->is_dir = true;
  Apply({Change{dir, name, node}});
  return absl::OkStatus();
}

absl::Status PowerLossStorage::SyncDir(const std::string& path) {
  MutexLock l(&mu_);
  const std::string what = absl::StrCat("fsync ", path);
  CKPT_RETURN_IF_ERROR(Enter(what));
  CKPT_ASSIGN_OR_RETURN(NodePtr dir, Lookup(path, what));
  if (!dir->is_dir)
    return absl::InternalError(absl::StrCat(what, ": Not a directory"));
  dir->durable = dir->entries;
  // What was pending in `dir` is durable now; changes elsewhere stay.
  for (DirOp& op : pending_) {
    op.erase(std::remove_if(op.begin(), op.end(),
                            [&](const Change& c) { return c.dir == dir; }),
             op.end());
  }
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [](const DirOp& op) { return op.empty(); }),
                 pending_.end());
  return absl::OkStatus();
}

absl::Status PowerLossStorage::RenameLocked(const std::string& from,
                                            const std::string& to,
                                            bool replace) {
  const std::string what = absl::StrCat("rename ", from, " to ", to);
  CKPT_RETURN_IF_ERROR(Enter(what));
  CKPT_ASSIGN_OR_RETURN(auto src, Parent(from, what));
  CKPT_ASSIGN_OR_RETURN(auto dst, Parent(to, what));
  auto it = src.first->entries.find(src.second);
  if (it == src.first->entries.end()) return NoEntry(what);
  NodePtr node = it->second;
  auto existing = dst.first->entries.find(dst.second);
  if (existing != dst.first->entries.end()) {
    if (existing->second == node) return absl::OkStatus();
    const Node& old = *existing->second;
    if (!replace || (old.is_dir && !old.entries.empty())) {
      return absl::AlreadyExistsError(absl::StrCat(what, ": File exists"));
    }
    if (old.is_dir != node->is_dir) {
      return absl::InternalError(absl::StrCat(
          what, old.is_dir ? ": Is a directory" : ": Not a directory"));
    }
  }
  // One journal transaction: the new name and the removal of the old one.
  Apply({Change{dst.first, dst.second, node},
         Change{src.first, src.second, nullptr}});
  return absl::OkStatus();
}

absl::Status PowerLossStorage::Rename(const std::string& from,
                                      const std::string& to) {
  MutexLock l(&mu_);
  return RenameLocked(from, to, /*replace=*/true);
}

absl::Status PowerLossStorage::RenameNoReplace(const std::string& from,
                                               const std::string& to) {
  MutexLock l(&mu_);
  return RenameLocked(from, to, /*replace=*/false);
}

absl::StatusOr<std::vector<std::string>> PowerLossStorage::List(
    const std::string& dir) {
  MutexLock l(&mu_);
  const std::string what = absl::StrCat("opendir ", dir);
  CKPT_RETURN_IF_ERROR(Enter(what));
  CKPT_ASSIGN_OR_RETURN(NodePtr node, Lookup(dir, what));
  if (!node->is_dir)
    return absl::InternalError(absl::StrCat(what, ": Not a directory"));
  std::vector<std::string> names;
  for (const auto& [name, child] : node->entries) names.push_back(name);
  return names;  // std::map: sorted
}

absl::StatusOr<FileInfo> PowerLossStorage::Stat(const std::string& path) {
  MutexLock l(&mu_);
  const std::string what = absl::StrCat("stat ", path);
  CKPT_RETURN_IF_ERROR(Enter(what));
  CKPT_ASSIGN_OR_RETURN(NodePtr node, Lookup(path, what));
  FileInfo info;
  info.is_dir = node->is_dir;
  info.size = node->is_dir ? 0 : node->data.size();
  return info;
}

absl::Status PowerLossStorage::RemoveFile(const std::string& path) {
  MutexLock l(&mu_);
  const std::string what = absl::StrCat("unlink ", path);
  CKPT_RETURN_IF_ERROR(Enter(what));
  CKPT_ASSIGN_OR_RETURN(auto parent, Parent(path, what));
  auto it = parent.first->entries.find(parent.second);
  if (it == parent.first->entries.end()) return NoEntry(what);
  if (it->second->is_dir)
    return absl::InternalError(absl::StrCat(what, ": Is a directory"));
  Apply({Change{parent.first, parent.second, nullptr}});
  return absl::OkStatus();
}

absl::Status PowerLossStorage::RemoveAll(const std::string& path) {
  MutexLock l(&mu_);
  const std::string what = absl::StrCat("remove_all ", path);
  CKPT_RETURN_IF_ERROR(Enter(what));
  CKPT_ASSIGN_OR_RETURN(auto parent, Parent(path, what));
  auto it = parent.first->entries.find(parent.second);
  if (it == parent.first->entries.end()) return absl::OkStatus();
  // Depth first, one unlink per name, as a recursive removal makes them:
  // a power loss may keep any prefix of them.
  std::vector<std::pair<NodePtr, std::string>> order;
  std::vector<std::pair<NodePtr, std::string>> stack = {
      {parent.first, parent.second}};
  while (!stack.empty()) {
    auto [dir, name] = stack.back();
    stack.pop_back();
    order.emplace_back(dir, name);
    const NodePtr& child = dir->entries.at(name);
    for (const auto& [n, c] : child->entries) stack.emplace_back(child, n);
  }
  for (auto r = order.rbegin(); r != order.rend(); ++r) {
    Apply({Change{r->first, r->second, nullptr}});
  }
  return absl::OkStatus();
}

}  // namespace ckpt

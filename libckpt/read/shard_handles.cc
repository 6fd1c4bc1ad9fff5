#include "read/shard_handles.h"

#include <utility>

#include "ckpt/format/status_macros.h"

namespace ckpt::internal {

ShardHandles::Lease& ShardHandles::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    Reset();
    owner_ = std::exchange(o.owner_, nullptr);
    id_ = o.id_;
    file_ = std::exchange(o.file_, nullptr);
  }
  return *this;
}

void ShardHandles::Lease::Reset() {
  if (owner_ != nullptr) owner_->Release(id_);
  owner_ = nullptr;
  file_ = nullptr;
}

ShardHandles::Slot::~Slot() {
  if (owner_ != nullptr) owner_->FreeSlot();
}

void ShardHandles::Slot::Fill(uint32_t id, std::unique_ptr<File> file) {
  ShardHandles* owner = std::exchange(owner_, nullptr);
  MutexLock l(&owner->mu_);
  owner->InsertLocked(id, std::move(file), 0);
}

ShardHandles::Slot ShardHandles::Reserve() {
  MutexLock l(&mu_);
  ReserveLocked();
  return Slot(this);
}

absl::StatusOr<ShardHandles::Lease> ShardHandles::Get(
    uint32_t id,
    const std::function<absl::StatusOr<std::unique_ptr<File>>()>& open) {
  {
    MutexLock l(&mu_);
    auto it = files_.find(id);
    if (it != files_.end()) {
      Entry& e = it->second;
      if (e.users++ == 0) idle_.erase(e.idle);
      return Lease(this, id, e.file.get());
    }
    ReserveLocked();
  }
  Slot slot(this);
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> file, open());
  slot.owner_ = nullptr;  // becomes the entry (or is freed) below
  MutexLock l(&mu_);
  return Lease(this, id, InsertLocked(id, std::move(file), 1));
}

int ShardHandles::InUse() const {
  MutexLock l(&mu_);
  return used_;
}

void ShardHandles::ReserveLocked() {
  while (used_ >= capacity_) {
    if (idle_.empty()) {
      freed_.Wait(&mu_);
      continue;
    }
    files_.erase(idle_.back());  // closes the least recently used idle file
    idle_.pop_back();
    --used_;
  }
  ++used_;
}

File* ShardHandles::InsertLocked(uint32_t id, std::unique_ptr<File> file,
                                 int users) {
  auto [it, inserted] = files_.try_emplace(id);
  Entry& e = it->second;
  if (inserted) {
    e.file = std::move(file);
  } else {  // another thread cached one meanwhile: ours goes, with its slot
    --used_;
    freed_.SignalAll();
    if (e.users == 0 && users > 0) idle_.erase(e.idle);
    e.users += users;
    return e.file.get();
  }
  e.users = users;
  if (users == 0) {
    idle_.push_front(id);
    e.idle = idle_.begin();
    freed_.SignalAll();
  }
  return e.file.get();
}

void ShardHandles::Release(uint32_t id) {
  MutexLock l(&mu_);
  Entry& e = files_.at(id);
  if (--e.users != 0) return;
  idle_.push_front(id);
  e.idle = idle_.begin();
  freed_.SignalAll();
}

void ShardHandles::FreeSlot() {
  MutexLock l(&mu_);
  --used_;
  freed_.SignalAll();
}

}  // namespace ckpt::internal

// Internal to libckpt: the shard file handles a Reader keeps open, at most
// ReaderOptions::max_open_files of them at once (a checkpoint of 16384
// shards loaded on few ranks must not hold a descriptor per shard).
#ifndef CKPT_LIBCKPT_READ_SHARD_HANDLES_H_
#define CKPT_LIBCKPT_READ_SHARD_HANDLES_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "ckpt/storage.h"
#include "util/mutex.h"

namespace ckpt::internal {

// Open files by shard id, `capacity` at most, counting the files being
// opened and those in use. A file in use (a Lease alive) is never closed;
// when every slot is taken, the least recently used idle file is closed,
// and with none idle the caller waits for one. A thread must hold at most
// one slot (a Lease or a Slot) at a time, or it may wait forever.
// Thread-safe.
class ShardHandles {
 public:
  explicit ShardHandles(int capacity) : capacity_(capacity) {}
  ShardHandles(const ShardHandles&) = delete;
  ShardHandles& operator=(const ShardHandles&) = delete;

  // The use of shard `id`'s file; releases it on destruction. Move-only.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept { *this = std::move(o); }
    Lease& operator=(Lease&& o) noexcept;
    ~Lease() { Reset(); }
    File& file() const { return *file_; }

   private:
    friend class ShardHandles;
    Lease(ShardHandles* owner, uint32_t id, File* file)
        : owner_(owner), id_(id), file_(file) {}
    void Reset();
    ShardHandles* owner_ = nullptr;
    uint32_t id_ = 0;
    File* file_ = nullptr;
  };

  // A slot for a file about to be opened: Fill puts the file in the cache
  // (idle), destruction without Fill frees the slot. Move-only.
  class Slot {
   public:
    Slot(Slot&& o) noexcept : owner_(o.owner_) { o.owner_ = nullptr; }
    Slot& operator=(Slot&&) = delete;
    ~Slot();
    // Caches `file` as shard `id`'s (closes it if another thread cached
    // one for `id` meanwhile) and frees the slot.
    void Fill(uint32_t id, std::unique_ptr<File> file);

   private:
    friend class ShardHandles;
    explicit Slot(ShardHandles* owner) : owner_(owner) {}
    ShardHandles* owner_;
  };

  // Waits for a free slot (closing an idle file if that makes one).
  Slot Reserve();

  // Shard `id`'s file, cached or opened with `open` in a slot of its own
  // (the opening runs without the lock); `open`'s error as it is.
  absl::StatusOr<Lease> Get(
      uint32_t id,
      const std::function<absl::StatusOr<std::unique_ptr<File>>()>& open);

  // Files open (cached) and slots reserved now; for tests.
  int InUse() const;

 private:
  struct Entry {
    std::unique_ptr<File> file;
    int users = 0;
    std::list<uint32_t>::iterator idle;  // into idle_, when users == 0
  };
  void ReserveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With the slot of the caller: caches `file` for `id` (users 0 or 1).
  File* InsertLocked(uint32_t id, std::unique_ptr<File> file, int users)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(uint32_t id);
  void FreeSlot();

  const int capacity_;
  mutable Mutex mu_;
  CondVar freed_;
  int used_ ABSL_GUARDED_BY(mu_) = 0;  // entries + slots reserved
  absl::flat_hash_map<uint32_t, Entry> files_ ABSL_GUARDED_BY(mu_);
  std::list<uint32_t> idle_ ABSL_GUARDED_BY(mu_);  // most recent first
};

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_READ_SHARD_HANDLES_H_

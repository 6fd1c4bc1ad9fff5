// SaveAsync's snapshot: a SaveStager over copies of everything a rank writes
// (geometry, sources), staged from the registered memory or from copies
// made on the device (SaveOptions::snapshot_to_device), and the write items
// that read from it. The machinery that runs it in the background is
// async_save.h's.
#ifndef CKPT_LIBCKPT_SAVE_ASYNC_SNAPSHOT_H_
#define CKPT_LIBCKPT_SAVE_ASYNC_SNAPSHOT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "ckpt/device_memory.h"
#include "ckpt/writer.h"
#include "save/registration.h"
#include "save/save_plan.h"
#include "save/shard_writer.h"
#include "staging/save_stager.h"
#include "staging/staging_pool.h"

namespace ckpt::internal {

// The device memory of device snapshots: `bytes` per device, allocated on
// first use and kept until destruction. Not thread-safe.
class DeviceSnapshotMemory {
 public:
  // `dm` (may be null: no device snapshot) must outlive this.
  DeviceSnapshotMemory(DeviceMemory* dm, uint64_t bytes)
      : dm_(dm), bytes_(bytes) {}
  ~DeviceSnapshotMemory();
  DeviceSnapshotMemory(const DeviceSnapshotMemory&) = delete;
  DeviceSnapshotMemory& operator=(const DeviceSnapshotMemory&) = delete;

  // Copies the device tensors of `order` (positions in `items`) that fit
  // into the memory of their device there, after options.device_ready, and
  // waits for the copies; adds the bytes copied to *bytes. Per position of
  // `order`: the copy, or null where none was made (none at all without
  // options.snapshot_to_device).
  absl::StatusOr<std::vector<const void*>> Copy(
      const std::vector<Registration>& items,
      const std::vector<uint32_t>& order, const SaveOptions& options,
      uint64_t* bytes);

 private:
  // The memory of `device`, allocated on first use; null where it cannot
  // be had (never asked again).
  char* Arena(int device);

  DeviceMemory* const dm_;
  const uint64_t bytes_;
  absl::flat_hash_map<int, char*> arenas_;
};

struct AsyncSnapshot {
  std::vector<LocalItem> items;   // copies: registrations may change meanwhile
  std::vector<WriteItem> writes;  // point into `items` and `stager`
  std::unique_ptr<SaveStager> stager;  // until AsyncSave takes it
  size_t foreground_items = 0;         // staged before SaveAsync returns
  uint64_t staged_bytes = 0;           // what the stager can use at once
  uint64_t device_snapshot_bytes = 0;
};

// The snapshot of the registrations at positions `writes` of `items`,
// staged through `pool` (buffers of `segment` bytes, StagingSegmentBytes)
// with `options.snapshot_threads` copy threads, the device snapshot's
// copies made first (DeviceSnapshotMemory::Copy); what SaveAsync stages
// before it returns comes first. Grows the pool to what the save can use
// before any copy starts.
absl::StatusOr<std::unique_ptr<AsyncSnapshot>> MakeAsyncSnapshot(
    const std::vector<Registration>& items, const std::vector<uint32_t>& writes,
    StagingPool* pool, DeviceMemory* device_memory,
    DeviceSnapshotMemory* device_snapshot, const SaveOptions& options,
    uint64_t segment);

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_SAVE_ASYNC_SNAPSHOT_H_

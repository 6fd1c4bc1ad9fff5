#include "save/async_snapshot.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "util/align.h"

namespace ckpt::internal {

DeviceSnapshotMemory::~DeviceSnapshotMemory() {
  for (const auto& [device, arena] : arenas_) {
    if (arena != nullptr) dm_->FreeDevice(arena, bytes_, device);
  }
}

char* DeviceSnapshotMemory::Arena(int device) {
  auto it = arenas_.find(device);
  if (it != arenas_.end()) return it->second;
  absl::StatusOr<void*> p = dm_->AllocateDevice(bytes_, device);
  char* arena = p.ok() ? static_cast<char*>(*p) : nullptr;
  arenas_[device] = arena;
  return arena;
}

absl::StatusOr<std::vector<const void*>> DeviceSnapshotMemory::Copy(
    const std::vector<Registration>& items, const std::vector<uint32_t>& order,
    const SaveOptions& options, uint64_t* bytes) {
  std::vector<const void*> copies(order.size(), nullptr);
  if (!options.snapshot_to_device || bytes_ == 0 || dm_ == nullptr) {
    return copies;
  }
  absl::flat_hash_map<int, uint64_t> used;
  absl::flat_hash_map<int, std::vector<DeviceCopy>> batches;
  for (size_t k = 0; k < order.size(); ++k) {
    const Registration& r = items[order[k]];
    const uint64_t n = RegionElements(r.item.region) * DTypeSize(r.item.dtype);
    if (r.memory != MemoryKind::kCuda || r.source || n == 0) continue;
    char* arena = Arena(r.device);
    const uint64_t offset = AlignUp(used[r.device], 256);
    if (arena == nullptr || offset + n > bytes_) continue;
    used[r.device] = offset + n;
    DeviceCopy c;
    c.dst = arena + offset;
    c.src = r.data;
    c.row_bytes = n;
    batches[r.device].push_back(c);
    copies[k] = c.dst;
    *bytes += n;
  }
  for (const auto& [device, batch] : batches) {
    absl::Status s = [&, device = device, &batch = batch]() -> absl::Status {
      CKPT_ASSIGN_OR_RETURN(std::unique_ptr<DeviceStream> stream,
                            dm_->CreateStream(device));
      if (options.device_ready != nullptr)
        CKPT_RETURN_IF_ERROR(stream->WaitEvent(*options.device_ready));
      CKPT_RETURN_IF_ERROR(stream->CopyAsync(CopyKind::kDeviceToDevice, batch));
      CKPT_ASSIGN_OR_RETURN(std::unique_ptr<DeviceEvent> done,
                            stream->Record());
      return done->Wait();
    }();
    CKPT_RETURN_IF_ERROR(
        Annotate(s, absl::StrCat("device snapshot on device ", device)));
  }
  return copies;
}

namespace {

// Adds registration `r` to the snapshot's stager and writes; its bytes
// come from `device_copy` (device memory of the snapshot) when not null.
void AddToSnapshot(AsyncSnapshot* snap, const Registration& r,
                   const void* device_copy) {
  snap->items.push_back(r.item);
  const bool object = r.item.kind == format::EntryKind::kObject;
  StageInput in;
  in.name = r.item.name;
  in.size = RegionElements(r.item.region) * DTypeSize(r.item.dtype);
  // Each item starts at an aligned offset of a buffer.
  snap->staged_bytes += AlignUp(in.size, StagingPool::kAlignment);
  in.data = device_copy ? device_copy : object ? r.bytes.data() : r.data;
  in.memory = object ? MemoryKind::kHost : r.memory;
  in.device = r.device;
  in.source = r.source ? &r.source : nullptr;
  WriteItem w{&snap->items.back(), nullptr};
  w.staged = snap->stager->Add(std::move(in));
  snap->writes.push_back(w);
}

}  // namespace

absl::StatusOr<std::unique_ptr<AsyncSnapshot>> MakeAsyncSnapshot(
    const std::vector<Registration>& items, const std::vector<uint32_t>& writes,
    StagingPool* pool, DeviceMemory* device_memory,
    DeviceSnapshotMemory* device_snapshot, const SaveOptions& options,
    uint64_t segment) {
  auto snap = std::make_unique<AsyncSnapshot>();
  CKPT_ASSIGN_OR_RETURN(std::vector<const void*> on_device,
                        device_snapshot->Copy(items, writes, options,
                                              &snap->device_snapshot_bytes));
  snap->stager = std::make_unique<SaveStager>(
      pool, device_memory, options.device_ready, segment, 0,
      options.snapshot_threads > 0 ? options.snapshot_threads
                                   : DefaultSnapshotThreads());
  snap->items.reserve(writes.size());  // WriteItems point into it
  // What SaveAsync stages before it returns comes first, in the stager and
  // in the shard, then the device snapshot's items (staged in the
  // background): the writer never waits for them while earlier items
  // still hold staging buffers.
  for (const bool deferred : {false, true}) {
    for (size_t k = 0; k < writes.size(); ++k) {
      if ((on_device[k] != nullptr) == deferred)
        AddToSnapshot(snap.get(), items[writes[k]], on_device[k]);
    }
    if (!deferred) snap->foreground_items = snap->writes.size();
  }
  // The pool grows to what this save can use (within the cap, with one
  // buffer's worth of slack for the packing) before the copies start, not
  // copy by copy: the first SaveAsync pays the allocation and faults,
  // later ones find the memory ready.
  CKPT_RETURN_IF_ERROR(
      pool->Reserve(snap->staged_bytes + pool->buffer_bytes()));
  return snap;
}

}  // namespace ckpt::internal

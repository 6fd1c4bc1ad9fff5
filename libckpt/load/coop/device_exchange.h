// Internal to libckpt: the device data plane of a cooperative load
// (ckpt/reader.h, "Cooperative loads"). With a communicator whose AllToAll
// takes device memory (SupportsDeviceMemory, e.g. ckpt::gpu::
// NcclCommunicator), the bytes that a rank reads for another rank's device
// destinations travel in device memory: the reader stages them in a pinned
// buffer, uploads them once per round into a device send buffer, the ranks
// exchange them with AllToAll(kCuda) into a device receive buffer, and the
// receiver copies them device-to-device into its destinations. Bytes for
// host destinations keep the host AllToAll (cooperative_load.cc).
#ifndef CKPT_LIBCKPT_LOAD_COOP_DEVICE_EXCHANGE_H_
#define CKPT_LIBCKPT_LOAD_COOP_DEVICE_EXCHANGE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/communicator.h"
#include "ckpt/device_memory.h"
#include "load/coop/coop_plan.h"
#include "read/read_executor.h"

namespace ckpt::internal {

// One rank's device data plane for one cooperative load. Not thread-safe.
class DeviceExchange {
 public:
  // Collective (one AllGather) when comm->SupportsDeviceMemory(), which
  // must answer alike on every rank; local and null otherwise. Null too (on
  // every rank) unless every rank has a DeviceMemory (`dm`) and kCuda
  // destinations, all on one device: the device buffers of a rank live on the
  // device of its destinations, the one its communicator uses. `after` (may be
  // null, not owned) is the caller's LoadOptions::device_ready: device copies
  // run after it.
  static absl::StatusOr<std::unique_ptr<DeviceExchange>> Create(
      Communicator* comm, DeviceMemory* dm, DeviceEvent* after,
      const std::vector<LoadRequest>& reqs);
  // Frees the buffers (after the copies queued on its stream).
  ~DeviceExchange();
  DeviceExchange(const DeviceExchange&) = delete;
  DeviceExchange& operator=(const DeviceExchange&) = delete;

  // Whether the bytes for holder `h` (a request of rank h.rank) travel in
  // device memory: those of kCuda requests.
  bool OnDevice(const Holder& h) const;

  // Makes the buffers of one round large enough: `send` bytes to send from
  // device memory (and a pinned host buffer, returned, where the reads put
  // them), `recv` bytes to receive. Buffers grow, and are reused across
  // rounds. Local; ResourceExhausted and the like when memory lacks.
  absl::StatusOr<char*> Prepare(uint64_t send, uint64_t recv);
  // Copies the `send` bytes of the pinned buffer to the device send buffer
  // (one host-to-device copy) and waits for it. Local.
  absl::Status Upload();
  // Collective: AllToAll(kCuda) of the device send buffer, laid out by
  // peer (`sends[d]` bytes for rank d, consecutive), into the device
  // receive buffer (`recvs[s]` bytes from rank s, consecutive).
  absl::Status Exchange(Communicator* comm, const std::vector<uint64_t>& sends,
                        const std::vector<uint64_t>& recvs);
  // Copies the bytes received in this round for this rank's device
  // destinations (`incoming[s]`: the plan indexes of the reads of rank s
  // with bytes for this rank, in plan order) device-to-device into their
  // destinations, waits for the copies, and counts them towards their
  // requests' completion in `run`. Local.
  absl::Status Deliver(const RequestGroups& g, const CoopPlan& plan,
                       const std::vector<std::vector<uint32_t>>& incoming,
                       const std::vector<LoadRequest>& reqs, ReadExecutor* run);

 private:
  struct Buffer {
    char* data = nullptr;
    uint64_t size = 0;
  };
  DeviceExchange(Communicator* comm, DeviceMemory* dm, DeviceEvent* after,
                 int device)
      : me_(comm->rank()), dm_(dm), after_(after), device_(device) {}
  absl::Status Grow(Buffer* b, uint64_t n, bool device);
  void Free(Buffer* b, bool device);
  absl::StatusOr<DeviceStream*> Stream();
  absl::Status Run(CopyKind kind, const std::vector<DeviceCopy>& copies);

  const uint32_t me_;
  DeviceMemory* const dm_;
  DeviceEvent* const after_;
  const int device_;
  std::vector<std::vector<bool>> on_device_;  // [rank][request]
  std::unique_ptr<DeviceStream> stream_;
  Buffer staging_, send_, recv_;  // pinned host, device, device
  uint64_t send_bytes_ = 0;       // of the current round
};

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_LOAD_COOP_DEVICE_EXCHANGE_H_

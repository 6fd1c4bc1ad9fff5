#include "load/coop/device_exchange.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "staging/load_stager.h"

namespace ckpt::internal {
namespace {

// What a rank tells the others: '1' if it can use the device data plane
// (a DeviceMemory and kCuda destinations on one device), then one byte
// per request, '1' for a kCuda request. Sets `device` to that device.
std::string Eligibility(DeviceMemory* dm, const std::vector<LoadRequest>& reqs,
                        int* device) {
  std::string flags = "1";
  *device = -1;
  for (const LoadRequest& r : reqs) {
    const bool cuda = r.memory == MemoryKind::kCuda;
    flags.push_back(cuda ? '1' : '0');
    if (!cuda) continue;
    if (*device >= 0 && *device != r.device) flags[0] = '0';
    *device = r.device;
  }
  if (dm == nullptr || *device < 0) flags[0] = '0';
  return flags;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceExchange>> DeviceExchange::Create(
    Communicator* comm, DeviceMemory* dm, DeviceEvent* after,
    const std::vector<LoadRequest>& reqs) {
  if (!comm->SupportsDeviceMemory()) return nullptr;
  int device = -1;
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> all,
                        comm->AllGather(Eligibility(dm, reqs, &device)));
  for (const std::string& flags : all) {
    if (flags.empty() || flags[0] != '1') return nullptr;
  }
  std::unique_ptr<DeviceExchange> dx(
      new DeviceExchange(comm, dm, after, device));
  for (const std::string& flags : all) {
    std::vector<bool> on(flags.size() - 1);
    for (size_t i = 1; i < flags.size(); ++i) on[i - 1] = flags[i] == '1';
    dx->on_device_.push_back(std::move(on));
  }
  return dx;
}

DeviceExchange::~DeviceExchange() {
  stream_.reset();  // waits for the queued copies
  Free(&staging_, false);
  Free(&send_, true);
  Free(&recv_, true);
}

bool DeviceExchange::OnDevice(const Holder& h) const {
  return on_device_[h.rank][h.index];
}

void DeviceExchange::Free(Buffer* b, bool device) {
  if (b->data == nullptr) return;
  if (device) {
    dm_->FreeDevice(b->data, b->size, device_);
  } else {
    dm_->FreeHost(b->data, b->size);
  }
  *b = Buffer{};
}

absl::Status DeviceExchange::Grow(Buffer* b, uint64_t n, bool device) {
  if (n <= b->size) return absl::OkStatus();
  Free(b, device);
  absl::StatusOr<void*> p =
      device ? dm_->AllocateDevice(n, device_) : dm_->AllocateHost(n);
  if (!p.ok()) {
    return Annotate(p.status(),
                    absl::StrCat("a cooperative load's ", n, "-byte ",
                                 device ? "device" : "pinned host",
                                 " exchange buffer on device ", device_));
  }
  *b = Buffer{static_cast<char*>(*p), n};
  return absl::OkStatus();
}

absl::StatusOr<char*> DeviceExchange::Prepare(uint64_t send, uint64_t recv) {
  CKPT_RETURN_IF_ERROR(Grow(&staging_, send, false));
  CKPT_RETURN_IF_ERROR(Grow(&send_, send, true));
  CKPT_RETURN_IF_ERROR(Grow(&recv_, recv, true));
  send_bytes_ = send;
  return staging_.data;
}

absl::StatusOr<DeviceStream*> DeviceExchange::Stream() {
  if (stream_ == nullptr) {
    CKPT_ASSIGN_OR_RETURN(stream_, dm_->CreateStream(device_));
    if (after_ != nullptr) CKPT_RETURN_IF_ERROR(stream_->WaitEvent(*after_));
  }
  return stream_.get();
}

absl::Status DeviceExchange::Run(CopyKind kind,
                                 const std::vector<DeviceCopy>& copies) {
  if (copies.empty()) return absl::OkStatus();
  CKPT_ASSIGN_OR_RETURN(DeviceStream * s, Stream());
  CKPT_RETURN_IF_ERROR(s->CopyAsync(kind, copies));
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<DeviceEvent> e, s->Record());
  absl::Status st = e->Wait();
  if (st.ok()) return st;
  return Annotate(st, kind == CopyKind::kHostToDevice
                          ? "cooperative load: upload of the bytes to send"
                          : "cooperative load: device-to-device copy of the "
                            "bytes received");
}

absl::Status DeviceExchange::Upload() {
  if (send_bytes_ == 0) return absl::OkStatus();
  DeviceCopy c;
  c.dst = send_.data;
  c.src = staging_.data;
  c.row_bytes = send_bytes_;
  return Run(CopyKind::kHostToDevice, {c});
}

absl::Status DeviceExchange::Exchange(Communicator* comm,
                                      const std::vector<uint64_t>& sends,
                                      const std::vector<uint64_t>& recvs) {
  std::vector<SendBuffer> send(sends.size());
  std::vector<RecvBuffer> recv(recvs.size());
  uint64_t s_off = 0, r_off = 0;
  for (size_t d = 0; d < sends.size(); ++d) {
    send[d] = SendBuffer{sends[d] ? send_.data + s_off : nullptr, sends[d]};
    s_off += sends[d];
  }
  for (size_t s = 0; s < recvs.size(); ++s) {
    recv[s] = RecvBuffer{recvs[s] ? recv_.data + r_off : nullptr, recvs[s]};
    r_off += recvs[s];
  }
  return comm->AllToAll(send, recv, MemoryKind::kCuda);
}

absl::Status DeviceExchange::Deliver(
    const RequestGroups& g, const CoopPlan& plan,
    const std::vector<std::vector<uint32_t>>& incoming,
    const std::vector<LoadRequest>& reqs, ReadExecutor* run) {
  // The received bytes lie by sender, then in plan and delivery order, as
  // the senders laid them out (cooperative_load.cc, RoundReads).
  std::map<uint32_t, std::vector<CopyRun>> runs;  // by request
  uint64_t cursor = 0;
  for (const std::vector<uint32_t>& from : incoming) {
    for (uint32_t i : from) {
      ForEachDelivery(
          g, plan.reads[i].read, [&](const Holder& h, const Copy& c) {
            if (h.rank != me_ || !OnDevice(h)) return;
            ForEachRunIn(c, 0, UINT64_MAX,  // the runs come packed, in order
                         [&](uint64_t, uint64_t dst, uint64_t n) {
                           runs[h.index].push_back({cursor, dst, n});
                           cursor += n;
                         });
          });
    }
  }
  std::vector<DeviceCopy> copies;
  for (const auto& [request, list] : runs) {
    for (const DeviceCopy& c : CoalesceRuns(
             list, recv_.data, static_cast<char*>(reqs[request].data))) {
      copies.push_back(c);
    }
  }
  CKPT_RETURN_IF_ERROR(Run(CopyKind::kDeviceToDevice, copies));
  for (const auto& [request, list] : runs) {
    uint64_t bytes = 0;
    for (const CopyRun& r : list) bytes += r.bytes;
    run->Delivered(request, bytes);
  }
  return absl::OkStatus();
}

}  // namespace ckpt::internal

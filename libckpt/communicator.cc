// The default AllToAll: every rank's payload for every peer goes through
// AllGather, each rank keeping what is addressed to it.
#include "ckpt/communicator.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/status_macros.h"

namespace ckpt {
namespace {

absl::Status CheckArity(const Communicator& comm, size_t sends, size_t recvs,
                        MemoryKind memory) {
  if (memory != MemoryKind::kHost && !comm.SupportsDeviceMemory()) {
    return absl::InvalidArgumentError(
        "AllToAll: this communicator moves only host memory; the buffers "
        "are device memory");
  }
  if (sends != static_cast<size_t>(comm.size()) ||
      recvs != static_cast<size_t>(comm.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllToAll on rank ", comm.rank(), ": expected ", comm.size(),
        " send and receive buffers (one per rank), got ", sends, " and ",
        recvs));
  }
  return absl::OkStatus();
}

// [u64 size of the part for rank 0][part]...[u64 size for rank n-1][part]
std::string EncodeParts(absl::Span<const SendBuffer> send) {
  size_t total = 0;
  for (const SendBuffer& b : send) total += 8 + b.size;
  std::string out;
  out.reserve(total);
  for (const SendBuffer& b : send) {
    format::PutFixed64(&out, b.size);
    if (b.size > 0) out.append(static_cast<const char*>(b.data), b.size);
  }
  return out;
}

// The part of `payload` (sent by `from`) addressed to rank `me`.
absl::StatusOr<absl::string_view> PartFor(absl::string_view payload, int me,
                                          int from) {
  for (int d = 0;; ++d) {
    uint64_t size = 0;
    if (payload.size() < 8) break;
    size = format::LoadFixed64(payload.data());
    payload.remove_prefix(8);
    if (payload.size() < size) break;
    if (d == me) return payload.substr(0, size);
    payload.remove_prefix(size);
  }
  return absl::InternalError(
      absl::StrCat("AllToAll: the payload of rank ", from, " is truncated"));
}

}  // namespace

absl::Status Communicator::AllToAll(absl::Span<const SendBuffer> send,
                                    absl::Span<const RecvBuffer> recv,
                                    MemoryKind memory) {
  CKPT_RETURN_IF_ERROR(CheckArity(*this, send.size(), recv.size(), memory));
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> all,
                        AllGather(EncodeParts(send)));
  const int me = rank();
  for (int s = 0; s < size(); ++s) {
    CKPT_ASSIGN_OR_RETURN(absl::string_view part, PartFor(all[s], me, s));
    if (part.size() != recv[s].size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AllToAll: rank ", s, " sends ", part.size(), " bytes to rank ", me,
          ", which expects ", recv[s].size));
    }
    if (!part.empty()) std::memcpy(recv[s].data, part.data(), part.size());
  }
  return absl::OkStatus();
}

}  // namespace ckpt

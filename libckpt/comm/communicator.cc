// comm/: the implementations of ckpt::Communicator (ckpt/communicator.h):
// in-process ranks (in_process.cc), MPI (mpi/, its own library ckpt_mpi),
// and here the default AllToAll (every rank's payload for every peer goes
// through AllGather, each rank keeping what is addressed to it) and the helpers
// that every AllToAll shares.
#include "ckpt/communicator.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/status_macros.h"
#include "util/rank_status.h"

namespace ckpt {
namespace {

// [u64 size of the part for rank 0][part]...[u64 size for rank n-1][part].
// A rank whose own arguments are bad contributes an empty payload (a valid
// one has at least one size), so that it still takes part in AllGather.
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

absl::Status SizeMismatch(int sender, uint64_t sent, int receiver,
                          uint64_t expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("AllToAll: rank ", sender, " sends ", sent,
                   " bytes to rank ", receiver, ", which expects ", expected));
}

// Checks every part addressed to this rank, then copies them into `recv`.
absl::Status Deliver(const std::vector<std::string>& all, int me,
                     absl::Span<const RecvBuffer> recv) {
  std::vector<absl::string_view> parts(all.size());
  for (size_t s = 0; s < all.size(); ++s) {
    if (all[s].empty()) continue;  // that rank failed; it reports why
    CKPT_ASSIGN_OR_RETURN(parts[s], PartFor(all[s], me, static_cast<int>(s)));
    if (parts[s].size() != recv[s].size) {
      return SizeMismatch(static_cast<int>(s), parts[s].size(), me,
                          recv[s].size);
    }
  }
  for (size_t s = 0; s < all.size(); ++s) {
    if (!parts[s].empty())
      std::memcpy(recv[s].data, parts[s].data(), parts[s].size());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Communicator::CheckAllToAllArguments(size_t sends, size_t recvs,
                                                  MemoryKind memory) const {
  if (memory != MemoryKind::kHost && !SupportsDeviceMemory()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllToAll on rank ", rank(),
        ": this communicator moves only host memory; the buffers are device "
        "memory"));
  }
  if (sends != static_cast<size_t>(size()) ||
      recvs != static_cast<size_t>(size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllToAll on rank ", rank(), ": expected ", size(),
                     " send and receive buffers (one per rank), got ", sends,
                     " and ", recvs));
  }
  return absl::OkStatus();
}

absl::Status Communicator::AllToAllSizeMismatch(int sender, uint64_t sent,
                                                int receiver,
                                                uint64_t expected) {
  return SizeMismatch(sender, sent, receiver, expected);
}

absl::Status Communicator::AgreeOnFirstError(const absl::Status& mine,
                                             std::vector<int64_t>* max_values) {
  return internal::AgreeOnFirstError(*this, mine, max_values);
}

absl::Status Communicator::AllToAll(absl::Span<const SendBuffer> send,
                                    absl::Span<const RecvBuffer> recv,
                                    MemoryKind memory) {
  absl::Status verdict =
      CheckAllToAllArguments(send.size(), recv.size(), memory);
  CKPT_ASSIGN_OR_RETURN(
      std::vector<std::string> all,
      AllGather(verdict.ok() ? EncodeParts(send) : std::string()));
  if (verdict.ok()) verdict = Deliver(all, rank(), recv);
  return AgreeOnFirstError(verdict);
}

}  // namespace ckpt

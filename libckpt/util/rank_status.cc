#include "util/rank_status.h"

#include <utility>

#include "ckpt/format/coding.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::internal {

std::string EncodeStatusOr(const absl::StatusOr<std::string>& s) {
  std::string out;
  if (s.ok()) {
    format::PutFixed8(&out, 0);
    out += *s;
  } else {
    format::PutFixed8(&out, static_cast<uint8_t>(s.status().code()));
    out += std::string(s.status().message());
  }
  return out;
}

absl::StatusOr<std::string> DecodeStatusOr(absl::string_view bytes) {
  if (bytes.empty())
    return absl::InternalError("empty message from another rank");
  uint8_t code = static_cast<uint8_t>(bytes[0]);
  if (code == 0) return std::string(bytes.substr(1));
  return absl::Status(static_cast<absl::StatusCode>(code), bytes.substr(1));
}

absl::Status AgreeOnFirstError(Communicator& comm, const absl::Status& mine,
                               std::vector<int64_t>* max_values,
                               int* failing_rank) {
  if (failing_rank != nullptr) *failing_rank = -1;
  std::vector<int64_t> values;
  if (max_values != nullptr) values = *max_values;
  // The maximum of size - rank over the failing ranks names the lowest.
  values.push_back(mine.ok() ? 0 : comm.size() - comm.rank());
  CKPT_RETURN_IF_ERROR(comm.AllReduceMax(&values));
  const int64_t first = values.back();
  values.pop_back();
  if (max_values != nullptr) *max_values = std::move(values);
  if (first == 0) return absl::OkStatus();
  const int root = static_cast<int>(comm.size() - first);
  std::string message;
  if (comm.rank() == root) message = EncodeStatusOr(mine);
  CKPT_RETURN_IF_ERROR(comm.Broadcast(&message, root));
  absl::Status s = DecodeStatusOr(message).status();
  if (s.ok()) return absl::InternalError("a failing rank sent no error");
  if (failing_rank != nullptr) *failing_rank = root;
  return s;
}

absl::StatusOr<std::vector<std::string>> AllGatherOrFirstError(
    Communicator& comm, const absl::StatusOr<std::string>& mine,
    int* failing_rank) {
  if (failing_rank != nullptr) *failing_rank = -1;
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> all,
                        comm.AllGather(EncodeStatusOr(mine)));
  for (size_t r = 0; r < all.size(); ++r) {
    absl::StatusOr<std::string> got = DecodeStatusOr(all[r]);
    if (!got.ok()) {
      if (failing_rank != nullptr) *failing_rank = static_cast<int>(r);
      return got.status();
    }
    all[r] = *std::move(got);
  }
  return all;
}

absl::StatusOr<std::string> OnRankZero(
    Communicator* comm, absl::FunctionRef<absl::StatusOr<std::string>()> fn) {
  std::string msg;
  if (comm->rank() == 0) msg = EncodeStatusOr(fn());
  CKPT_RETURN_IF_ERROR(comm->Broadcast(&msg, 0));
  return DecodeStatusOr(msg);
}

}  // namespace ckpt::internal

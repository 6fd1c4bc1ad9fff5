#include "util/rank_status.h"

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

absl::StatusOr<std::string> OnRankZero(
    Communicator* comm, absl::FunctionRef<absl::StatusOr<std::string>()> fn) {
  std::string msg;
  if (comm->rank() == 0) msg = EncodeStatusOr(fn());
  CKPT_RETURN_IF_ERROR(comm->Broadcast(&msg, 0));
  return DecodeStatusOr(msg);
}

}  // namespace ckpt::internal

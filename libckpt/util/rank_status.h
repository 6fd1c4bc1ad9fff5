// util/: small pieces every subsystem of libckpt may use (locks, parallel
// loops, the status of a rank as bytes). This header: a status, or a payload,
// sent from one rank to the others.
//
// Messages between ranks never reach a disk and are exchanged between
// processes of one job (one library version).
#ifndef CKPT_LIBCKPT_UTIL_RANK_STATUS_H_
#define CKPT_LIBCKPT_UTIL_RANK_STATUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/communicator.h"

namespace ckpt::internal {

// A status (code and message) or a payload, as bytes: [u8 code][message or
// payload]. Wraps every reply of a coordinator and every shard report, so
// that an error on one rank reaches the others with its code and message.
std::string EncodeStatusOr(const absl::StatusOr<std::string>& s);
// InternalError "empty message from another rank" for no bytes.
absl::StatusOr<std::string> DecodeStatusOr(absl::string_view bytes);

// The first error of the ranks of `comm`. Collective (one AllReduceMax,
// plus one Broadcast when some rank failed): every rank passes its own
// verdict; every rank returns OK, or the verdict (code and message) of the
// lowest rank whose verdict is an error, that rank then in *failing_rank
// (may be null; -1 otherwise). `max_values` (null, or the same count on
// every rank) are reduced with max in the same AllReduceMax, so that a
// caller agrees on its parameters and on success in one round trip. A
// failure of the collectives themselves is returned as it is.
absl::Status AgreeOnFirstError(Communicator& comm, const absl::Status& mine,
                               std::vector<int64_t>* max_values = nullptr,
                               int* failing_rank = nullptr);

// Every rank's payload, or the first error, in one AllGather (of each
// rank's EncodeStatusOr): every rank returns the payloads in rank order,
// or the status (code and message) of the lowest rank that passed an
// error, that rank then in *failing_rank (may be null; -1 otherwise), as
// AgreeOnFirstError followed by an AllGather would, in one round trip. A
// failure of the AllGather itself is returned as it is.
absl::StatusOr<std::vector<std::string>> AllGatherOrFirstError(
    Communicator& comm, const absl::StatusOr<std::string>& mine,
    int* failing_rank = nullptr);

// Rank 0 runs `fn`; its status (and payload) reach every rank. Collective
// (one Broadcast); a failure of the Broadcast is returned as it is.
absl::StatusOr<std::string> OnRankZero(
    Communicator* comm, absl::FunctionRef<absl::StatusOr<std::string>()> fn);

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_UTIL_RANK_STATUS_H_

// Internal: small messages exchanged between ranks during a save.
#ifndef CKPT_LIBCKPT_WIRE_H_
#define CKPT_LIBCKPT_WIRE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/records.h"

namespace ckpt::internal {

// A status (code and message) or a payload, as bytes.
std::string EncodeStatusOr(const absl::StatusOr<std::string>& s);
absl::StatusOr<std::string> DecodeStatusOr(absl::string_view bytes);

// What a rank tells the coordinator after writing its shard file.
std::string EncodeShardReport(uint64_t file_size,
                              const std::vector<format::EntryRecord>& entries);
absl::Status DecodeShardReport(absl::string_view bytes, uint64_t* file_size,
                               std::vector<format::EntryRecord>* entries);

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_WIRE_H_

#include "libckpt/wire.h"

#include "format/coding.h"
#include "format/section_coding.h"
#include "format/status_macros.h"

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
  if (bytes.empty()) return absl::InternalError("empty message from another rank");
  uint8_t code = static_cast<uint8_t>(bytes[0]);
  if (code == 0) return std::string(bytes.substr(1));
  return absl::Status(static_cast<absl::StatusCode>(code), bytes.substr(1));
}

std::string EncodeShardReport(uint64_t file_size,
                              const std::vector<format::EntryRecord>& entries) {
  std::string out;
  format::PutVarint(&out, file_size);
  format::internal::EncodeEntries(entries, /*with_blocks=*/false, &out);
  return out;
}

absl::Status DecodeShardReport(absl::string_view bytes, uint64_t* file_size,
                               std::vector<format::EntryRecord>* entries) {
  format::ByteReader r(bytes);
  CKPT_ASSIGN_OR_RETURN(*file_size, r.ReadVarint("file size"));
  format::internal::RawSection s;
  s.tag = format::kSectionEntries;
  s.body = bytes.substr(bytes.size() - r.remaining());
  CKPT_ASSIGN_OR_RETURN(*entries, format::internal::DecodeEntries(s, false));
  return absl::OkStatus();
}

}  // namespace ckpt::internal

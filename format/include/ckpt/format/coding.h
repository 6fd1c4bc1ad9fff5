// Little-endian fixed-width integers and LEB128 varints (spec/FORMAT.md
// section "Conventions"). Encoders append to a std::string; decoding goes
// through ByteReader, which never reads past its span and reports
// truncation as DataLoss naming the field.
#ifndef CKPT_FORMAT_CODING_H_
#define CKPT_FORMAT_CODING_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::format {

void PutFixed8(std::string* dst, uint8_t v);
void PutFixed16(std::string* dst, uint16_t v);
void PutFixed32(std::string* dst, uint32_t v);
void PutFixed64(std::string* dst, uint64_t v);
// Unsigned LEB128: 7 bits per byte, low bits first, at most 10 bytes.
void PutVarint(std::string* dst, uint64_t v);
// Varint length followed by the bytes.
void PutString(std::string* dst, absl::string_view s);

uint16_t LoadFixed16(const char* p);
uint32_t LoadFixed32(const char* p);
uint64_t LoadFixed64(const char* p);
void StoreFixed16(char* p, uint16_t v);
void StoreFixed32(char* p, uint32_t v);
void StoreFixed64(char* p, uint64_t v);

// Bounds-checked cursor over bytes it does not own (the span must outlive
// it). Every Read* fails with DataLoss "<what>: truncated at offset N" when
// the bytes run out; `what` names the field for the error message. Offsets
// in messages are relative to the start of `data` plus `base_offset`.
class ByteReader {
 public:
  explicit ByteReader(absl::string_view data, uint64_t base_offset = 0)
      : data_(data), base_(base_offset) {}

  [[nodiscard]] absl::StatusOr<uint8_t> Read8(absl::string_view what);
  [[nodiscard]] absl::StatusOr<uint16_t> Read16(absl::string_view what);
  [[nodiscard]] absl::StatusOr<uint32_t> Read32(absl::string_view what);
  [[nodiscard]] absl::StatusOr<uint64_t> Read64(absl::string_view what);
  // Rejects encodings longer than 10 bytes or overflowing 64 bits.
  [[nodiscard]] absl::StatusOr<uint64_t> ReadVarint(absl::string_view what);
  // A varint that must be <= max (InvalidArgument-free: DataLoss).
  [[nodiscard]] absl::StatusOr<uint64_t> ReadVarintAtMost(
      absl::string_view what, uint64_t max);
  [[nodiscard]] absl::StatusOr<absl::string_view> ReadBytes(
      absl::string_view what, uint64_t n);
  // Varint length (<= max_len) then bytes.
  [[nodiscard]] absl::StatusOr<absl::string_view> ReadString(
      absl::string_view what, uint64_t max_len);

  uint64_t offset() const { return base_ + pos_; }
  uint64_t remaining() const { return data_.size() - pos_; }
  bool empty() const { return pos_ == data_.size(); }

 private:
  absl::Status Truncated(absl::string_view what, uint64_t need) const;

  absl::string_view data_;
  uint64_t base_;
  uint64_t pos_ = 0;
};

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_CODING_H_

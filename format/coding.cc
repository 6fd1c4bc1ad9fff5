#include "ckpt/format/coding.h"

#include "absl/strings/str_format.h"

namespace ckpt::format {

void PutFixed8(std::string* dst, uint8_t v) {
  dst->push_back(static_cast<char>(v));
}
void PutFixed16(std::string* dst, uint16_t v) {
  char b[2];
  StoreFixed16(b, v);
  dst->append(b, 2);
}
void PutFixed32(std::string* dst, uint32_t v) {
  char b[4];
  StoreFixed32(b, v);
  dst->append(b, 4);
}
void PutFixed64(std::string* dst, uint64_t v) {
  char b[8];
  StoreFixed64(b, v);
  dst->append(b, 8);
}
void PutVarint(std::string* dst, uint64_t v) {
  while (v >= 0x80) {
    dst->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  dst->push_back(static_cast<char>(v));
}
void PutString(std::string* dst, absl::string_view s) {
  PutVarint(dst, s.size());
  dst->append(s.data(), s.size());
}

uint16_t LoadFixed16(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint16_t>(u[0] | (u[1] << 8));
}
uint32_t LoadFixed32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint32_t>(u[0]) | (static_cast<uint32_t>(u[1]) << 8) |
         (static_cast<uint32_t>(u[2]) << 16) |
         (static_cast<uint32_t>(u[3]) << 24);
}
uint64_t LoadFixed64(const char* p) {
  return static_cast<uint64_t>(LoadFixed32(p)) |
         (static_cast<uint64_t>(LoadFixed32(p + 4)) << 32);
}
void StoreFixed16(char* p, uint16_t v) {
  p[0] = static_cast<char>(v);
  p[1] = static_cast<char>(v >> 8);
}
void StoreFixed32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void StoreFixed64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}

absl::Status ByteReader::Truncated(absl::string_view what,
                                   uint64_t need) const {
  return absl::DataLossError(
      absl::StrFormat("%s: truncated at offset %d (need %d bytes, %d left)",
                      what, offset(), need, remaining()));
}

absl::StatusOr<uint8_t> ByteReader::Read8(absl::string_view what) {
  if (remaining() < 1) return Truncated(what, 1);
  return static_cast<uint8_t>(data_[pos_++]);
}
absl::StatusOr<uint16_t> ByteReader::Read16(absl::string_view what) {
  if (remaining() < 2) return Truncated(what, 2);
  uint16_t v = LoadFixed16(data_.data() + pos_);
  pos_ += 2;
  return v;
}
absl::StatusOr<uint32_t> ByteReader::Read32(absl::string_view what) {
  if (remaining() < 4) return Truncated(what, 4);
  uint32_t v = LoadFixed32(data_.data() + pos_);
  pos_ += 4;
  return v;
}
absl::StatusOr<uint64_t> ByteReader::Read64(absl::string_view what) {
  if (remaining() < 8) return Truncated(what, 8);
  uint64_t v = LoadFixed64(data_.data() + pos_);
  pos_ += 8;
  return v;
}
absl::StatusOr<uint64_t> ByteReader::ReadVarint(absl::string_view what) {
  uint64_t result = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (remaining() < 1) return Truncated(what, 1);
    uint64_t byte = static_cast<unsigned char>(data_[pos_++]);
    if (shift == 63 && byte > 1) {
      return absl::DataLossError(absl::StrFormat(
          "%s: varint overflows 64 bits at offset %d", what, offset() - 1));
    }
    result |= (byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return result;
  }
  return absl::DataLossError(absl::StrFormat(
      "%s: varint longer than 10 bytes at offset %d", what, offset()));
}
absl::StatusOr<uint64_t> ByteReader::ReadVarintAtMost(absl::string_view what,
                                                      uint64_t max) {
  uint64_t at = offset();
  auto v = ReadVarint(what);
  if (!v.ok()) return v;
  if (*v > max) {
    return absl::DataLossError(absl::StrFormat(
        "%s: value %d at offset %d exceeds the limit %d", what, *v, at, max));
  }
  return v;
}
absl::StatusOr<absl::string_view> ByteReader::ReadBytes(absl::string_view what,
                                                        uint64_t n) {
  if (remaining() < n) return Truncated(what, n);
  absl::string_view out = data_.substr(pos_, n);
  pos_ += n;
  return out;
}
absl::StatusOr<absl::string_view> ByteReader::ReadString(absl::string_view what,
                                                         uint64_t max_len) {
  auto n = ReadVarintAtMost(what, max_len);
  if (!n.ok()) return n.status();
  return ReadBytes(what, *n);
}

}  // namespace ckpt::format

// The safetensors file format and the Hugging Face shard index, as pure
// codecs (no I/O).
//
// A safetensors file is: u64le N, N bytes of JSON (the header), then the
// data. The header maps each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end]} (offsets relative to the data) and may hold
// "__metadata__", a map of strings to strings. Decoding is as strict as the
// reference implementation (safetensors' Metadata::validate): the header
// length is at most kSafetensorsMaxHeader and inside the file, the header
// is well-formed UTF-8 JSON (no NUL byte), dtypes are known, offsets are
// contiguous from 0, non-overlapping, cover the data exactly, and each
// tensor's byte count is the product of its shape times the element size.
// Stricter than safetensors 0.8.0 in two points: the header starts with '{'
// (the specification's MUST, unchecked there) and has no duplicate keys
// (there the last one wins). python/tests/test_interop_hf.py compares the
// two on a table of headers.
//
// A sharded checkpoint is a directory of files plus
// "model.safetensors.index.json": {"metadata": {"total_size": N},
// "weight_map": {tensor: file}}.
#ifndef CKPT_INTEROP_SAFETENSORS_H_
#define CKPT_INTEROP_SAFETENSORS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/format/dtype.h"
#include "ckpt/format/geometry.h"

namespace ckpt::interop {

// The reference implementation's limit on N (100 MB).
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;
inline constexpr char kSafetensorsMetadataKey[] = "__metadata__";
inline constexpr char kHfIndexName[] = "model.safetensors.index.json";

// "BOOL", "U8", ..., "BF16", "F8_E4M3", "F8_E5M2".
absl::string_view SafetensorsDTypeName(DType dtype);
// FailedPrecondition for a valid safetensors dtype that ckpt has no type for
// (e.g. "C64", "F8_E8M0"); InvalidArgument for anything else.
absl::StatusOr<DType> DTypeFromSafetensors(absl::string_view name);

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kUInt8;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets in the data section
};

struct SafetensorsHeader {
  uint64_t data_offset = 0;  // 8 + N: where the data section starts
  std::vector<SafetensorsTensor> tensors;                     // sorted by begin
  std::vector<std::pair<std::string, std::string>> metadata;  // sorted by key
};

// N from the first 8 bytes of a file of `file_size` bytes. DataLoss when
// fewer than 8 bytes, N > kSafetensorsMaxHeader or 8 + N > file_size.
absl::StatusOr<uint64_t> DecodeSafetensorsHeaderLength(absl::string_view first8,
                                                       uint64_t file_size);

// Decodes and validates the N header bytes of a file whose data section
// holds `data_size` bytes. DataLoss naming the tensor and both values for
// every violation listed above; FailedPrecondition for a dtype ckpt lacks.
absl::StatusOr<SafetensorsHeader> DecodeSafetensorsHeader(
    absl::string_view json, uint64_t data_size);

// The first 8 + N bytes of a file holding `tensors` (their begin/end set,
// contiguous from 0) in this order, with `metadata` as "__metadata__"
// (omitted when empty), the JSON padded with spaces to a multiple of 8.
// InvalidArgument if a name or metadata string is not valid UTF-8.
absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<SafetensorsTensor>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata);

struct HfIndex {
  bool has_total_size = false;
  uint64_t total_size = 0;
  std::vector<std::pair<std::string, std::string>>
      weight_map;                  // sorted by tensor
  std::vector<std::string> files;  // distinct, sorted
};

// Decodes an index file. DataLoss for malformed JSON, duplicate keys, a
// missing weight_map, or a file name that is not a plain name inside the
// index's directory (empty, absolute, containing '/' or '\\', "." or "..").
absl::StatusOr<HfIndex> DecodeHfIndex(absl::string_view json);
// The index file's JSON (2-space indent, as transformers writes it).
std::string EncodeHfIndex(const HfIndex& index);

// The shard file name of Hugging Face: "model-00001-of-00003.safetensors".
std::string HfShardName(size_t index, size_t count);

// Parses a size as transformers' --max-shard-size does: a number of bytes,
// or a number with KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (powers
// of 1024). InvalidArgument naming the input otherwise, or for 0.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

}  // namespace ckpt::interop

#endif  // CKPT_INTEROP_SAFETENSORS_H_

// Fuzzes DecodeShardIndex (format/shard.h), the way a reader opens a shard
// (spec/FORMAT.md §5.6): the input is a whole shard file; its first 64 bytes
// go to DecodeShardHeader, its last 32 to DecodeShardTail with the input's
// size as the file size, and the index bytes the tail locates to
// DecodeShardIndex.
//
// Each input is tried as given and with its checksums repaired: the header
// checksum, and (when the tail's index_offset lies in the file) the tail's
// index_length and index_checksum, recomputed for the bytes between
// index_offset and the tail. Without the repair nearly every mutation would
// stop at a checksum. A decoded index must survive EncodeShardIndex ->
// DecodeShardIndex (with a tail for the new bytes) unchanged.
#include <cstddef>
#include <cstdint>
#include <string>

#include "ckpt/format/checksum.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/shard.h"
#include "fuzz_util.h"

namespace {

using namespace ckpt::format;

void Check(absl::string_view file) {
  absl::StatusOr<ShardHeader> h = DecodeShardHeader(file);
  if (!h.ok()) return;
  absl::StatusOr<ShardTail> t = DecodeShardTail(file, file.size());
  if (!t.ok()) return;
  // DecodeShardTail promises that the index lies between header and tail;
  // check it before slicing rather than trust it.
  FUZZ_CHECK(t->index_offset >= static_cast<uint64_t>(kShardHeaderSize));
  FUZZ_CHECK(t->index_offset <= file.size());
  FUZZ_CHECK(t->index_length <= file.size() - t->index_offset);
  FUZZ_CHECK(t->index_offset + t->index_length + kShardTailSize == file.size());
  absl::string_view index_bytes = file.substr(t->index_offset, t->index_length);

  absl::StatusOr<ShardIndex> index = DecodeShardIndex(index_bytes, *h, *t);
  if (!index.ok()) return;

  std::string re = EncodeShardIndex(*index);
  ShardTail t2 = *t;
  t2.index_length = re.size();
  t2.index_checksum = Checksum(re);
  absl::StatusOr<ShardIndex> index2 = DecodeShardIndex(re, *h, t2);
  if (!index2.ok()) {
    std::fprintf(stderr, "re-encoded shard index rejected: %s\n",
                 std::string(index2.status().message()).c_str());
  }
  FUZZ_CHECK(index2.ok());
  FUZZ_CHECK(*index2 == *index);
  FUZZ_CHECK(EncodeShardIndex(*index2) == re);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view in = ckpt::fuzz::AsView(data, size);
  Check(in);

  if (size < static_cast<size_t>(kShardHeaderSize + kShardTailSize)) return 0;
  std::string fixed(in);
  char* p = fixed.data();
  StoreFixed64(p + 56, Checksum(p, 56));
  const uint64_t tail_at = size - kShardTailSize;
  const uint64_t index_offset = LoadFixed64(p + tail_at);
  if (index_offset >= static_cast<uint64_t>(kShardHeaderSize) &&
      index_offset <= tail_at) {
    StoreFixed64(p + tail_at + 8, tail_at - index_offset);
    StoreFixed64(p + tail_at + 16,
                 Checksum(p + index_offset, tail_at - index_offset));
  }
  if (fixed != in) Check(fixed);
  return 0;
}

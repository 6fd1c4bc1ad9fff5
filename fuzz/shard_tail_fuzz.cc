// Fuzzes DecodeShardTail (format/shard.h).
//
// The input is the end of a shard file: the decoder reads its last 32 bytes.
// The file size is taken from the first 8 bytes of the input (u64le) when
// there are at least 8, so any size, huge ones included, can be tried; the
// input's own size is tried as well. A decoded tail must satisfy the
// documented guarantee (the index lies between the header and the tail),
// re-encode to exactly the 32 bytes it came from, and decode back to the
// same value.
#include <cstddef>
#include <cstdint>
#include <string>

#include "ckpt/format/coding.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/shard.h"
#include "fuzz_util.h"

namespace {

using namespace ckpt::format;

void Check(absl::string_view bytes, uint64_t file_size) {
  absl::StatusOr<ShardTail> t = DecodeShardTail(bytes, file_size);
  if (!t.ok()) return;
  FUZZ_CHECK(bytes.size() >= static_cast<size_t>(kShardTailSize));
  FUZZ_CHECK(file_size >=
             static_cast<uint64_t>(kShardHeaderSize + kShardTailSize));
  const uint64_t tail_at = file_size - kShardTailSize;
  FUZZ_CHECK(t->index_offset >= static_cast<uint64_t>(kShardHeaderSize));
  FUZZ_CHECK(t->index_offset <= tail_at);
  FUZZ_CHECK(t->index_length == tail_at - t->index_offset);
  FUZZ_CHECK(t->index_length <= kMaxIndexSize);

  std::string re = EncodeShardTail(*t);
  FUZZ_CHECK(re.size() == static_cast<size_t>(kShardTailSize));
  FUZZ_CHECK(re == bytes.substr(bytes.size() - kShardTailSize));
  absl::StatusOr<ShardTail> t2 = DecodeShardTail(re, file_size);
  FUZZ_CHECK(t2.ok());
  FUZZ_CHECK(*t2 == *t);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view in = ckpt::fuzz::AsView(data, size);
  if (size >= 8) Check(in, LoadFixed64(in.data()));
  Check(in, size);
  return 0;
}

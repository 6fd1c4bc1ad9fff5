// ckpt-hostile-gen KIND N DIR: writes one of the checkpoints of
// testing/hostile_checkpoints.h into DIR, for measuring the tools on them
// (SECURITY.md "Resource use"). Not a test.
//   coverage N     one box, then N copies of one flat range (2^32 elements)
//   scalars N      one scalar entry of N chunks
//   zero-blocks N  two zstd blocks of N MiB of zeros each
//   empty-chunks N            one entry of N chunks without elements
//   empty-chunks-unindexed N  the same, missing from the shard's index
//   scalar-entries N          N scalar entries of one chunk each
#include <cstdio>
#include <cstdlib>
#include <string>

#include "testing/hostile_checkpoints.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s KIND N DIR (kinds above)\n", argv[0]);
    return 2;
  }
  const std::string kind = argv[1];
  const uint64_t n = std::strtoull(argv[2], nullptr, 10);
  ckpt::testing::HostileCheckpoint h;
  if (kind == "coverage") {
    h = ckpt::testing::CoverageBomb(n);
  } else if (kind == "scalars") {
    h = ckpt::testing::ScalarChunks(n);
  } else if (kind == "zero-blocks") {
    h = ckpt::testing::ZeroBlocks(n << 20, 2);
  } else if (kind == "empty-chunks") {
    h = ckpt::testing::EmptyChunks(n, /*indexed=*/true);
  } else if (kind == "empty-chunks-unindexed") {
    h = ckpt::testing::EmptyChunks(n, /*indexed=*/false);
  } else if (kind == "scalar-entries") {
    h = ckpt::testing::ScalarEntries(n);
  } else {
    std::fprintf(stderr, "unknown kind '%s'\n", kind.c_str());
    return 2;
  }
  const uint64_t meta =
      ckpt::testing::WriteHostileCheckpoint(argv[3], std::move(h));
  std::printf("%s: %llu bytes of metadata\n", argv[3],
              static_cast<unsigned long long>(meta));
  return 0;
}

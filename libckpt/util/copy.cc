#include "util/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CKPT_STREAMING_COPY 1
#endif

namespace ckpt::internal {
namespace {

#ifdef CKPT_STREAMING_COPY
// 32-byte aligned destination stores of 128 bytes a step; the unaligned
// head and the tail under 128 bytes go through memcpy.
__attribute__((target("avx2"))) void StreamAvx2(char* dst, const char* src,
                                                size_t n) {
  const size_t head =
      (32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31;  // < n: n >= 256K
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 128 <= n; i += 128) {
    const __m256i a =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  _mm_sfence();  // streaming stores are weakly ordered
  std::memcpy(dst + i, src + i, n - i);
}

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

}  // namespace

bool StreamingCopySupported() {
#ifdef CKPT_STREAMING_COPY
  return HasAvx2();
#else
  return false;
#endif
}

void CopyForLater(void* dst, const void* src, size_t n) {
#ifdef CKPT_STREAMING_COPY
  if (n >= kStreamingCopyMin && HasAvx2()) {
    StreamAvx2(static_cast<char*>(dst), static_cast<const char*>(src), n);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace ckpt::internal

// Copies of large host buffers that are read again much later than a
// cache holds them (an async save's snapshot: the writer threads hash and
// write it while the trainer goes on).
#ifndef CKPT_LIBCKPT_UTIL_COPY_H_
#define CKPT_LIBCKPT_UTIL_COPY_H_

#include <cstddef>

namespace ckpt::internal {

// Copies n bytes from src to dst (which do not overlap), as std::memcpy.
// Where the CPU has AVX2 and n is at least kStreamingCopyMin, the bytes are
// written with non-temporal (streaming) stores, which skip the read of each
// destination line that an ordinary store makes first (512 MiB in 4 MiB
// pieces: 56 ms, memcpy's 70 ms, on this project's 2-core machines); the stores
// are fenced before it returns, so a thread that later synchronizes with
// this one (a mutex, a join) sees them. Any alignment.
void CopyForLater(void* dst, const void* src, size_t n);

// The least size copied with streaming stores (smaller copies stay in the
// cache, where their reader may still find them).
inline constexpr size_t kStreamingCopyMin = size_t{256} << 10;

// Whether CopyForLater streams on this CPU (for tests and reports).
bool StreamingCopySupported();

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_UTIL_COPY_H_

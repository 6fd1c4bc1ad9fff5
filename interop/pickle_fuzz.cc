// libFuzzer target: the restricted unpickler (interop/pickle.h) and the
// DCP metadata decoder on top of it (interop/dcp_metadata.h). Built with
// -DCKPT_FUZZ=ON (clang) as build-fuzz/fuzz/ckpt_fuzz_pickle; seeds from
// fuzz/make_corpus.sh (DCP .metadata files of torch 1.13 and of the
// current layout, a pickle calling os.system).
//
// Whatever the input: no crash, leak or unbounded allocation; what an
// unpickling holds is what it counted against its memory budget (measured
// with the allocator's own count), and a small budget (16 bytes per byte of
// input + 64 KiB, not the default's 64 MiB) is never exceeded; a pickle that
// decodes can be described; DCP metadata that decodes names only plain file
// names; a tensor record that decodes gathers within its storage.
#include <sanitizer/allocator_interface.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "ckpt/interop/dcp_metadata.h"
#include "ckpt/interop/pickle.h"
#include "fuzz_util.h"

using namespace ckpt::interop;

namespace {

// Bytes the process has allocated and not freed (ASan's count).
size_t Allocated() { return __sanitizer_get_current_allocated_bytes(); }

// Unpickles `in` under a budget of 16 bytes per byte + 64 KiB: it fails, or
// what it holds is within what it counted (plus the arena's first node and
// map), which is within the budget.
void CheckMemoryBound(absl::string_view in) {
  const uint64_t budget = 16 * in.size() + (64 << 10);
  const size_t before = Allocated();
  auto u = Unpickle(in, budget);
  if (!u.ok()) return;
  const size_t held = Allocated() - before;
  FUZZ_CHECK(u->memory.used() <= budget);
  FUZZ_CHECK(held <= u->memory.used() + 2048);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view in(reinterpret_cast<const char*>(data), size);
  CheckMemoryBound(in);
  auto u = Unpickle(in);
  if (u.ok()) {
    FUZZ_CHECK(u->root != nullptr);
    std::string d = DescribePy(*u->root, 200, 8);
    FUZZ_CHECK(d.size() <= 203);
    auto t = DecodeTorchTensor(*u->root);
    if (t.ok() && t->storage_numel <= (1u << 16)) {
      std::string storage(t->storage_numel * ckpt::DTypeSize(t->dtype), '\0');
      auto bytes = GatherTensor(*t, storage);
      if (bytes.ok()) FUZZ_CHECK(bytes->size() <= storage.size());
    }
  }
  auto m = DecodeDcpMetadata(in);
  if (m.ok()) {
    for (const DcpStorage& s : m->storage) {
      FUZZ_CHECK(!s.relative_path.empty());
      FUZZ_CHECK(s.relative_path.find('/') == std::string::npos);
      FUZZ_CHECK(s.relative_path != "..");
    }
  }
  return 0;
}

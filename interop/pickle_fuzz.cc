// libFuzzer target: the restricted unpickler (interop/pickle.h) and the
// DCP metadata decoder on top of it (interop/dcp_metadata.h). Built with
// -DCKPT_FUZZ=ON (clang) as build-fuzz/fuzz/ckpt_fuzz_pickle; seeds from
// fuzz/make_corpus.sh (DCP .metadata files of torch 1.13 and of the
// current layout, a pickle calling os.system).
//
// Whatever the input: no crash, leak or unbounded allocation; a pickle that
// decodes can be described; DCP metadata that decodes names only plain
// file names; a tensor record that decodes gathers within its storage.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "ckpt/interop/dcp_metadata.h"
#include "ckpt/interop/pickle.h"

#define FUZZ_CHECK(cond)                                               \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, \
                   __LINE__, #cond);                                   \
      __builtin_trap();                                                \
    }                                                                  \
  } while (0)

using namespace ckpt::interop;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view in(reinterpret_cast<const char*>(data), size);
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

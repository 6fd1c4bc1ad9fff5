// libFuzzer target: the safetensors header codec and the Hugging Face
// index parser (interop/safetensors.h) on a whole file image. Built with
// -DCKPT_FUZZ=ON (clang) as build-fuzz/fuzz/ckpt_fuzz_safetensors_header;
// seeds from fuzz/make_corpus.sh (the reference implementation's sample
// files and exports by ckpt-convert).
//
// A header that decodes must re-encode (EncodeSafetensorsHeader) to one
// that decodes to the same tensors and metadata; an index that decodes
// must re-encode to one that decodes to the same weight map.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "ckpt/interop/safetensors.h"
#include "fuzz_util.h"

namespace {

using namespace ckpt::interop;

bool SameTensors(const SafetensorsHeader& a, const SafetensorsHeader& b) {
  if (a.tensors.size() != b.tensors.size() || a.metadata != b.metadata)
    return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape ||
        x.begin != y.begin || x.end != y.end) {
      return false;
    }
  }
  return true;
}

void CheckHeader(absl::string_view in) {
  auto n = DecodeSafetensorsHeaderLength(in, in.size());
  if (!n.ok()) return;
  auto h = DecodeSafetensorsHeader(in.substr(8, *n), in.size() - 8 - *n);
  if (!h.ok()) return;
  auto re = EncodeSafetensorsHeader(h->tensors, h->metadata);
  FUZZ_CHECK(re.ok());
  FUZZ_CHECK(re->size() % 8 == 0);
  const uint64_t data = h->tensors.empty() ? 0 : h->tensors.back().end;
  auto n2 = DecodeSafetensorsHeaderLength(*re, re->size() + data);
  FUZZ_CHECK(n2.ok());
  auto h2 =
      DecodeSafetensorsHeader(absl::string_view(*re).substr(8, *n2), data);
  FUZZ_CHECK(h2.ok());
  FUZZ_CHECK(SameTensors(*h, *h2));
}

void CheckIndex(absl::string_view in) {
  auto idx = DecodeHfIndex(in);
  if (!idx.ok()) return;
  auto again = DecodeHfIndex(EncodeHfIndex(*idx));
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->weight_map == idx->weight_map);
  FUZZ_CHECK(again->files == idx->files);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view in(reinterpret_cast<const char*>(data), size);
  CheckHeader(in);
  CheckIndex(in);
  (void)ParseByteSize(in.substr(0, 32));
  return 0;
}

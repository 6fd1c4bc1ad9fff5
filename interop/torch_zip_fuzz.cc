// libFuzzer target: the zip reader of torch.save records
// (interop/torch_zip.h), then the record's data.pkl and tensor as DCP
// import reads them. Built with -DCKPT_FUZZ=ON (clang) as
// build-fuzz/fuzz/ckpt_fuzz_torch_zip; seeds from fuzz/make_corpus.sh
// (records of torch 1.13 and of the current layout, a deflated and an
// overlapping record).
//
// Every entry of an accepted archive lies inside the input, entries do not
// overlap, and everything after parsing stays within the input.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/interop/dcp_metadata.h"
#include "ckpt/interop/pickle.h"
#include "ckpt/interop/torch_zip.h"
#include "fuzz_util.h"

using namespace ckpt::interop;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view in(reinterpret_cast<const char*>(data), size);
  auto zip = ParseZip(in);
  if (!zip.ok()) return 0;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const ZipEntry& e : zip->entries) {
    FUZZ_CHECK(e.data_offset <= size && e.size <= size - e.data_offset);
    ranges.emplace_back(e.data_offset, e.data_offset + e.size);
    (void)VerifyZipEntry(in, e);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    FUZZ_CHECK(ranges[i].first >= ranges[i - 1].second);
  auto rec = FindTorchRecord(*zip);
  if (!rec.ok()) return 0;
  auto u = Unpickle(in.substr(rec->pickle->data_offset, rec->pickle->size));
  if (!u.ok()) return 0;
  auto t = DecodeTorchTensor(*u->root);
  if (!t.ok()) return 0;
  const ZipEntry* st = rec->Storage(*zip, t->storage_key);
  if (st == nullptr) return 0;
  auto bytes = GatherTensor(*t, in.substr(st->data_offset, st->size));
  if (bytes.ok()) FUZZ_CHECK(bytes->size() <= st->size);
  return 0;
}

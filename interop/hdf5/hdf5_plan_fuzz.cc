// libFuzzer target: PlanImport and the element reader of ckpt-convert
// --from hdf5 (hdf5_plan.h) on an HDF5 file image. Built with -DCKPT_FUZZ=ON
// (clang) as build-fuzz/fuzz/ckpt_fuzz_hdf5_plan; seeds: any .h5 files,
// e.g. those ckpt-convert --to hdf5 writes and plain h5py files.
//
// Each input is planned twice (strict and --skip-unsupported); whenever a
// plan succeeds, its promises must hold: valid and unique entry names,
// shapes within the format's limits, bytes = elements x element size,
// objects within their limit; and the data of small entries must read
// without crashing (errors are fine: HDF5 decodes hostile chunks).
//
// HDF5 itself is not instrumented, so coverage feedback stops at its API;
// a crash inside libhdf5 on a hostile file is still a finding (the tool
// would crash on that file).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "ckpt/format/names.h"
#include "ckpt/interop/hdf5/hdf5_plan.h"
#include "fuzz_util.h"

namespace {

using namespace ckpt;
using namespace ckpt::interop;

constexpr uint64_t kMaxReadPerEntry = 1 << 20;
constexpr uint64_t kMaxReadPerInput = 8 << 20;

void CheckPlan(hid_t file, const ImportPlan& plan) {
  absl::flat_hash_set<std::string> names;
  uint64_t total = 0, read = 0;
  for (const ImportPlanEntry& e : plan.entries) {
    FUZZ_CHECK(format::ValidateEntryName(e.name).ok());
    FUZZ_CHECK(names.insert(e.name).second);
    FUZZ_CHECK(ValidateShape(e.shape, DTypeSize(e.dtype)).ok());
    uint64_t numel = 1;
    for (uint64_t d : e.shape) numel *= d;
    if (e.kind == format::EntryKind::kObject) {
      FUZZ_CHECK(e.dtype == DType::kUInt8 && e.shape.size() == 1);
      FUZZ_CHECK(e.bytes == e.shape[0] && e.bytes <= kMaxImportObjectBytes);
    } else {
      FUZZ_CHECK(e.bytes == numel * DTypeSize(e.dtype));
    }
    total += e.bytes;
    if (e.bytes > kMaxReadPerEntry || read + e.bytes > kMaxReadPerInput)
      continue;
    read += e.bytes;
    if (e.kind == format::EntryKind::kObject) {
      auto bytes = ReadObjectBytes(file, e);
      if (bytes.ok()) FUZZ_CHECK(bytes->size() == e.bytes);
    } else if (numel > 0) {
      std::vector<char> buf(e.bytes);
      (void)ReadElements(file, e, 0, numel, buf.data());
      if (numel > 2) (void)ReadElements(file, e, 1, numel - 2, buf.data());
    }
  }
  FUZZ_CHECK(total == plan.logical_bytes);
  FUZZ_CHECK(plan.metadata.size() <= format::kMaxMetadataEntries);
  for (const auto& [k, v] : plan.metadata) {
    FUZZ_CHECK(format::ValidateMetadataKey(k).ok());
    FUZZ_CHECK(v.size() <= format::kMaxMetadataValueLength);
  }
}

}  // namespace

// libhdf5 1.10 leaks on some of its own error paths for corrupt object
// headers (found by this target; not instrumented, not ours): those leaks
// are suppressed, leaks of allocations made outside libhdf5 are not.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libhdf5\n";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  hdf5::Hdf5Lock lock;
  auto file = OpenHdf5Image(
      absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) return 0;
  for (bool skip : {false, true}) {
    PlanOptions o;
    o.skip_unsupported = skip;
    absl::StatusOr<ImportPlan> plan = PlanImport(file->get(), o);
    if (plan.ok()) CheckPlan(file->get(), *plan);
  }
  return 0;
}

// ckpt-convert IN.h5 DST --from hdf5: imports an HDF5 file as a one-rank
// checkpoint (tools/README.md (ckpt-convert)).
//
// Every dataset becomes one entry (names: hdf5_names.h; types:
// hdf5_types.h); datasets with ckpt_kind = "object" and opaque datasets
// become objects; root attributes become user metadata (except the
// reserved ckpt_* ones that ckpt-convert --to hdf5 writes). Both files
// written by ckpt-convert and plain files written by h5py are read.
//
// The file is planned first (hdf5_plan.h: every name, type, shape and
// attribute checked, no data read); data is then read in bounded pieces, as
// ckpt::Writer asks for them (Writer::AddTensorSource).
#ifndef CKPT_INTEROP_HDF5_HDF5_IMPORT_H_
#define CKPT_INTEROP_HDF5_HDF5_IMPORT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt/interop/hdf5/hdf5_plan.h"
#include "ckpt/writer.h"

namespace ckpt::interop {

struct Hdf5ImportOptions {
  PlanOptions plan;
  std::optional<uint64_t> step;  // default: the file's ckpt_step, else 0
  bool overwrite = false;        // replace an existing checkpoint of that step
  format::Codec codec = format::Codec::kNone;
  int zstd_level = 3;
  int io_threads = 4;
  // Where the checkpoint is written (not owned; null = POSIX). The HDF5
  // file is always local.
  Storage* storage = nullptr;
  // Called with the bytes of each piece read and the total bytes of the
  // import (from the writer's I/O threads, one call at a time).
  std::function<void(uint64_t bytes, uint64_t total)> progress;
};

struct Hdf5ImportResult {
  std::string input;
  ImportPlan plan;
  uint64_t step = 0;
  SaveResult saved;  // saved.path: the committed checkpoint directory
};

// Imports `input` into the checkpoint root `root` (created if missing) as
// step `options.step`. Errors: those of OpenHdf5File and PlanImport;
// FailedPrecondition if `root` exists and is not a directory;
// AlreadyExists if the step exists and !overwrite; DataLoss for read
// errors, naming the file and dataset; the Writer's errors.
absl::StatusOr<Hdf5ImportResult> ImportHdf5(const std::string& input,
                                            const std::string& root,
                                            const Hdf5ImportOptions& options);

}  // namespace ckpt::interop

#endif  // CKPT_INTEROP_HDF5_HDF5_IMPORT_H_

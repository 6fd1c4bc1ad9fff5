#include "ckpt/interop/hdf5/hdf5_import.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/ops/checkpoint_root.h"

namespace ckpt::interop {

using hdf5::Handle;
using hdf5::Hdf5Lock;

namespace {

// Registers every entry of `plan` with `writer`: objects read now, tensors
// as sources that read their elements from `fid` when the save asks.
absl::Status AddEntries(Writer* writer, hid_t fid, const ImportPlan& plan,
                        const std::string& input,
                        const Hdf5ImportOptions& options) {
  const uint64_t total = plan.logical_bytes;
  for (const ImportPlanEntry& e : plan.entries) {
    if (e.kind == format::EntryKind::kObject) {
      absl::StatusOr<std::string> bytes;
      {
        Hdf5Lock lock;
        bytes = ReadObjectBytes(fid, e);
      }
      if (!bytes.ok()) return Annotate(bytes.status(), input);
      if (options.progress) options.progress(bytes->size(), total);
      CKPT_RETURN_IF_ERROR(writer->SetObject(e.name, *std::move(bytes)));
      continue;
    }
    const uint64_t es = DTypeSize(e.dtype);
    TensorSource source = [fid, &e, es, total, &input, &options](
                              uint64_t offset, void* dst,
                              uint64_t n) -> absl::Status {
      if (offset % es != 0 || n % es != 0) {
        return absl::InternalError(absl::StrCat(
            "entry '", format::EscapeText(e.name), "': byte range [", offset,
            ", ", offset + n, ") is not whole elements"));
      }
      Hdf5Lock lock;
      absl::Status s = ReadElements(fid, e, offset / es, n / es, dst);
      if (!s.ok()) return Annotate(s, input);
      // Under the lock: one progress call at a time.
      if (options.progress) options.progress(n, total);
      return absl::OkStatus();
    };
    CKPT_RETURN_IF_ERROR(writer->AddTensorSource(
        e.name, e.dtype, e.shape, FullBox(e.shape), std::move(source)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Hdf5ImportResult> ImportHdf5(const std::string& input,
                                            const std::string& root,
                                            const Hdf5ImportOptions& options) {
  Storage* storage =
      options.storage != nullptr ? options.storage : DefaultStorage();
  CKPT_RETURN_IF_ERROR(ops::CheckRootIsDirectoryOrAbsent(storage, root));
  Hdf5ImportResult result;
  result.input = input;
  Handle file;
  {
    Hdf5Lock lock;
    CKPT_ASSIGN_OR_RETURN(file, OpenHdf5File(input));
    auto plan = PlanImport(file.get(), options.plan);
    if (!plan.ok()) {
      file.Reset();
      return Annotate(plan.status(), input);
    }
    result.plan = *std::move(plan);
  }
  // The file is closed (under the lock) however this function returns.
  struct CloseFile {
    Handle& f;
    ~CloseFile() {
      Hdf5Lock lock;
      f.Reset();
    }
  } close_file{file};

  result.step = options.step.value_or(result.plan.step.value_or(0));
  CKPT_RETURN_IF_ERROR(
      ops::CheckStepIsFree(storage, root, result.step, options.overwrite));
  Writer::Options wo;
  wo.storage = storage;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Writer> writer, Writer::Create(wo));
  CKPT_RETURN_IF_ERROR(
      AddEntries(writer.get(), file.get(), result.plan, input, options));
  SaveOptions so;
  so.codec = options.codec;
  so.zstd_level = options.zstd_level;
  so.io_threads = options.io_threads;
  so.overwrite = options.overwrite;
  so.metadata = result.plan.metadata;
  CKPT_ASSIGN_OR_RETURN(result.saved, writer->Save(root, result.step, so));
  return result;
}

}  // namespace ckpt::interop

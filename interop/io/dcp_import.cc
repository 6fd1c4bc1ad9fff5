#include "ckpt/interop/io/dcp_import.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "ckpt/interop/io/dcp_reader.h"
#include "ckpt/ops/checkpoint_root.h"
#include "ckpt/writer.h"
#include "nlohmann/json.hpp"
#include "util/mutex.h"
#include "util/rank_status.h"

namespace ckpt::interop {
namespace {

// The bytes of one chunk, read on the first request and dropped once every
// byte has been served (the writer asks for each byte once per save).
class ChunkSource {
 public:
  ChunkSource(const DcpInput& in, const interop::DcpTensor& t, size_t chunk,
              uint64_t bytes, std::function<void(uint64_t)> progress)
      : in_(in),
        t_(t),
        chunk_(chunk),
        total_(bytes),
        progress_(std::move(progress)) {}
  absl::Status Read(uint64_t offset, void* dst, uint64_t n) {
    MutexLock lock(&mu_);
    if (!loaded_) {
      CKPT_ASSIGN_OR_RETURN(data_, ReadDcpChunk(in_, t_, chunk_));
      loaded_ = true;
    }
    if (offset > data_.size() || n > data_.size() - offset) {
      return absl::InternalError(
          absl::StrCat("chunk of '", format::EscapeText(t_.fqn), "': bytes [",
                       offset, ", ", offset + n, ") asked of ", data_.size()));
    }
    std::memcpy(dst, data_.data() + offset, n);
    served_ += n;
    if (progress_) progress_(n);
    if (served_ >= total_) std::string().swap(data_);
    return absl::OkStatus();
  }

 private:
  const DcpInput& in_;
  const interop::DcpTensor& t_;
  const size_t chunk_;
  const uint64_t total_;
  std::function<void(uint64_t)> progress_;
  Mutex mu_;
  bool loaded_ ABSL_GUARDED_BY(mu_) = false;
  std::string data_ ABSL_GUARDED_BY(mu_);
  uint64_t served_ ABSL_GUARDED_BY(mu_) = 0;
};

format::Metadata UserMetadata(const DcpInput& in) {
  format::Metadata m = {{"dcp.module", in.meta.module}};
  if (!in.meta.version.empty()) m.emplace_back("dcp.version", in.meta.version);
  if (!in.meta.checkpoint_id.empty())
    m.emplace_back("dcp.checkpoint_id", in.meta.checkpoint_id);
  if (in.meta.rank_local_files > 0) {
    m.emplace_back("dcp.rank_local_metadata",
                   std::to_string(in.meta.rank_local_files));
  }
  if (!in.megatron_json.empty())
    m.emplace_back("megatron.metadata.json", in.megatron_json);
  nlohmann::ordered_json renamed = nlohmann::ordered_json::object();
  for (const auto& [fqn, name] : in.object_names) {
    if (name != fqn) renamed[name] = fqn;
  }
  if (!renamed.empty())
    m.emplace_back("megatron.sharded_objects", renamed.dump());
  return m;
}

// What rank `rank` registers: its chunks, and on rank 0 the objects.
absl::Status RegisterRank(const DcpInput& in, int rank, Writer& w,
                          std::vector<std::unique_ptr<ChunkSource>>& sources,
                          const std::function<void(uint64_t)>& progress) {
  for (const interop::DcpTensor& t : in.meta.tensors) {
    const auto& storage = in.chunk_storage.at(t.fqn);
    for (size_t i = 0; i < t.chunks.size(); ++i) {
      if (in.file_rank.at(storage[i]->relative_path) != rank) continue;
      const interop::DcpChunk& c = t.chunks[i];
      const Box box{c.offsets, c.sizes};
      const uint64_t bytes = RegionElements(box) * DTypeSize(t.dtype);
      sources.push_back(
          std::make_unique<ChunkSource>(in, t, i, bytes, progress));
      ChunkSource* src = sources.back().get();
      CKPT_RETURN_IF_ERROR(
          w.AddTensorSource(t.fqn, t.dtype, t.size, box,
                            [src](uint64_t offset, void* dst, uint64_t n) {
                              return src->Read(offset, dst, n);
                            }));
    }
  }
  if (rank != 0) return absl::OkStatus();
  for (const auto& [fqn, name] : in.object_names) {
    CKPT_ASSIGN_OR_RETURN(std::string bytes, ReadDcpBytes(in, fqn));
    absl::Status set = w.SetObject(name, std::move(bytes));
    if (!set.ok()) {
      return absl::Status(
          set.code(),
          absl::StrCat(in.metadata_where, ": bytes item '",
                       format::EscapeText(fqn), "': ", set.message()));
    }
  }
  if (in.common != nullptr) {
    CKPT_ASSIGN_OR_RETURN(std::string bytes,
                          in.common->Read(0, in.common->size()));
    CKPT_RETURN_IF_ERROR(w.SetObject(kCommonStateEntry, std::move(bytes)));
  }
  return absl::OkStatus();
}

// One rank's part of the conversion: registers what it writes, agrees with
// the others that every rank could, then saves.
absl::StatusOr<std::string> ConvertRank(
    const DcpInput& in, Communicator& comm, Storage* storage,
    const std::string& root, uint64_t step, const SaveOptions& so,
    const std::function<void(uint64_t)>& progress) {
  std::unique_ptr<Writer> w;
  std::vector<std::unique_ptr<ChunkSource>> sources;
  absl::Status registered = [&]() -> absl::Status {
    Writer::Options wo;
    wo.comm = &comm;
    wo.storage = storage;
    CKPT_ASSIGN_OR_RETURN(w, Writer::Create(wo));
    return RegisterRank(in, comm.rank(), *w, sources, progress);
  }();
  CKPT_RETURN_IF_ERROR(internal::AgreeOnFirstError(comm, registered));
  CKPT_ASSIGN_OR_RETURN(SaveResult saved, w->Save(root, step, so));
  return saved.path;
}

void Summarize(const DcpInput& in, DcpImportResult& r) {
  for (const interop::DcpTensor& t : in.meta.tensors) {
    uint64_t n = DTypeSize(t.dtype);
    for (uint64_t d : t.size) n *= d;
    r.entries.push_back({t.fqn, false, t.dtype, t.size, t.chunks.size(), n});
    r.logical_bytes += n;
  }
  for (const auto& [fqn, name] : in.object_names) {
    const uint64_t n = in.bytes_storage.at(fqn)->length;
    r.entries.push_back({name, true, DType::kUInt8, {n}, 1, n});
    r.logical_bytes += n;
  }
  if (in.common != nullptr) {
    const uint64_t n = in.common->size();
    r.entries.push_back({kCommonStateEntry, true, DType::kUInt8, {n}, 1, n});
    r.logical_bytes += n;
  }
  std::sort(r.entries.begin(), r.entries.end(),
            [](const DcpImportedEntry& a, const DcpImportedEntry& b) {
              return a.name < b.name;
            });
}

}  // namespace

absl::StatusOr<DcpImportResult> ImportDcp(const std::string& dir,
                                          const std::string& root,
                                          const DcpImportOptions& o) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<DcpInput> in, OpenDcp(dir));
  return ImportOpenedDcp(*in, root, o);
}

absl::StatusOr<DcpImportResult> ImportOpenedDcp(const DcpInput& in,
                                                const std::string& root,
                                                const DcpImportOptions& o) {
  if (std::vector<absl::Status> bad = EntryNameProblems(in); !bad.empty())
    return bad.front();
  DcpImportResult r;
  r.input = in.dir;
  r.format = in.megatron ? "Megatron torch_dist" : "PyTorch DCP";
  r.module = in.meta.module;
  r.step = o.step.value_or(0);
  r.world_size = in.world_size;
  Summarize(in, r);
  SaveOptions so;
  so.codec = o.codec;
  so.io_threads = std::max(1, o.io_threads / in.world_size);
  so.overwrite = o.overwrite;
  so.metadata = UserMetadata(in);
  r.metadata_keys = so.metadata.size();
  Storage* storage = o.storage != nullptr ? o.storage : DefaultStorage();
  CKPT_RETURN_IF_ERROR(ops::CheckRootIsDirectoryOrAbsent(storage, root));
  CKPT_RETURN_IF_ERROR(
      ops::CheckStepIsFree(storage, root, r.step, o.overwrite));
  Mutex progress_mu;
  std::function<void(uint64_t)> progress;
  if (o.progress) {
    progress = [&](uint64_t n) {
      MutexLock lock(&progress_mu);
      o.progress(n, in.tensor_bytes);
    };
  }
  InProcessWorld world(in.world_size);
  std::vector<std::string> paths(in.world_size);
  CKPT_RETURN_IF_ERROR(RunRanks(world, [&](Communicator& comm) -> absl::Status {
    CKPT_ASSIGN_OR_RETURN(
        paths[comm.rank()],
        ConvertRank(in, comm, storage, root, r.step, so, progress));
    return absl::OkStatus();
  }));
  r.checkpoint = paths[0];
  return r;
}

}  // namespace ckpt::interop

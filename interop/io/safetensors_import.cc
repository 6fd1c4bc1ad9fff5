#include "ckpt/interop/io/safetensors_import.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/ops/checkpoint_root.h"
#include "ckpt/ops/reshard.h"

namespace ckpt::interop {
namespace fs = std::filesystem;
namespace {

absl::Status Annotated(const absl::Status& s, const std::string& file) {
  return absl::Status(s.code(), absl::StrCat(file, ": ", s.message()));
}

absl::StatusOr<interop::SafetensorsHeader> ReadHeader(const InputFile& f) {
  char first8[8] = {};
  if (f.size() >= 8) CKPT_RETURN_IF_ERROR(f.ReadAt(0, 8, first8));
  auto n = interop::DecodeSafetensorsHeaderLength(absl::string_view(first8, 8),
                                                  f.size());
  if (!n.ok()) return Annotated(n.status(), f.path());
  CKPT_ASSIGN_OR_RETURN(std::string json, f.Read(8, *n));
  auto h = interop::DecodeSafetensorsHeader(json, f.size() - 8 - *n);
  if (!h.ok()) return Annotated(h.status(), f.path());
  h->data_offset = 8 + *n;
  return h;
}

// The index file of a directory: model.safetensors.index.json, else the
// only *.safetensors.index.json; or "" and the single model.safetensors.
absl::StatusOr<std::string> ResolveDirectory(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / interop::kHfIndexName, ec)) {
    return (fs::path(dir) / interop::kHfIndexName).string();
  }
  std::vector<std::string> indexes, files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (absl::EndsWith(name, ".safetensors.index.json"))
      indexes.push_back(it->path().string());
    if (absl::EndsWith(name, ".safetensors"))
      files.push_back(it->path().string());
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": cannot list the directory: ", ec.message()));
  }
  if (indexes.size() == 1) return indexes[0];
  if (indexes.empty() && files.size() == 1) return files[0];
  return absl::NotFoundError(
      absl::StrCat(dir, ": holds no ", interop::kHfIndexName, " (",
                   indexes.size(), " index files and ", files.size(),
                   " .safetensors files found; give the file to read)"));
}

// Checks that the index maps exactly the tensors of its shards.
absl::Status CheckIndex(const SafetensorsInput& in) {
  std::map<std::string, std::string> where;
  for (const auto& [tensor, file] : in.hf_index.weight_map)
    where[tensor] = file;
  std::map<std::string, std::string> found;
  for (size_t i = 0; i < in.files.size(); ++i) {
    const std::string file = fs::path(in.files[i].path()).filename().string();
    for (const auto& t : in.headers[i].tensors) {
      auto it = where.find(t.name);
      if (it == where.end()) {
        return absl::DataLossError(absl::StrCat(
            in.index_path, ": tensor '", format::EscapeText(t.name), "' of ",
            format::EscapeText(file), " is not in the weight_map"));
      }
      if (it->second != file) {
        return absl::DataLossError(absl::StrCat(
            in.index_path, ": tensor '", format::EscapeText(t.name), "' is in ",
            format::EscapeText(file), " but mapped to ",
            format::EscapeText(it->second)));
      }
      found[t.name] = file;
    }
  }
  for (const auto& [tensor, file] : where) {
    if (!found.count(tensor)) {
      return absl::DataLossError(absl::StrCat(
          in.index_path, ": weight_map maps '", format::EscapeText(tensor),
          "' to ", format::EscapeText(file), ", which does not hold it"));
    }
  }
  return absl::OkStatus();
}

absl::Status OpenFile(SafetensorsInput& in, const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(InputFile f, InputFile::Open(path));
  CKPT_ASSIGN_OR_RETURN(interop::SafetensorsHeader h, ReadHeader(f));
  in.files.push_back(std::move(f));
  in.headers.push_back(std::move(h));
  return absl::OkStatus();
}

absl::Status OpenIndex(SafetensorsInput& in, const std::string& index_path) {
  in.index = true;
  in.index_path = index_path;
  CKPT_ASSIGN_OR_RETURN(InputFile idx, InputFile::Open(index_path));
  if (idx.size() > interop::kSafetensorsMaxHeader) {
    return absl::DataLossError(absl::StrCat(
        index_path, ": index of ", idx.size(), " bytes exceeds the limit of ",
        interop::kSafetensorsMaxHeader));
  }
  CKPT_ASSIGN_OR_RETURN(std::string text, idx.Read(0, idx.size()));
  auto index = interop::DecodeHfIndex(text);
  if (!index.ok()) return Annotated(index.status(), index_path);
  in.hf_index = *std::move(index);
  const fs::path dir = fs::path(index_path).parent_path();
  for (const std::string& f : in.hf_index.files) {
    CKPT_RETURN_IF_ERROR(OpenFile(in, (dir / f).string()));
  }
  return CheckIndex(in);
}

}  // namespace

bool LooksLikeSafetensors(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return ResolveDirectory(path).ok();
  return absl::EndsWith(path, ".safetensors") ||
         absl::EndsWith(path, ".safetensors.index.json");
}

absl::StatusOr<SafetensorsInput> OpenSafetensors(const std::string& path) {
  SafetensorsInput in;
  in.path = path;
  std::string target = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    CKPT_ASSIGN_OR_RETURN(target, ResolveDirectory(path));
  }
  if (absl::EndsWith(target, ".json")) {
    CKPT_RETURN_IF_ERROR(OpenIndex(in, target));
  } else {
    CKPT_RETURN_IF_ERROR(OpenFile(in, target));
  }
  std::map<std::string, SafetensorsInput::Ref> refs;
  for (size_t i = 0; i < in.files.size(); ++i) {
    for (const auto& t : in.headers[i].tensors) {
      if (!refs.emplace(t.name, SafetensorsInput::Ref{t.name, i, &t}).second) {
        return absl::DataLossError(absl::StrCat(
            in.files[i].path(), ": tensor '", format::EscapeText(t.name),
            "' is also in ", in.files[refs[t.name].file].path()));
      }
    }
  }
  for (auto& [_, r] : refs) in.tensors.push_back(r);
  if (!in.headers.empty()) in.metadata = in.headers[0].metadata;
  return in;
}

namespace {

// Registers every tensor of `in` with `writer` (objects as objects).
absl::Status Register(const SafetensorsInput& in, const ImportedMetadata& meta,
                      Writer& writer, SafetensorsImportResult& r,
                      const SafetensorsImportOptions& o) {
  uint64_t total = 0;
  for (const auto& ref : in.tensors)
    total += ref.tensor->end - ref.tensor->begin;
  for (const auto& ref : in.tensors) {
    const interop::SafetensorsTensor& t = *ref.tensor;
    const InputFile& f = in.files[ref.file];
    const uint64_t base = in.headers[ref.file].data_offset + t.begin;
    const bool object = meta.objects.count(t.name) > 0;
    r.entries.push_back({t.name, object, t.dtype, t.shape,
                         fs::path(f.path()).filename().string(),
                         t.end - t.begin});
    r.logical_bytes += t.end - t.begin;
    if (object) {
      if (t.dtype != DType::kUInt8 || t.shape.size() != 1) {
        return absl::DataLossError(
            absl::StrCat(f.path(), ": '", format::EscapeText(t.name),
                         "' is listed in ckpt.objects but is not 1-d U8"));
      }
      CKPT_ASSIGN_OR_RETURN(std::string bytes, f.Read(base, t.end - t.begin));
      if (o.progress) o.progress(bytes.size(), total);
      CKPT_RETURN_IF_ERROR(writer.SetObject(t.name, std::move(bytes)));
      continue;
    }
    TensorSource source = [&f, base, total, &o](uint64_t offset, void* dst,
                                                uint64_t n) -> absl::Status {
      CKPT_RETURN_IF_ERROR(f.ReadAt(base + offset, n, dst));
      if (o.progress) o.progress(n, total);
      return absl::OkStatus();
    };
    CKPT_RETURN_IF_ERROR(writer.AddTensorSource(
        t.name, t.dtype, t.shape, FullBox(t.shape), std::move(source)));
  }
  for (const std::string& name : meta.objects) {
    if (std::none_of(in.tensors.begin(), in.tensors.end(),
                     [&](const auto& ref) { return ref.name == name; })) {
      return absl::DataLossError(absl::StrCat(
          in.path, ": ckpt.objects names '", name, "', which is not a tensor"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsImportResult> ImportSafetensors(
    const std::string& input, const std::string& root,
    const SafetensorsImportOptions& o) {
  if (o.ranks < 1 || o.ranks > ops::kMaxReshardRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ranks ", o.ranks, " is outside 1..", ops::kMaxReshardRanks));
  }
  CKPT_ASSIGN_OR_RETURN(SafetensorsInput in, OpenSafetensors(input));
  auto meta = ImportMetadata(in.metadata);
  if (!meta.ok()) return Annotated(meta.status(), in.files[0].path());
  SafetensorsImportResult r;
  r.input = input;
  r.step = o.step.value_or(meta->step.value_or(0));
  r.ranks = o.ranks;
  r.files = in.files.size();
  r.metadata_keys = meta->user.size();
  Storage* storage = o.storage != nullptr ? o.storage : DefaultStorage();
  CKPT_RETURN_IF_ERROR(ops::CheckRootIsDirectoryOrAbsent(storage, root));
  CKPT_RETURN_IF_ERROR(
      ops::CheckStepIsFree(storage, root, r.step, o.overwrite));
  // With --ranks N the file is imported on one rank into a temporary root
  // beside `root` and resharded from there (ckpt-reshard's inference).
  const bool reshard = o.ranks > 1;
  const std::string target =
      reshard ? absl::StrCat(root, ".import-tmp-", ::getpid()) : root;
  struct Cleanup {
    Storage* storage;
    std::string dir;
    ~Cleanup() {
      // Best effort: what is left is an uncommitted temporary root.
      if (!dir.empty()) storage->RemoveAll(dir).IgnoreError();
    }
  } cleanup{storage, reshard ? target : ""};

  Writer::Options wo;
  wo.storage = storage;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Writer> writer, Writer::Create(wo));
  CKPT_RETURN_IF_ERROR(Register(in, *meta, *writer, r, o));
  SaveOptions so;
  so.codec = o.codec;
  so.io_threads = std::max(1, o.io_threads);
  so.overwrite = o.overwrite;
  so.metadata = meta->user;
  CKPT_ASSIGN_OR_RETURN(SaveResult saved, writer->Save(target, r.step, so));
  r.checkpoint = saved.path;
  if (!reshard) return r;
  ops::ReshardOptions ro;
  ro.src = saved.path;
  ro.dst = root;
  ro.to = o.ranks;
  ro.codec = o.codec;
  ro.threads = std::max(1, o.io_threads);
  ro.storage = storage;
  CKPT_ASSIGN_OR_RETURN(ops::ReshardReport report, ops::Reshard(ro));
  r.checkpoint = report.dst_dir;
  return r;
}

}  // namespace ckpt::interop

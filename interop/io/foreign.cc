#include "ckpt/interop/io/foreign.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "ckpt/format/names.h"
#include "ckpt/interop/dcp_metadata.h"
#include "ckpt/interop/io/dcp_reader.h"
#include "ckpt/interop/io/safetensors_import.h"

namespace ckpt::interop {
namespace fs = std::filesystem;
namespace {

using format::EscapeText;

std::string Plural(size_t n, const char* one, const char* many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

}  // namespace

InputFormat DetectFormat(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (LooksLikeDcp(path)) return InputFormat::kDcp;
    if (fs::exists(fs::path(path) / "MANIFEST", ec) ||
        fs::exists(fs::path(path) / "latest", ec)) {
      return InputFormat::kCkpt;
    }
    return LooksLikeSafetensors(path) ? InputFormat::kSafetensors
                                      : InputFormat::kCkpt;
  }
  if (fs::is_regular_file(path, ec) && LooksLikeSafetensors(path))
    return InputFormat::kSafetensors;
  return InputFormat::kCkpt;
}

const char* FormatWord(InputFormat f) {
  return f == InputFormat::kDcp           ? "dcp"
         : f == InputFormat::kSafetensors ? "safetensors"
                                          : "ckpt";
}

std::string DcpFormatName(const DcpInput& in) {
  const int n = in.meta.rank_local_files;
  return absl::StrCat(
      in.megatron ? "Megatron torch_dist (PyTorch DCP" : "PyTorch DCP (",
      in.megatron ? ", " : "", EscapeText(in.meta.module),
      n > 0
          ? absl::StrCat("; rank-local metadata, ", Plural(n, "file", "files"))
          : "",
      ")");
}

std::string SafetensorsFormatName(const SafetensorsInput& in) {
  return in.index
             ? absl::StrCat("Hugging Face safetensors index (",
                            Plural(in.files.size(), "shard", "shards"), ")")
             : "safetensors (one file)";
}

ForeignValidation ValidateDcp(const std::string& path) {
  ForeignValidation v;
  v.path = path;
  v.format = "PyTorch DCP";
  auto in = OpenDcp(path);
  if (!in.ok()) {
    v.errors.push_back(std::string(in.status().message()));
    v.checked = "metadata";
    return v;
  }
  v.format = DcpFormatName(**in);
  for (const absl::Status& bad : EntryNameProblems(**in))
    v.errors.push_back(std::string(bad.message()));
  size_t chunks = 0, records = 0;
  for (const DcpTensor& t : (*in)->meta.tensors) {
    for (size_t i = 0; i < t.chunks.size(); ++i, ++chunks) {
      auto bytes = ReadDcpChunk(**in, t, i);
      if (!bytes.ok()) {
        v.errors.push_back(std::string(bytes.status().message()));
      } else {
        ++records;
      }
    }
  }
  for (const std::string& b : (*in)->meta.bytes_items) {
    auto bytes = ReadDcpBytes(**in, b);
    if (!bytes.ok()) {
      v.errors.push_back(std::string(bytes.status().message()));
      continue;
    }
    if (DescribeTorchRecord(*bytes).rfind("opaque: zip", 0) == 0) {
      v.warnings.push_back(absl::StrCat("bytes item '", EscapeText(b),
                                        "' is not a torch.save record"));
    }
    ++records;
  }
  v.checked = absl::StrCat(
      "metadata, coverage of ",
      Plural((*in)->meta.tensors.size(), "tensor", "tensors"), " (",
      Plural(chunks, "chunk", "chunks"), ") and ",
      Plural((*in)->meta.bytes_items.size(), "bytes item", "bytes items"), ", ",
      Plural((*in)->files.size(), "data file", "data files"), ", ", records,
      " of ", chunks + (*in)->meta.bytes_items.size(),
      " records read and verified (zip structure, CRC-32, dtype and size)");
  return v;
}

ForeignValidation ValidateSafetensors(const std::string& path) {
  ForeignValidation v;
  v.path = path;
  v.format = "safetensors";
  auto in = OpenSafetensors(path);
  if (!in.ok()) {
    v.errors.push_back(std::string(in.status().message()));
    v.checked = "header";
    return v;
  }
  v.format = SafetensorsFormatName(*in);
  uint64_t bytes = 0;
  for (const auto& r : in->tensors) bytes += r.tensor->end - r.tensor->begin;
  if (in->index && in->hf_index.has_total_size &&
      in->hf_index.total_size != bytes) {
    v.warnings.push_back(absl::StrCat(in->index_path, ": metadata.total_size ",
                                      in->hf_index.total_size, " != ", bytes,
                                      " bytes of the tensors"));
  }
  v.checked = absl::StrCat(
      in->index ? "index, " : "", "headers of ",
      Plural(in->files.size(), "file", "files"), " (",
      Plural(in->tensors.size(), "tensor", "tensors"),
      ": dtypes, shapes, offsets contiguous and covering the data); "
      "safetensors stores no checksums, so values are not verified");
  return v;
}

}  // namespace ckpt::interop

#include "ckpt/interop/io/dcp_reader.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ckpt/format/geometry.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/interop/torch_zip.h"
#include "nlohmann/json.hpp"

namespace ckpt::interop {
namespace fs = std::filesystem;
namespace {

constexpr uint64_t kMaxMetadataBytes = 1ull << 30;
constexpr int kMaxRank = 65535;

absl::Status At(const absl::Status& s, const std::string& where) {
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

// The rank r of a data file "__<r>_<n>.distcp", or -1.
int RankOfDataFile(const std::string& name) {
  if (!absl::StartsWith(name, "__") || !absl::EndsWith(name, ".distcp"))
    return -1;
  std::vector<std::string> parts = absl::StrSplit(
      name.substr(2, name.size() - 2 - std::string(".distcp").size()), '_');
  int rank = 0, n = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &rank) ||
      !absl::SimpleAtoi(parts[1], &n) || rank < 0 || rank > kMaxRank) {
    return -1;
  }
  return rank;
}

// The rank of a data file, 0 for other names.
int RankOfFile(const std::string& name) {
  return std::max(0, RankOfDataFile(name));
}

// The rank r of a rank-local metadata file "__<r>.metadata", or -1.
int RankOfMetadataFile(const std::string& name) {
  constexpr absl::string_view kSuffix = ".metadata";
  if (!absl::StartsWith(name, "__") || !absl::EndsWith(name, kSuffix))
    return -1;
  int rank = 0;
  if (!absl::SimpleAtoi(name.substr(2, name.size() - 2 - kSuffix.size()),
                        &rank) ||
      rank < 0 || rank > kMaxRank) {
    return -1;
  }
  return rank;
}

absl::StatusOr<interop::DcpMetadata> ReadMetadataFile(const std::string& md) {
  CKPT_ASSIGN_OR_RETURN(InputFile f, InputFile::Open(md));
  if (f.size() > kMaxMetadataBytes) {
    return absl::DataLossError(absl::StrCat(
        md, ": ", f.size(), " bytes exceed the limit of ", kMaxMetadataBytes));
  }
  CKPT_ASSIGN_OR_RETURN(std::string bytes, f.Read(0, f.size()));
  auto meta = interop::DecodeDcpMetadata(bytes);
  if (!meta.ok()) return At(meta.status(), md);
  return meta;
}

// The ranks of the directory's rank-local metadata files and data files.
struct RankFiles {
  std::set<int> metadata, data;
};

absl::StatusOr<RankFiles> ListRankFiles(const std::string& dir) {
  RankFiles r;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (int m = RankOfMetadataFile(name); m >= 0) r.metadata.insert(m);
    if (int d = RankOfDataFile(name); d >= 0) r.data.insert(d);
  }
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": cannot list the directory: ", ec.message()));
  }
  return r;
}

// The rank-local metadata of ranks 0..N-1, merged: every rank below the
// highest one has its file, and so has every rank that wrote a data file.
absl::Status ReadRankLocalMetadata(DcpInput& in) {
  CKPT_ASSIGN_OR_RETURN(RankFiles files, ListRankFiles(in.dir));
  const fs::path dir(in.dir);
  if (files.metadata.empty()) {
    return absl::NotFoundError(
        absl::StrCat((dir / ".metadata").string(),
                     ": no such file, nor rank-local __0.metadata"));
  }
  const int n = *files.metadata.rbegin() + 1;
  auto missing = [&](int r, const std::string& why) {
    return absl::NotFoundError(absl::StrCat(
        (dir / absl::StrCat("__", r, ".metadata")).string(),
        ": missing (rank-local metadata, one file per rank): ", why));
  };
  for (int r = 0; r < n; ++r) {
    if (!files.metadata.count(r)) {
      return missing(r, absl::StrCat("__", n - 1, ".metadata exists"));
    }
  }
  if (!files.data.empty() && *files.data.rbegin() >= n) {
    const int r = *files.data.rbegin();
    return missing(n, absl::StrCat("rank ", r, " wrote __", r, "_*.distcp"));
  }
  std::vector<interop::DcpMetadata> ranks;
  for (int r = 0; r < n; ++r) {
    CKPT_ASSIGN_OR_RETURN(
        interop::DcpMetadata m,
        ReadMetadataFile((dir / absl::StrCat("__", r, ".metadata")).string()));
    ranks.push_back(std::move(m));
  }
  in.metadata_where =
      absl::StrCat((dir / "__0.metadata").string(),
                   n > 1 ? absl::StrCat(" .. __", n - 1, ".metadata") : "");
  auto merged = interop::MergeRankLocalDcpMetadata(std::move(ranks));
  if (!merged.ok()) return At(merged.status(), in.metadata_where);
  in.meta = *std::move(merged);
  in.world_size = std::max(in.world_size, n);
  return absl::OkStatus();
}

// ".metadata", or where there is none, the rank-local files.
absl::Status ReadMetadata(DcpInput& in) {
  const std::string md = (fs::path(in.dir) / ".metadata").string();
  std::error_code ec;
  if (!fs::exists(md, ec)) return ReadRankLocalMetadata(in);
  in.metadata_where = md;
  CKPT_ASSIGN_OR_RETURN(in.meta, ReadMetadataFile(md));
  return absl::OkStatus();
}

absl::Status OpenFiles(DcpInput& in) {
  for (const interop::DcpStorage& s : in.meta.storage) {
    if (in.files.count(s.relative_path)) continue;
    CKPT_ASSIGN_OR_RETURN(
        InputFile f,
        InputFile::Open((fs::path(in.dir) / s.relative_path).string()));
    in.files[s.relative_path] = std::make_shared<InputFile>(std::move(f));
    const int rank = RankOfFile(s.relative_path);
    in.file_rank[s.relative_path] = rank;
    in.world_size = std::max(in.world_size, rank + 1);
  }
  for (const interop::DcpStorage& s : in.meta.storage) {
    const InputFile& f = *in.files[s.relative_path];
    if (s.offset > f.size() || s.length > f.size() - s.offset) {
      return absl::DataLossError(absl::StrCat(
          f.path(), ": '", s.fqn, "' is stored at [", s.offset, ", ",
          s.offset + s.length, "), outside the file (", f.size(), " bytes)"));
    }
  }
  return absl::OkStatus();
}

std::string Where(const DcpInput& in, const interop::DcpStorage& s) {
  return absl::StrCat(in.files.at(s.relative_path)->path(), " [", s.offset,
                      ", ", s.offset + s.length, ") of '",
                      format::EscapeText(s.fqn), "'");
}

// DataLoss unless the record `s` of chunk `box` of `t` has room for the
// chunk's bytes (a torch.save record stores them uncompressed), so that
// what is planned from the metadata is bounded by the files on disk.
absl::Status CheckRecordHolds(const DcpInput& in, const interop::DcpStorage& s,
                              const interop::DcpTensor& t, const Box& box) {
  const uint64_t bytes = RegionElements(box) * DTypeSize(t.dtype);
  if (bytes <= s.length) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      Where(in, s), ": ", s.length, " bytes, too few for chunk ",
      RegionToString(box), " (", bytes, " bytes of ", DTypeName(t.dtype), ")"));
}

// Storage items by (name, chunk offsets); bytes items have no offsets.
// Keys as std::vector: gcc 12 warns (maybe-uninitialized) about temporary
// empty InlinedVectors.
using StorageKey = std::pair<std::string, std::vector<uint64_t>>;
using StorageByKey = std::map<StorageKey, const interop::DcpStorage*>;

// Every storage item of `in` by its key; DataLoss for two of one key.
absl::StatusOr<StorageByKey> IndexStorage(const DcpInput& in) {
  StorageByKey by_key;
  for (const interop::DcpStorage& s : in.meta.storage) {
    std::vector<uint64_t> offs;
    if (s.offsets.has_value())
      offs.assign(s.offsets->begin(), s.offsets->end());
    if (!by_key.emplace(StorageKey(s.fqn, offs), &s).second) {
      return absl::DataLossError(
          absl::StrCat(in.metadata_where, ": '", format::EscapeText(s.fqn),
                       "' at ", ShapeToString(offs), " has two storage items"));
    }
  }
  return by_key;
}

// The storage item of each chunk of tensor `t` (into in.chunk_storage),
// each chunk inside the tensor and holding its bytes, the chunks covering
// it without overlap. Counts the items used in *used.
absl::Status MatchTensor(DcpInput& in, const interop::DcpTensor& t,
                         const StorageByKey& by_key, size_t* used) {
  const std::string& md = in.metadata_where;
  in.chunk_storage[t.fqn];  // present even for a tensor without chunks
  std::vector<Region> regions;
  for (const interop::DcpChunk& c : t.chunks) {
    Box box{c.offsets, c.sizes};
    absl::Status v = ValidateRegion(box, t.size);
    if (!v.ok())
      return absl::DataLossError(absl::StrCat(
          md, ": tensor '", format::EscapeText(t.fqn), "': ", v.message()));
    regions.push_back(box);
    auto it = by_key.find(StorageKey(
        t.fqn, std::vector<uint64_t>(c.offsets.begin(), c.offsets.end())));
    if (it == by_key.end()) {
      return absl::DataLossError(
          absl::StrCat(md, ": chunk ", RegionToString(box), " of '",
                       format::EscapeText(t.fqn), "' has no storage item"));
    }
    CKPT_RETURN_IF_ERROR(CheckRecordHolds(in, *it->second, t, box));
    in.chunk_storage[t.fqn].push_back(it->second);
    in.tensor_bytes += RegionElements(box) * DTypeSize(t.dtype);
    ++*used;
  }
  absl::Status cover = CheckCover(t.size, regions, /*allow_gaps=*/false);
  if (!cover.ok()) {
    return absl::DataLossError(absl::StrCat(
        md, ": tensor '", format::EscapeText(t.fqn), "': ", cover.message()));
  }
  return absl::OkStatus();
}

// The storage item of each bytes item (into in.bytes_storage), counted in
// *used.
absl::Status MatchBytesItems(DcpInput& in, const StorageByKey& by_key,
                             size_t* used) {
  for (const std::string& b : in.meta.bytes_items) {
    auto it = by_key.find(StorageKey(b, std::vector<uint64_t>()));
    if (it == by_key.end()) {
      return absl::DataLossError(
          absl::StrCat(in.metadata_where, ": bytes item '",
                       format::EscapeText(b), "' has no storage item"));
    }
    in.bytes_storage[b] = it->second;
    in.bytes_item_bytes += it->second->length;
    ++*used;
  }
  return absl::OkStatus();
}

// Each chunk has exactly one storage item; each item names a chunk or a
// bytes item; chunks cover their tensor without overlap.
absl::Status MatchStorage(DcpInput& in) {
  CKPT_ASSIGN_OR_RETURN(const StorageByKey by_key, IndexStorage(in));
  size_t used = 0;
  for (const interop::DcpTensor& t : in.meta.tensors) {
    CKPT_RETURN_IF_ERROR(MatchTensor(in, t, by_key, &used));
  }
  CKPT_RETURN_IF_ERROR(MatchBytesItems(in, by_key, &used));
  if (used == in.meta.storage.size()) return absl::OkStatus();
  for (const interop::DcpStorage& s : in.meta.storage) {
    bool known = in.bytes_storage.count(s.fqn) > 0;
    for (const auto* p : in.chunk_storage[s.fqn]) known = known || p == &s;
    if (!known) {
      return absl::DataLossError(absl::StrCat(
          in.metadata_where, ": storage item of '", format::EscapeText(s.fqn),
          "' names no chunk of the metadata"));
    }
  }
  return absl::OkStatus();
}

// Each bytes item's ckpt name: a Megatron ShardedObject's mapped, others
// their own.
void NameObjects(DcpInput& in) {
  for (const std::string& b : in.meta.bytes_items) {
    std::optional<std::string> mapped;
    if (in.megatron) mapped = interop::MegatronShardedObjectName(b);
    in.object_names[b] = mapped.value_or(b);
  }
}

absl::Status ReadMegatron(DcpInput& in) {
  const fs::path json = fs::path(in.dir) / "metadata.json";
  std::error_code ec;
  if (!fs::exists(json, ec)) return absl::OkStatus();
  CKPT_ASSIGN_OR_RETURN(InputFile f, InputFile::Open(json.string()));
  if (f.size() > (1u << 20))
    return absl::DataLossError(absl::StrCat(f.path(), ": too large"));
  CKPT_ASSIGN_OR_RETURN(in.megatron_json, f.Read(0, f.size()));
  nlohmann::json j = nlohmann::json::parse(in.megatron_json, nullptr, false);
  in.megatron = j.is_object() && j.contains("sharded_backend") &&
                j["sharded_backend"].is_string() &&
                j["sharded_backend"] == "torch_dist";
  const fs::path common = fs::path(in.dir) / "common.pt";
  if (fs::exists(common, ec)) {
    // Opened now, so that a common.pt that cannot be read (a directory,
    // say) fails every tool that opens the checkpoint, naming it.
    CKPT_ASSIGN_OR_RETURN(InputFile f, InputFile::Open(common.string()));
    in.common = std::make_shared<InputFile>(std::move(f));
  }
  return absl::OkStatus();
}

// The record at `s`, read whole, parsed as a zip with every entry's CRC
// verified.
struct Record {
  std::string bytes;
  interop::ZipArchive zip;
  interop::TorchRecord torch;
};

// FailedPrecondition if `s` is stored through stream transforms
// (FileSystemWriter's _extensions), which are not undone here.
absl::Status CheckNoTransforms(const DcpInput& in,
                               const interop::DcpStorage& s) {
  if (s.transform_descriptors.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      Where(in, s), ": stored through the stream transforms [",
      absl::StrJoin(s.transform_descriptors, ", "),
      "] (FileSystemWriter _extensions), which ckpt does not undo"));
}

// True iff `f` holds a safetensors header at `offset`: an 8-byte
// little-endian length that fits the file, then '{'.
absl::StatusOr<bool> SafetensorsAt(const InputFile& f, uint64_t offset) {
  if (offset > f.size() || f.size() - offset < 9) return false;
  CKPT_ASSIGN_OR_RETURN(std::string head, f.Read(offset, 9));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(head[i]);
  return head[8] == '{' && n >= 2 && n <= f.size() - offset - 8;
}

// FileSystemWriter(serialization_format=SAFETENSORS) writes, after a data
// file's bytes items, one safetensors file of the rank's tensors, and gives
// every tensor item the range [start of that file, + its byte size).
absl::Status CheckNotSafetensors(const DcpInput& in,
                                 const interop::DcpStorage& s) {
  CKPT_ASSIGN_OR_RETURN(bool safetensors,
                        SafetensorsAt(*in.files.at(s.relative_path), s.offset));
  if (!safetensors) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      Where(in, s),
      ": a safetensors file, not a torch.save record: written by "
      "FileSystemWriter(serialization_format=SAFETENSORS), whose tensors ckpt "
      "does not read (nor does torch's FileSystemReader)"));
}

absl::StatusOr<Record> ReadRecord(const DcpInput& in,
                                  const interop::DcpStorage& s) {
  const InputFile& f = *in.files.at(s.relative_path);
  const std::string where = Where(in, s);
  CKPT_RETURN_IF_ERROR(CheckNoTransforms(in, s));
  CKPT_RETURN_IF_ERROR(CheckNotSafetensors(in, s));
  Record r;
  CKPT_ASSIGN_OR_RETURN(r.bytes, f.Read(s.offset, s.length));
  auto zip = interop::ParseZip(r.bytes);
  if (!zip.ok()) return At(zip.status(), where);
  r.zip = *std::move(zip);
  for (const interop::ZipEntry& e : r.zip.entries) {
    absl::Status v = interop::VerifyZipEntry(r.bytes, e);
    if (!v.ok()) return At(v, where);
  }
  auto torch = interop::FindTorchRecord(r.zip);
  if (!torch.ok()) return At(torch.status(), where);
  r.torch = *torch;
  return r;
}

}  // namespace

bool LooksLikeDcp(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) &&
         (fs::exists(fs::path(dir) / ".metadata", ec) ||
          fs::exists(fs::path(dir) / "__0.metadata", ec));
}

absl::StatusOr<std::unique_ptr<DcpInput>> OpenDcp(const std::string& dir) {
  auto in = std::make_unique<DcpInput>();
  in->dir = dir;
  CKPT_RETURN_IF_ERROR(ReadMetadata(*in));
  CKPT_RETURN_IF_ERROR(OpenFiles(*in));
  CKPT_RETURN_IF_ERROR(MatchStorage(*in));
  CKPT_RETURN_IF_ERROR(ReadMegatron(*in));
  NameObjects(*in);
  return in;
}

std::vector<absl::Status> EntryNameProblems(const DcpInput& in) {
  struct Item {
    std::string what;  // "tensor 'w'", "bytes item 'a/shard_0_1'"
    std::string name;  // its ckpt entry name
  };
  std::vector<Item> items;
  for (const interop::DcpTensor& t : in.meta.tensors)
    items.push_back(
        {absl::StrCat("tensor '", format::EscapeText(t.fqn), "'"), t.fqn});
  for (const auto& [fqn, name] : in.object_names) {
    items.push_back(
        {absl::StrCat("bytes item '", format::EscapeText(fqn), "'",
                      fqn == name ? "" : " (Megatron ShardedObject)"),
         name});
  }
  if (in.common != nullptr)
    items.push_back({in.common->path(), kCommonStateEntry});
  std::vector<absl::Status> problems;
  std::map<std::string, const Item*> seen;
  for (const Item& item : items) {
    absl::Status valid = format::ValidateEntryName(item.name);
    if (!valid.ok()) {
      problems.push_back(absl::FailedPreconditionError(
          absl::StrCat(in.metadata_where, ": ", item.what,
                       " cannot be a ckpt entry: ", valid.message())));
      continue;
    }
    auto [it, fresh] = seen.emplace(item.name, &item);
    if (!fresh) {
      problems.push_back(absl::FailedPreconditionError(
          absl::StrCat(in.metadata_where, ": ", it->second->what, " and ",
                       item.what, " would both be the ckpt entry '",
                       format::EscapeText(item.name), "'")));
    }
  }
  return problems;
}

absl::StatusOr<std::string> ReadDcpChunk(const DcpInput& in,
                                         const interop::DcpTensor& t,
                                         size_t chunk) {
  const interop::DcpStorage& s = *in.chunk_storage.at(t.fqn).at(chunk);
  const interop::DcpChunk& c = t.chunks[chunk];
  const std::string where = Where(in, s);
  CKPT_ASSIGN_OR_RETURN(Record r, ReadRecord(in, s));
  auto root = interop::Unpickle(absl::string_view(r.bytes).substr(
      r.torch.pickle->data_offset, r.torch.pickle->size));
  if (!root.ok()) return At(root.status(), where);
  auto ref = interop::DecodeTorchTensor(*root->root);
  if (!ref.ok()) return At(ref.status(), where);
  if (ref->dtype != t.dtype || ref->size != c.sizes) {
    return absl::DataLossError(
        absl::StrCat(where, ": holds ", DTypeName(ref->dtype), " ",
                     ShapeToString(ref->size), ", the metadata says ",
                     DTypeName(t.dtype), " ", ShapeToString(c.sizes)));
  }
  const interop::ZipEntry* st = r.torch.Storage(r.zip, ref->storage_key);
  if (st == nullptr) {
    return absl::DataLossError(
        absl::StrCat(where, ": storage '", format::EscapeText(ref->storage_key),
                     "' missing"));
  }
  auto bytes = interop::GatherTensor(
      *ref, absl::string_view(r.bytes).substr(st->data_offset, st->size));
  if (!bytes.ok()) return At(bytes.status(), where);
  return bytes;
}

absl::StatusOr<std::string> ReadDcpBytes(const DcpInput& in,
                                         const std::string& fqn) {
  const interop::DcpStorage& s = *in.bytes_storage.at(fqn);
  CKPT_RETURN_IF_ERROR(CheckNoTransforms(in, s));
  return in.files.at(s.relative_path)->Read(s.offset, s.length);
}

std::string DescribeTorchRecord(absl::string_view record) {
  auto zip = interop::ParseZip(record);
  if (!zip.ok()) return absl::StrCat("opaque: ", zip.status().message());
  auto torch = interop::FindTorchRecord(*zip);
  if (!torch.ok()) return absl::StrCat("opaque: ", torch.status().message());
  auto root = interop::Unpickle(
      record.substr(torch->pickle->data_offset, torch->pickle->size));
  if (!root.ok()) return absl::StrCat("opaque: ", root.status().message());
  return interop::DescribePy(*root->root);
}

}  // namespace ckpt::interop

#include "ckpt/interop/dcp_metadata.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::interop {
namespace {

using Kind = PyValue::Kind;

absl::Status Bad(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("DCP metadata: ", what));
}

// A field of a dataclass object: its BUILD state is a dict, or (slots) a
// (dict-or-None, dict) pair.
const PyValue* Field(const PyValue& obj, absl::string_view name) {
  const PyValue* s = obj.state;
  if (s == nullptr) return nullptr;
  if (s->Is(Kind::kDict)) return s->Get(name);
  if (s->Is(Kind::kTuple) && s->items.size() == 2) {
    for (const PyValue* part : s->items) {
      if (part->Is(Kind::kDict)) {
        if (const PyValue* v = part->Get(name)) return v;
      }
    }
  }
  return nullptr;
}

// A shape, offsets or sizes: at most kMaxDims non-negative integers (so
// that a shared tuple of millions cannot be copied into every chunk).
absl::StatusOr<Dims> IntTuple(const PyValue* v, absl::string_view what) {
  if (v == nullptr || !(v->Is(Kind::kTuple) || v->Is(Kind::kList))) {
    return Bad(absl::StrCat(what, " is not a tuple of integers"));
  }
  if (v->items.size() > format::kMaxDims) {
    return Bad(absl::StrCat(what, " has ", v->items.size(),
                            " dimensions; the limit is ", format::kMaxDims));
  }
  Dims out;
  for (const PyValue* x : v->items) {
    if (!x->Is(Kind::kInt) || x->integer < 0) {
      return Bad(absl::StrCat(
          what, " holds something other than a non-negative integer"));
    }
    out.push_back(static_cast<uint64_t>(x->integer));
  }
  return out;
}

absl::StatusOr<uint64_t> NonNegative(const PyValue* v, absl::string_view what) {
  if (v == nullptr || !v->Is(Kind::kInt) || v->integer < 0) {
    return Bad(absl::StrCat(what, " is not a non-negative integer"));
  }
  return static_cast<uint64_t>(v->integer);
}

// TensorProperties: a (dtype, layout, requires_grad, memory_format,
// pin_memory) tuple from __getstate__, or a dict.
absl::StatusOr<std::string> DtypeOf(const PyValue* props,
                                    const std::string& fqn) {
  if (props == nullptr || !IsDcpClass(*props, "TensorProperties") ||
      props->state == nullptr) {
    return Bad(absl::StrCat("tensor '", format::EscapeText(fqn),
                            "': properties are not TensorProperties"));
  }
  const PyValue* d =
      props->state->Is(Kind::kTuple) && !props->state->items.empty()
          ? props->state->items[0]
          : Field(*props, "dtype");
  if (d == nullptr || !d->Is(Kind::kGlobal)) {
    return Bad(absl::StrCat("tensor '", format::EscapeText(fqn),
                            "': no dtype in its properties"));
  }
  return std::string(d->text);
}

// Heap bytes of a std::string of `n` characters (none within libstdc++'s
// small string buffer) and of Dims of `n` dims (none within its inline 4).
uint64_t TextBytes(size_t n) { return n > 15 ? n + 1 : 0; }
uint64_t DimsBytes(size_t n) { return n > 4 ? 8 * n : 0; }

// A tensor's size as ckpt checks its own shapes (format's ValidateShape:
// at most kMaxDims dims, element and byte counts in int64), before any
// element count is computed from it.
absl::Status CheckTensorSize(const DcpTensor& t) {
  absl::Status s = ValidateShape(t.size, DTypeSize(t.dtype));
  if (s.ok()) return s;
  return Bad(absl::StrCat("tensor '", format::EscapeText(t.fqn), "' (",
                          format::EscapeText(t.dtype_name),
                          "): ", s.message()));
}

absl::StatusOr<DcpTensor> DecodeTensor(const std::string& fqn, const PyValue& v,
                                       MemoryBudget& budget) {
  DcpTensor t;
  t.fqn = fqn;
  CKPT_ASSIGN_OR_RETURN(t.dtype_name, DtypeOf(Field(v, "properties"), fqn));
  auto dtype = DTypeFromTorch(t.dtype_name);
  if (!dtype.ok()) {
    return absl::Status(dtype.status().code(),
                        absl::StrCat("tensor '", format::EscapeText(fqn),
                                     "': ", dtype.status().message()));
  }
  t.dtype = *dtype;
  CKPT_ASSIGN_OR_RETURN(
      t.size,
      IntTuple(Field(v, "size"),
               absl::StrCat("size of '", format::EscapeText(fqn), "'")));
  CKPT_RETURN_IF_ERROR(CheckTensorSize(t));
  const PyValue* chunks = Field(v, "chunks");
  if (chunks == nullptr || !chunks->Is(Kind::kList)) {
    return Bad(absl::StrCat("tensor '", format::EscapeText(fqn),
                            "': chunks is not a list"));
  }
  // A chunk list or chunk the pickle shares between tensors is copied into
  // each: what is built is charged to the pickle's budget.
  auto what = [&] {
    return absl::StrCat("DCP metadata: the chunks of tensor '",
                        format::EscapeText(fqn), "'");
  };
  CKPT_RETURN_IF_ERROR(
      budget.Charge(chunks->items.size() * sizeof(DcpChunk), what));
  t.chunks.reserve(chunks->items.size());
  for (const PyValue* c : chunks->items) {
    if (!IsDcpClass(*c, "ChunkStorageMetadata")) {
      return Bad(absl::StrCat("tensor '", format::EscapeText(fqn),
                              "': a chunk is not ChunkStorageMetadata"));
    }
    DcpChunk chunk;
    CKPT_ASSIGN_OR_RETURN(chunk.offsets,
                          IntTuple(Field(*c, "offsets"), "chunk offsets"));
    CKPT_ASSIGN_OR_RETURN(chunk.sizes,
                          IntTuple(Field(*c, "sizes"), "chunk sizes"));
    CKPT_RETURN_IF_ERROR(budget.Charge(
        DimsBytes(chunk.offsets.size()) + DimsBytes(chunk.sizes.size()), what));
    t.chunks.push_back(std::move(chunk));
  }
  return t;
}

bool PlainFileName(const std::string& f) {
  return !f.empty() && f != "." && f != ".." &&
         f.find('/') == std::string::npos &&
         f.find('\\') == std::string::npos && f.find('\0') == std::string::npos;
}

absl::StatusOr<DcpStorage> DecodeStorage(const PyValue& key,
                                         const PyValue& info,
                                         MemoryBudget& budget) {
  if (!IsDcpClass(key, "MetadataIndex") || !IsDcpClass(info, "_StorageInfo")) {
    return Bad("a storage_data item is not MetadataIndex -> _StorageInfo");
  }
  DcpStorage s;
  const PyValue* fqn = Field(key, "fqn");
  if (fqn == nullptr || !fqn->Is(Kind::kStr))
    return Bad("MetadataIndex.fqn is not a string");
  s.fqn = std::string(fqn->text);
  const PyValue* off = Field(key, "offset");
  if (off != nullptr && !off->Is(Kind::kNone)) {
    CKPT_ASSIGN_OR_RETURN(
        s.offsets, IntTuple(off, absl::StrCat("offset of '",
                                              format::EscapeText(s.fqn), "'")));
  }
  const PyValue* path = Field(info, "relative_path");
  if (path == nullptr || !path->Is(Kind::kStr)) {
    return Bad(absl::StrCat("'", format::EscapeText(s.fqn),
                            "': relative_path is not a string"));
  }
  s.relative_path = std::string(path->text);
  if (!PlainFileName(s.relative_path)) {
    return absl::FailedPreconditionError(
        absl::StrCat("DCP metadata: '", format::EscapeText(s.fqn),
                     "' is stored in '", format::EscapeText(s.relative_path),
                     "', which is not a file inside the checkpoint directory"));
  }
  CKPT_ASSIGN_OR_RETURN(
      s.offset, NonNegative(Field(info, "offset"), "_StorageInfo.offset"));
  CKPT_ASSIGN_OR_RETURN(
      s.length, NonNegative(Field(info, "length"), "_StorageInfo.length"));
  auto what = [&] {
    return absl::StrCat("DCP metadata: the storage of '",
                        format::EscapeText(s.fqn), "'");
  };
  CKPT_RETURN_IF_ERROR(
      budget.Charge(sizeof(DcpStorage) + TextBytes(s.fqn.size()) +
                        TextBytes(s.relative_path.size()) +
                        DimsBytes(s.offsets ? s.offsets->size() : 0),
                    what));
  const PyValue* td = Field(info, "transform_descriptors");
  if (td != nullptr && (td->Is(Kind::kList) || td->Is(Kind::kTuple))) {
    for (const PyValue* x : td->items) {
      if (!x->Is(Kind::kStr))
        return Bad("a transform descriptor is not a string");
      CKPT_RETURN_IF_ERROR(
          budget.Charge(sizeof(std::string) + TextBytes(x->text.size()), what));
      s.transform_descriptors.emplace_back(x->text);
    }
  }
  return s;
}

absl::Status DecodeStateDict(const PyValue* sdm, DcpMetadata& m,
                             MemoryBudget& budget) {
  if (sdm == nullptr || !sdm->Is(Kind::kDict))
    return Bad("state_dict_metadata is not a dict");
  m.tensors.reserve(sdm->DictSize());
  for (size_t i = 0; i < sdm->DictSize(); ++i) {
    const PyValue *k = sdm->Key(i), *v = sdm->Value(i);
    if (!k->Is(Kind::kStr))
      return Bad("a state_dict_metadata key is not a string");
    // The item, and its name again in the duplicate check below.
    CKPT_RETURN_IF_ERROR(
        budget.Charge(sizeof(DcpTensor) +
                          2 * (sizeof(std::string) + TextBytes(k->text.size())),
                      [&] {
                        return absl::StrCat("DCP metadata: the item '",
                                            format::EscapeText(k->text), "'");
                      }));
    if (IsDcpClass(*v, "BytesStorageMetadata")) {
      m.bytes_items.emplace_back(k->text);
    } else if (IsDcpClass(*v, "TensorStorageMetadata")) {
      CKPT_ASSIGN_OR_RETURN(DcpTensor t,
                            DecodeTensor(std::string(k->text), *v, budget));
      m.tensors.push_back(std::move(t));
    } else {
      return Bad(absl::StrCat("'", format::EscapeText(k->text),
                              "' is neither tensor nor bytes metadata"));
    }
  }
  std::sort(
      m.tensors.begin(), m.tensors.end(),
      [](const DcpTensor& a, const DcpTensor& b) { return a.fqn < b.fqn; });
  std::sort(m.bytes_items.begin(), m.bytes_items.end());
  std::vector<std::string> names = m.bytes_items;
  for (const DcpTensor& t : m.tensors) names.push_back(t.fqn);
  std::sort(names.begin(), names.end());
  auto dup = std::adjacent_find(names.begin(), names.end());
  if (dup != names.end())
    return Bad(absl::StrCat("'", format::EscapeText(*dup),
                            "' is in state_dict_metadata twice"));
  return absl::OkStatus();
}

// Metadata.all_local_plans: None or absent (nullopt), else a list of
// SavePlan, counted.
absl::StatusOr<std::optional<size_t>> CountLocalPlans(const PyValue* plans) {
  if (plans == nullptr || plans->Is(Kind::kNone)) return std::nullopt;
  if (!plans->Is(Kind::kList)) return Bad("all_local_plans is not a list");
  for (const PyValue* p : plans->items) {
    if (!p->IsObject("torch.distributed.checkpoint.planner.SavePlan")) {
      return Bad(absl::StrCat("all_local_plans holds ", DescribePy(*p, 80),
                              ", not a SavePlan"));
    }
  }
  return plans->items.size();
}

// "0.1" -> {0, 1}; nullopt unless '.'-joined decimal integers.
std::optional<std::vector<uint64_t>> DottedInts(absl::string_view s) {
  std::vector<uint64_t> out;
  for (absl::string_view part : absl::StrSplit(s, '.')) {
    uint64_t v = 0;
    if (part.empty() || part.size() > 18 ||
        part.find_first_not_of("0123456789") != absl::string_view::npos ||
        !absl::SimpleAtoi(part, &v)) {
      return std::nullopt;
    }
    out.push_back(v);
  }
  return out;
}

void SortMetadata(DcpMetadata& m) {
  std::sort(
      m.tensors.begin(), m.tensors.end(),
      [](const DcpTensor& a, const DcpTensor& b) { return a.fqn < b.fqn; });
  std::sort(m.bytes_items.begin(), m.bytes_items.end());
  std::sort(m.storage.begin(), m.storage.end(),
            [](const DcpStorage& a, const DcpStorage& b) {
              return std::tie(a.fqn, a.offsets) < std::tie(b.fqn, b.offsets);
            });
}

// Merging rank-local metadata: what the ranks merged so far hold, by name.
// Keys hold std::vectors: gcc 12 warns (maybe-uninitialized) about
// temporary empty InlinedVectors.
struct RankMerge {
  using ChunkKey = std::pair<std::string, std::vector<uint64_t>>;
  DcpMetadata m;
  std::map<std::string, std::pair<size_t, int>> tensors;  // index, rank
  std::map<std::string, int> bytes;                       // the first rank
  std::map<ChunkKey, std::pair<Dims, int>> chunks;        // sizes, rank
  std::set<ChunkKey> storage;

  static ChunkKey Key(const std::string& fqn, const std::optional<Dims>& d) {
    return {fqn, d ? std::vector<uint64_t>(d->begin(), d->end())
                   : std::vector<uint64_t>()};
  }
  absl::Status AddTensor(DcpTensor t, int rank);
  absl::Status AddBytesItem(const std::string& fqn, int rank);
  void AddStorage(DcpStorage s);
};

// "[4, 6]" (here, not format's ShapeToString: the fuzz targets compile
// this file without the format library).
std::string DimsText(const Dims& d) {
  return absl::StrCat("[", absl::StrJoin(d, ", "), "]");
}

absl::Status Disagree(int a, int b, absl::string_view what) {
  return Bad(absl::StrCat("the rank-local metadata of ranks ", a, " and ", b,
                          " disagree: ", what));
}

// Rank `rank`'s chunks of `t` that no rank before it holds are added;
// replicas (same offsets and sizes) are dropped.
absl::Status RankMerge::AddTensor(DcpTensor t, int rank) {
  if (auto b = bytes.find(t.fqn); b != bytes.end()) {
    return Disagree(b->second, rank,
                    absl::StrCat("'", format::EscapeText(t.fqn),
                                 "' is a bytes item on rank ", b->second,
                                 " and a tensor on rank ", rank));
  }
  auto [it, added] =
      tensors.emplace(t.fqn, std::make_pair(m.tensors.size(), rank));
  if (added)
    m.tensors.push_back(DcpTensor{t.fqn, t.dtype_name, t.dtype, t.size, {}});
  DcpTensor& into = m.tensors[it->second.first];
  const int first = it->second.second;
  if (into.dtype_name != t.dtype_name || into.size != t.size) {
    return Disagree(first, rank,
                    absl::StrCat("tensor '", format::EscapeText(t.fqn), "' is ",
                                 format::EscapeText(into.dtype_name), " ",
                                 DimsText(into.size), " on rank ", first,
                                 " and ", format::EscapeText(t.dtype_name), " ",
                                 DimsText(t.size), " on rank ", rank));
  }
  for (DcpChunk& c : t.chunks) {
    auto [old, fresh] =
        chunks.emplace(Key(t.fqn, c.offsets), std::make_pair(c.sizes, rank));
    if (!fresh && old->second.first != c.sizes) {
      return Disagree(old->second.second, rank,
                      absl::StrCat("the chunk of '", format::EscapeText(t.fqn),
                                   "' at ", DimsText(c.offsets), " has sizes ",
                                   DimsText(old->second.first), " on rank ",
                                   old->second.second, " and ",
                                   DimsText(c.sizes), " on rank ", rank));
    }
    if (fresh) into.chunks.push_back(std::move(c));
  }
  return absl::OkStatus();
}

absl::Status RankMerge::AddBytesItem(const std::string& fqn, int rank) {
  if (auto t = tensors.find(fqn); t != tensors.end()) {
    return Disagree(
        t->second.second, rank,
        absl::StrCat("'", format::EscapeText(fqn), "' is a tensor on rank ",
                     t->second.second, " and a bytes item on rank ", rank));
  }
  if (bytes.emplace(fqn, rank).second) m.bytes_items.push_back(fqn);
  return absl::OkStatus();
}

// The first storage item of each chunk or bytes item is kept: the one of
// the rank whose chunk AddTensor kept.
void RankMerge::AddStorage(DcpStorage s) {
  if (storage.insert(Key(s.fqn, s.offsets)).second) {
    m.storage.push_back(std::move(s));
  }
}

}  // namespace

absl::StatusOr<DType> DTypeFromTorch(absl::string_view name) {
  static const std::pair<const char*, DType> kMap[] = {
      {"torch.float32", DType::kFloat32},
      {"torch.float", DType::kFloat32},
      {"torch.float64", DType::kFloat64},
      {"torch.double", DType::kFloat64},
      {"torch.float16", DType::kFloat16},
      {"torch.half", DType::kFloat16},
      {"torch.bfloat16", DType::kBFloat16},
      {"torch.int8", DType::kInt8},
      {"torch.uint8", DType::kUInt8},
      {"torch.int16", DType::kInt16},
      {"torch.short", DType::kInt16},
      {"torch.int32", DType::kInt32},
      {"torch.int", DType::kInt32},
      {"torch.int64", DType::kInt64},
      {"torch.long", DType::kInt64},
      {"torch.bool", DType::kBool},
      {"torch.uint16", DType::kUInt16},
      {"torch.uint32", DType::kUInt32},
      {"torch.uint64", DType::kUInt64},
      {"torch.float8_e4m3fn", DType::kFloat8E4M3FN},
      {"torch.float8_e5m2", DType::kFloat8E5M2}};
  for (const auto& [n, d] : kMap) {
    if (name == n) return d;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("dtype ", name, " has no ckpt equivalent"));
}

absl::StatusOr<DcpMetadata> DecodeDcpMetadata(absl::string_view pickle_bytes) {
  CKPT_ASSIGN_OR_RETURN(Unpickled u, Unpickle(pickle_bytes));
  MemoryBudget& budget = u.memory;
  const PyValue& root = *u.root;
  if (!IsDcpClass(root, "Metadata")) {
    return Bad(
        absl::StrCat("the root is ", DescribePy(root, 80), ", not Metadata"));
  }
  DcpMetadata m;
  m.module = std::string(root.text.substr(0, root.text.rfind('.')));
  CKPT_RETURN_IF_ERROR(
      DecodeStateDict(Field(root, "state_dict_metadata"), m, budget));
  if (const PyValue* v = Field(root, "version");
      v != nullptr && v->Is(Kind::kStr)) {
    m.version = std::string(v->text);
  }
  if (const PyValue* sm = Field(root, "storage_meta");
      sm != nullptr && !sm->Is(Kind::kNone)) {
    m.has_storage_meta = true;
    if (const PyValue* id = Field(*sm, "checkpoint_id");
        id != nullptr && id->Is(Kind::kStr)) {
      m.checkpoint_id = std::string(id->text);
    }
  }
  const PyValue* pd = Field(root, "planner_data");
  m.has_planner_data = pd != nullptr && !pd->Is(Kind::kNone);
  CKPT_ASSIGN_OR_RETURN(m.all_local_plans,
                        CountLocalPlans(Field(root, "all_local_plans")));
  const PyValue* sd = Field(root, "storage_data");
  if (sd == nullptr || !sd->Is(Kind::kDict))
    return Bad("storage_data is not a dict");
  m.storage.reserve(sd->DictSize());
  for (size_t i = 0; i < sd->DictSize(); ++i) {
    CKPT_ASSIGN_OR_RETURN(DcpStorage s,
                          DecodeStorage(*sd->Key(i), *sd->Value(i), budget));
    m.storage.push_back(std::move(s));
  }
  SortMetadata(m);
  return m;
}

std::optional<std::string> MegatronShardedObjectName(absl::string_view fqn) {
  const size_t slash = fqn.find('/');
  if (slash == 0 || slash == absl::string_view::npos ||
      fqn.find('/', slash + 1) != absl::string_view::npos) {
    return std::nullopt;
  }
  const absl::string_view key = fqn.substr(0, slash);
  absl::string_view shard = fqn.substr(slash + 1);
  if (!absl::ConsumePrefix(&shard, "shard_")) return std::nullopt;
  const std::vector<absl::string_view> parts = absl::StrSplit(shard, '_');
  if (parts.size() != 2) return std::nullopt;
  const auto offset = DottedInts(parts[0]), shape = DottedInts(parts[1]);
  if (!offset || !shape ||
      (offset->size() != shape->size() &&
       offset->size() != shape->size() + 1)) {
    return std::nullopt;
  }
  const bool one_shard = offset->size() == shape->size() &&
                         std::all_of(shape->begin(), shape->end(),
                                     [](uint64_t d) { return d == 1; }) &&
                         std::all_of(offset->begin(), offset->end(),
                                     [](uint64_t o) { return o == 0; });
  if (one_shard) return std::string(key);
  return absl::StrCat(key, ":", fqn.substr(slash + 1));
}

absl::StatusOr<DcpMetadata> MergeRankLocalDcpMetadata(
    std::vector<DcpMetadata> ranks) {
  if (ranks.empty()) return Bad("no rank-local metadata to merge");
  RankMerge merge;
  DcpMetadata& m = merge.m;
  m.module = ranks[0].module;
  m.version = ranks[0].version;
  m.checkpoint_id = ranks[0].checkpoint_id;
  m.all_local_plans = ranks[0].all_local_plans;
  m.rank_local_files = static_cast<int>(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    DcpMetadata& r = ranks[i];
    const int rank = static_cast<int>(i);
    if (r.module != m.module || r.version != m.version) {
      return Disagree(
          0, rank,
          absl::StrCat("module ", format::EscapeText(m.module), " version '",
                       format::EscapeText(m.version), "' on rank 0, module ",
                       format::EscapeText(r.module), " version '",
                       format::EscapeText(r.version), "' on rank ", rank));
    }
    m.has_storage_meta = m.has_storage_meta || r.has_storage_meta;
    m.has_planner_data = m.has_planner_data || r.has_planner_data;
    for (DcpTensor& t : r.tensors) {
      CKPT_RETURN_IF_ERROR(merge.AddTensor(std::move(t), rank));
    }
    for (const std::string& b : r.bytes_items) {
      CKPT_RETURN_IF_ERROR(merge.AddBytesItem(b, rank));
    }
    for (DcpStorage& s : r.storage) merge.AddStorage(std::move(s));
  }
  SortMetadata(m);
  return std::move(m);
}

absl::StatusOr<TorchTensorRef> DecodeTorchTensor(const PyValue& root) {
  if (!root.IsObject("torch._utils._rebuild_tensor_v2") ||
      root.items.size() < 4) {
    return absl::DataLossError(absl::StrCat("torch record: data.pkl holds ",
                                            DescribePy(root, 80),
                                            ", not a tensor"));
  }
  const PyValue& pid = *root.items[0];
  if (!pid.Is(Kind::kPersistentId) || pid.items.size() != 5 ||
      !pid.items[0]->Is(Kind::kStr) || pid.items[0]->text != "storage" ||
      !pid.items[1]->Is(Kind::kGlobal) || !pid.items[2]->Is(Kind::kStr)) {
    return absl::DataLossError(
        "torch record: the tensor's storage is not ('storage', ...)");
  }
  TorchTensorRef t;
  const absl::string_view type = pid.items[1]->text;  // torch.FloatStorage
  static const std::pair<const char*, DType> kStorages[] = {
      {"torch.FloatStorage", DType::kFloat32},
      {"torch.DoubleStorage", DType::kFloat64},
      {"torch.HalfStorage", DType::kFloat16},
      {"torch.BFloat16Storage", DType::kBFloat16},
      {"torch.ByteStorage", DType::kUInt8},
      {"torch.CharStorage", DType::kInt8},
      {"torch.ShortStorage", DType::kInt16},
      {"torch.IntStorage", DType::kInt32},
      {"torch.LongStorage", DType::kInt64},
      {"torch.BoolStorage", DType::kBool},
      {"torch.UInt16Storage", DType::kUInt16},
      {"torch.UInt32Storage", DType::kUInt32},
      {"torch.UInt64Storage", DType::kUInt64},
      {"torch.Float8_e4m3fnStorage", DType::kFloat8E4M3FN},
      {"torch.Float8_e5m2Storage", DType::kFloat8E5M2}};
  bool found = false;
  for (const auto& [n, d] : kStorages) {
    if (type == n) {
      t.dtype = d;
      found = true;
    }
  }
  if (!found) {
    return absl::FailedPreconditionError(absl::StrCat(
        "torch record: storage type ", type, " has no ckpt dtype"));
  }
  t.storage_key = std::string(pid.items[2]->text);
  CKPT_ASSIGN_OR_RETURN(t.storage_numel,
                        NonNegative(pid.items[4], "storage numel"));
  CKPT_ASSIGN_OR_RETURN(t.storage_offset,
                        NonNegative(root.items[1], "storage offset"));
  CKPT_ASSIGN_OR_RETURN(t.size, IntTuple(root.items[2], "tensor size"));
  CKPT_ASSIGN_OR_RETURN(Dims stride, IntTuple(root.items[3], "tensor stride"));
  if (stride.size() != t.size.size()) {
    return absl::DataLossError("torch record: stride and size differ in rank");
  }
  t.stride.assign(stride.begin(), stride.end());
  return t;
}

absl::StatusOr<std::string> GatherTensor(const TorchTensorRef& t,
                                         absl::string_view storage) {
  const uint64_t es = DTypeSize(t.dtype);
  if (storage.size() / es < t.storage_numel) {
    return absl::DataLossError(absl::StrCat(
        "torch record: storage '", format::EscapeText(t.storage_key),
        "' holds ", storage.size(), " bytes, less than ", t.storage_numel,
        " elements"));
  }
  uint64_t n = 1, last = t.storage_offset;  // the highest element index used
  for (size_t d = 0; d < t.size.size(); ++d) {
    if (t.size[d] == 0) return std::string();
    if (t.size[d] > (1ull << 40) ||
        static_cast<uint64_t>(t.stride[d]) > (1ull << 40)) {
      return absl::DataLossError("torch record: size or stride out of range");
    }
    n *= t.size[d];
    last += (t.size[d] - 1) * static_cast<uint64_t>(t.stride[d]);
    if (n > (1ull << 40) || last > (1ull << 50)) {
      return absl::DataLossError("torch record: size or stride out of range");
    }
  }
  if (n > t.storage_numel) {
    // Only a view with zero strides (an expanded tensor) has more elements
    // than its storage; checkpoints hold none, and refusing them bounds the
    // output by the bytes read.
    return absl::DataLossError(absl::StrCat(
        "torch record: the tensor has ", n,
        " elements, more than its storage (", t.storage_numel, ")"));
  }
  if (last >= t.storage_numel) {
    return absl::DataLossError(
        absl::StrCat("torch record: the tensor reaches element ", last,
                     " of a storage of ", t.storage_numel));
  }
  std::string out(n * es, '\0');
  Dims idx(t.size.size(), 0);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t src = t.storage_offset;
    for (size_t d = 0; d < idx.size(); ++d)
      src += idx[d] * static_cast<uint64_t>(t.stride[d]);
    std::memcpy(out.data() + i * es, storage.data() + src * es, es);
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < t.size[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

}  // namespace ckpt::interop

#include "ckpt/interop/pickle.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::interop {
namespace {

using Kind = PyValue::Kind;

// What an allow-listed global may do.
enum class Role {
  kName,              // a value in itself (torch.float32, torch.FloatStorage)
  kSize,              // torch.Size(tuple) -> the tuple
  kOrderedDict,       // OrderedDict() / OrderedDict(pairs) -> a dict
  kRebuild,           // a tensor rebuild function -> an object of its args
  kRebuildParameter,  // _rebuild_parameter(tensor, ...) -> the tensor
  kGetLayout,         // torch.serialization._get_layout("torch.strided")
  kGetattr,           // builtins.getattr(<allow-listed enum>, "NAME")
  kEnum,              // an enum class: Enum(value) -> an object
  kClass,             // a dataclass: NEWOBJ + BUILD -> an object
  kPath,              // pathlib paths -> a string
};

constexpr const char* kDcpModules[] = {
    "torch.distributed.checkpoint.metadata",
    "torch.distributed._shard.checkpoint.metadata"};
constexpr const char* kDcpClasses[] = {"Metadata",
                                       "TensorStorageMetadata",
                                       "ChunkStorageMetadata",
                                       "BytesStorageMetadata",
                                       "MetadataIndex",
                                       "TensorProperties",
                                       "StorageMeta"};
// DCP's planner dataclasses (torch.distributed.checkpoint.planner), which
// Megatron-Core (>= 0.12) pickles into Metadata.all_local_plans: a SavePlan
// per rank of WriteItems (MetadataIndex, WriteItemType, TensorWriteData of a
// ChunkStorageMetadata, TensorProperties and torch.Size; BytesIOWriteData).
// Plain data like the metadata classes: NEWOBJ + BUILD, nothing called.
constexpr const char* kPlannerModule = "torch.distributed.checkpoint.planner";
constexpr const char* kPlannerClasses[] = {
    "SavePlan", "WriteItem", "TensorWriteData", "BytesIOWriteData"};
constexpr const char* kDtypes[] = {
    "float32",     "float",     "float64",    "double", "float16",
    "half",        "bfloat16",  "int8",       "uint8",  "int16",
    "short",       "int32",     "int",        "int64",  "long",
    "bool",        "uint16",    "uint32",     "uint64", "float8_e4m3fn",
    "float8_e5m2", "complex64", "complex128", "cfloat"};
constexpr const char* kStorages[] = {
    "FloatStorage",    "DoubleStorage",        "HalfStorage",
    "BFloat16Storage", "ByteStorage",          "CharStorage",
    "ShortStorage",    "IntStorage",           "LongStorage",
    "BoolStorage",     "UInt16Storage",        "UInt32Storage",
    "UInt64Storage",   "Float8_e4m3fnStorage", "Float8_e5m2Storage",
    "UntypedStorage"};
constexpr const char* kLayouts[] = {"strided", "sparse_coo", "sparse_csr",
                                    "_mkldnn"};
constexpr const char* kFormats[] = {"contiguous_format", "channels_last",
                                    "channels_last_3d", "preserve_format"};

const absl::flat_hash_map<std::string, Role>& AllowList() {
  static const auto* m = [] {
    auto* m = new absl::flat_hash_map<std::string, Role>();
    for (const char* mod : kDcpModules) {
      for (const char* c : kDcpClasses)
        (*m)[absl::StrCat(mod, ".", c)] = Role::kClass;
      (*m)[absl::StrCat(mod, "._MEM_FORMAT_ENCODING")] = Role::kEnum;
    }
    (*m)["torch.distributed._shard.sharded_tensor.metadata.TensorProperties"] =
        Role::kClass;
    (*m)
        ["torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_"
         "ENCODING"] = Role::kEnum;
    for (const char* c : kPlannerClasses)
      (*m)[absl::StrCat(kPlannerModule, ".", c)] = Role::kClass;
    (*m)[absl::StrCat(kPlannerModule, ".WriteItemType")] = Role::kEnum;
    (*m)["torch.distributed.checkpoint.filesystem._StorageInfo"] = Role::kClass;
    (*m)["torch.distributed._shard.checkpoint.filesystem._StorageInfo"] =
        Role::kClass;
    for (const char* d : kDtypes) (*m)[absl::StrCat("torch.", d)] = Role::kName;
    for (const char* s : kStorages)
      (*m)[absl::StrCat("torch.", s)] = Role::kName;
    (*m)["torch.storage.UntypedStorage"] = Role::kName;
    for (const char* l : kLayouts)
      (*m)[absl::StrCat("torch.", l)] = Role::kName;
    for (const char* f : kFormats)
      (*m)[absl::StrCat("torch.", f)] = Role::kName;
    (*m)["torch.Size"] = Role::kSize;
    (*m)["collections.OrderedDict"] = Role::kOrderedDict;
    (*m)["torch._utils._rebuild_tensor_v2"] = Role::kRebuild;
    (*m)["torch._utils._rebuild_tensor"] = Role::kRebuild;
    (*m)["torch._utils._rebuild_parameter"] = Role::kRebuildParameter;
    (*m)["torch.serialization._get_layout"] = Role::kGetLayout;
    (*m)["builtins.getattr"] = Role::kGetattr;
    (*m)["pathlib.PosixPath"] = Role::kPath;
    (*m)["pathlib.PurePosixPath"] = Role::kPath;
    return m;
  }();
  return *m;
}

// The role of a global value: its allow-list entry, or kName for the
// values that getattr and _get_layout produce (members, layouts).
Role RoleOf(absl::string_view name) {
  auto it = AllowList().find(name);
  return it == AllowList().end() ? Role::kName : it->second;
}

// Bytes counted for one value: the struct and its share of the arena's
// deque nodes and node map.
constexpr uint64_t kValueBytes = sizeof(PyValue) + 8;

// A memo index further than this past twice the indices set so far goes
// to the sparse memo, which counts this many bytes an entry (a hash slot
// and its share of the table's growth).
constexpr uint64_t kDenseMemoSlack = 1024;
constexpr uint64_t kSparseMemoBytes = 64;

// Text is kept in blocks of this size; a longer text gets a block of its
// own.
constexpr size_t kTextBlockBytes = 16 << 10;

class Unpickler {
 public:
  Unpickler(absl::string_view data, uint64_t memory_budget)
      : data_(data), arena_(new PyArena()), budget_(memory_budget) {}
  absl::StatusOr<Unpickled> Run();

 private:
  absl::Status Step(uint8_t op);
  absl::Status Fail(absl::string_view what) const {
    return absl::DataLossError(absl::StrFormat(
        "pickle: %s (opcode 0x%02x at offset %d)", what, op_, op_pos_));
  }
  // Counts `bytes` against the budget before they are allocated.
  absl::Status Charge(uint64_t bytes);
  // Room for `extra` more elements in `v`, the growth counted first.
  template <typename T>
  absl::Status Reserve(std::vector<T>& v, size_t extra);
  absl::StatusOr<absl::string_view> Take(uint64_t n);
  absl::StatusOr<uint64_t> TakeUint(int bytes);
  absl::StatusOr<PyValue*> New(Kind k);
  // `n` bytes of text in the arena, its block counted first.
  absl::StatusOr<char*> AllocText(size_t n);
  // A copy of `text` in the arena.
  absl::StatusOr<absl::string_view> KeepText(absl::string_view text);
  // A value of kind `k` whose text is `text`, which must lie in the arena
  // already (another value's text, or KeepText's).
  absl::StatusOr<PyValue*> NewWithText(Kind k, absl::string_view text);
  absl::StatusOr<PyValue*> NewText(Kind k, absl::string_view text);
  // The one value of an immutable scalar, made on first use.
  absl::StatusOr<const PyValue*> Shared(const PyValue*& slot, Kind k,
                                        int64_t integer);
  absl::Status PushValue(const PyValue* v);
  absl::StatusOr<const PyValue*> Pop();
  // Pops the top MARK; the values above it stay on the stack, from the
  // returned position on, for the caller to take (TakeAbove).
  absl::StatusOr<size_t> PopMark();
  // Moves the values from stack position `m` on to the items of `into`.
  absl::Status TakeAbove(size_t m, PyValue* into);
  absl::Status SetItems(const std::vector<const PyValue*>& from, PyValue* into);
  absl::Status Memo(uint64_t index);
  absl::Status Get(uint64_t index);
  absl::Status Global(absl::string_view module, absl::string_view name);
  absl::Status Reduce();
  absl::StatusOr<const PyValue*> Call(const PyValue& fn,
                                      const std::vector<const PyValue*>& a);
  absl::StatusOr<const PyValue*> NewOrderedDict(
      const std::vector<const PyValue*>& a);
  absl::StatusOr<const PyValue*> NewPath(const std::vector<const PyValue*>& a);
  // `cls`: the text of the class's global value.
  absl::StatusOr<const PyValue*> NewObject(
      absl::string_view cls, const std::vector<const PyValue*>& args);
  absl::Status NewObj();
  absl::Status Build();
  absl::Status SetItems(bool many);
  absl::Status Appends(bool many);
  absl::Status PushString(Kind k, int len_bytes);
  absl::Status PushInt(int bytes, bool is_signed);
  absl::Status PushNew(Kind k);
  absl::Status PushShared(const PyValue*& slot, Kind k, int64_t integer = 0);
  absl::Status Mark();
  absl::Status PushLong1();
  absl::Status PushFloat();
  absl::Status Tuple();
  absl::Status SmallTuple(int n);
  absl::Status GlobalFromLines();
  absl::Status StackGlobal();
  absl::Status PersistentId();
  // MEMOIZE at / GET from an index of `bytes` bytes.
  absl::Status MemoAt(int bytes);
  absl::Status GetAt(int bytes);

  absl::string_view data_;
  size_t pos_ = 0, op_pos_ = 0;
  uint8_t op_ = 0;
  std::unique_ptr<PyArena> arena_;
  char* text_at_ = nullptr;  // the free end of the shared text block
  size_t text_left_ = 0;
  MemoryBudget budget_;
  std::vector<const PyValue*> stack_;
  std::vector<size_t> marks_;
  // The memo: indices up to about twice those set so far in a vector (null
  // where never set), others in a hash map; memo_count_ of them set
  // (Python's len(memo), the index MEMOIZE takes).
  std::vector<const PyValue*> memo_;
  absl::flat_hash_map<uint64_t, const PyValue*> sparse_memo_;
  uint64_t memo_count_ = 0;
  const PyValue* none_ = nullptr;
  const PyValue* true_ = nullptr;
  const PyValue* false_ = nullptr;
  const PyValue* empty_tuple_ = nullptr;
  std::array<const PyValue*, 256> small_ints_{};
  bool stopped_ = false;
};

absl::Status Unpickler::Charge(uint64_t bytes) {
  return budget_.Charge(bytes, [&] {
    return absl::StrFormat("pickle: the values up to offset %d of %d bytes",
                           pos_, data_.size());
  });
}

template <typename T>
absl::Status Unpickler::Reserve(std::vector<T>& v, size_t extra) {
  const size_t need = v.size() + extra;
  if (need <= v.capacity()) return absl::OkStatus();
  const size_t cap = std::max(need, 2 * v.capacity());
  CKPT_RETURN_IF_ERROR(Charge((cap - v.capacity()) * sizeof(T)));
  v.reserve(cap);
  return absl::OkStatus();
}

absl::StatusOr<absl::string_view> Unpickler::Take(uint64_t n) {
  if (n > data_.size() - pos_)
    return Fail(absl::StrCat("needs ", n, " bytes past the end"));
  absl::string_view s = data_.substr(pos_, n);
  pos_ += n;
  return s;
}

absl::StatusOr<uint64_t> Unpickler::TakeUint(int bytes) {
  CKPT_ASSIGN_OR_RETURN(absl::string_view s, Take(bytes));
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i)
    v = (v << 8) | static_cast<uint8_t>(s[i]);
  return v;
}

absl::StatusOr<PyValue*> Unpickler::New(Kind k) {
  std::deque<PyValue>& values = arena_->values;
  if (values.size() >= kPickleMaxValues) {
    return absl::ResourceExhaustedError("pickle: more values than the limit");
  }
  CKPT_RETURN_IF_ERROR(Charge(kValueBytes));
  values.emplace_back();
  values.back().kind = k;
  return &values.back();
}

absl::StatusOr<char*> Unpickler::AllocText(size_t n) {
  if (n > text_left_) {
    // A long text gets a block of its own; a short one a new shared block.
    const bool own = n > kTextBlockBytes / 4;
    const size_t size = own ? n : kTextBlockBytes;
    CKPT_RETURN_IF_ERROR(Reserve(arena_->text_blocks, 1));
    CKPT_RETURN_IF_ERROR(Charge(size));
    arena_->text_blocks.emplace_back(new char[size]);
    if (own) return arena_->text_blocks.back().get();
    text_at_ = arena_->text_blocks.back().get();
    text_left_ = size;
  }
  char* at = text_at_;
  text_at_ += n;
  text_left_ -= n;
  return at;
}

absl::StatusOr<absl::string_view> Unpickler::KeepText(absl::string_view text) {
  if (text.empty()) return absl::string_view();
  CKPT_ASSIGN_OR_RETURN(char* at, AllocText(text.size()));
  std::memcpy(at, text.data(), text.size());
  return absl::string_view(at, text.size());
}

absl::StatusOr<PyValue*> Unpickler::NewWithText(Kind k,
                                                absl::string_view text) {
  CKPT_ASSIGN_OR_RETURN(PyValue * v, New(k));
  v->text = text;
  return v;
}

absl::StatusOr<PyValue*> Unpickler::NewText(Kind k, absl::string_view text) {
  CKPT_ASSIGN_OR_RETURN(absl::string_view kept, KeepText(text));
  return NewWithText(k, kept);
}

absl::StatusOr<const PyValue*> Unpickler::Shared(const PyValue*& slot, Kind k,
                                                 int64_t integer) {
  if (slot == nullptr) {
    CKPT_ASSIGN_OR_RETURN(PyValue * v, New(k));
    v->integer = integer;
    v->boolean = integer != 0;
    slot = v;
  }
  return slot;
}

absl::Status Unpickler::PushValue(const PyValue* v) {
  CKPT_RETURN_IF_ERROR(Reserve(stack_, 1));
  stack_.push_back(v);
  return absl::OkStatus();
}

absl::Status Unpickler::PushNew(Kind k) {
  CKPT_ASSIGN_OR_RETURN(PyValue * v, New(k));
  return PushValue(v);
}

absl::Status Unpickler::PushShared(const PyValue*& slot, Kind k,
                                   int64_t integer) {
  CKPT_ASSIGN_OR_RETURN(const PyValue* v, Shared(slot, k, integer));
  return PushValue(v);
}

absl::StatusOr<const PyValue*> Unpickler::Pop() {
  if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
    return Fail("stack underflow");
  }
  const PyValue* v = stack_.back();
  stack_.pop_back();
  return v;
}

absl::StatusOr<size_t> Unpickler::PopMark() {
  if (marks_.empty()) return Fail("no MARK");
  const size_t m = marks_.back();
  marks_.pop_back();
  return m;
}

absl::Status Unpickler::TakeAbove(size_t m, PyValue* into) {
  CKPT_RETURN_IF_ERROR(Reserve(into->items, stack_.size() - m));
  into->items.insert(into->items.end(), stack_.begin() + m, stack_.end());
  stack_.resize(m);
  return absl::OkStatus();
}

absl::Status Unpickler::SetItems(const std::vector<const PyValue*>& from,
                                 PyValue* into) {
  CKPT_RETURN_IF_ERROR(Reserve(into->items, from.size()));
  into->items.insert(into->items.end(), from.begin(), from.end());
  return absl::OkStatus();
}

absl::Status Unpickler::Memo(uint64_t index) {
  if (stack_.empty()) return Fail("memoizing an empty stack");
  if (index >= kPickleMaxMemo) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pickle: memo index ", index, " over the limit"));
  }
  if (index > 2 * memo_.size() + kDenseMemoSlack) {
    // Far past the indices set so far (pickle writers number them 0, 1,
    // ...): one hash entry, not a vector up to it.
    auto [it, added] = sparse_memo_.try_emplace(index, nullptr);
    if (added) {
      absl::Status charged = Charge(kSparseMemoBytes);
      if (!charged.ok()) {
        sparse_memo_.erase(it);
        return charged;
      }
      ++memo_count_;
    }
    it->second = stack_.back();
    return absl::OkStatus();
  }
  if (index >= memo_.size()) {
    CKPT_RETURN_IF_ERROR(Reserve(memo_, index + 1 - memo_.size()));
    memo_.resize(index + 1, nullptr);
  }
  if (memo_[index] == nullptr) ++memo_count_;
  memo_[index] = stack_.back();
  return absl::OkStatus();
}

absl::Status Unpickler::Get(uint64_t index) {
  const PyValue* v = index < memo_.size() ? memo_[index] : nullptr;
  if (v == nullptr) {
    auto it = sparse_memo_.find(index);
    if (it != sparse_memo_.end()) v = it->second;
  }
  if (v == nullptr) return Fail(absl::StrCat("memo ", index, " was never set"));
  return PushValue(v);
}

absl::Status Unpickler::Global(absl::string_view module,
                               absl::string_view name) {
  const std::string full = absl::StrCat(module, ".", name);
  if (!AllowList().contains(full)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pickle global '", format::EscapeText(full),
        "' is not allowed: only plain data and the classes of "
        "checkpoint metadata are read, and nothing is ever executed"));
  }
  CKPT_ASSIGN_OR_RETURN(PyValue * v, NewText(Kind::kGlobal, full));
  return PushValue(v);
}

// pathlib.PosixPath(*parts): the parts joined by '/'.
absl::StatusOr<const PyValue*> Unpickler::NewPath(
    const std::vector<const PyValue*>& a) {
  size_t n = a.empty() ? 0 : a.size() - 1;
  for (const PyValue* p : a) {
    if (!p->Is(Kind::kStr)) return Fail("a path part is not a string");
    n += p->text.size();
  }
  CKPT_ASSIGN_OR_RETURN(char* at, AllocText(n));
  char* end = at;
  for (size_t i = 0; i < a.size(); ++i) {
    if (i) *end++ = '/';
    std::memcpy(end, a[i]->text.data(), a[i]->text.size());
    end += a[i]->text.size();
  }
  return NewWithText(Kind::kStr, absl::string_view(at, n));
}

absl::Status Unpickler::Reduce() {
  CKPT_ASSIGN_OR_RETURN(const PyValue* args, Pop());
  CKPT_ASSIGN_OR_RETURN(const PyValue* fn, Pop());
  if (!fn->Is(Kind::kGlobal) || !args->Is(Kind::kTuple)) {
    return Fail("REDUCE needs an allow-listed global and a tuple");
  }
  CKPT_ASSIGN_OR_RETURN(const PyValue* out, Call(*fn, args->items));
  return PushValue(out);
}

// What REDUCE of allow-listed `fn` on arguments `a` stands for, described,
// never performed.
absl::StatusOr<const PyValue*> Unpickler::Call(
    const PyValue& fn, const std::vector<const PyValue*>& a) {
  switch (RoleOf(fn.text)) {
    case Role::kSize:
      if (a.size() != 1 || !a[0]->Is(Kind::kTuple))
        return Fail("torch.Size needs a tuple");
      return a[0];
    case Role::kOrderedDict:
      return NewOrderedDict(a);
    case Role::kRebuildParameter:
      if (a.empty()) return Fail("_rebuild_parameter without a tensor");
      return a[0];
    case Role::kGetLayout:
      if (a.size() != 1 || !a[0]->Is(Kind::kStr) ||
          !AllowList().contains(a[0]->text)) {
        return Fail("_get_layout of an unknown layout");
      }
      return NewWithText(Kind::kGlobal, a[0]->text);
    case Role::kGetattr:
      if (a.size() != 2 || !a[0]->Is(Kind::kGlobal) || !a[1]->Is(Kind::kStr) ||
          RoleOf(a[0]->text) != Role::kEnum) {
        return Fail("getattr is read only as a member of an allow-listed enum");
      }
      return NewText(Kind::kGlobal, absl::StrCat(a[0]->text, ".", a[1]->text));
    case Role::kPath:
      return NewPath(a);
    case Role::kRebuild:
    case Role::kEnum:
      return NewObject(fn.text, a);
    case Role::kName:
    case Role::kClass:
      break;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("pickle: '", format::EscapeText(fn.text),
                   "' is not read as a call (REDUCE)"));
}

// OrderedDict() or OrderedDict(pairs): a dict.
absl::StatusOr<const PyValue*> Unpickler::NewOrderedDict(
    const std::vector<const PyValue*>& a) {
  CKPT_ASSIGN_OR_RETURN(PyValue * out, New(Kind::kDict));
  if (a.empty()) return out;
  if (a.size() != 1 || !(a[0]->Is(Kind::kList) || a[0]->Is(Kind::kTuple))) {
    return Fail("OrderedDict arguments");
  }
  CKPT_RETURN_IF_ERROR(Reserve(out->items, 2 * a[0]->items.size()));
  for (const PyValue* p : a[0]->items) {
    if (!p->Is(Kind::kTuple) || p->items.size() != 2)
      return Fail("OrderedDict item");
    out->items.push_back(p->items[0]);
    out->items.push_back(p->items[1]);
  }
  return out;
}

// An object of class `cls` whose arguments are `args`.
absl::StatusOr<const PyValue*> Unpickler::NewObject(
    absl::string_view cls, const std::vector<const PyValue*>& args) {
  CKPT_ASSIGN_OR_RETURN(PyValue * out, NewWithText(Kind::kObject, cls));
  CKPT_RETURN_IF_ERROR(SetItems(args, out));
  return out;
}

absl::Status Unpickler::NewObj() {
  CKPT_ASSIGN_OR_RETURN(const PyValue* args, Pop());
  CKPT_ASSIGN_OR_RETURN(const PyValue* cls, Pop());
  if (!cls->Is(Kind::kGlobal) || !args->Is(Kind::kTuple) ||
      RoleOf(cls->text) != Role::kClass) {
    return Fail("NEWOBJ needs an allow-listed class and a tuple");
  }
  CKPT_ASSIGN_OR_RETURN(const PyValue* out, NewObject(cls->text, args->items));
  return PushValue(out);
}

absl::Status Unpickler::Build() {
  CKPT_ASSIGN_OR_RETURN(const PyValue* state, Pop());
  if (stack_.empty()) return Fail("BUILD without an object");
  PyValue* obj = const_cast<PyValue*>(stack_.back());
  if (!obj->Is(Kind::kObject) || obj->state != nullptr) {
    return Fail("BUILD applies to a new object only");
  }
  obj->state = state;
  return absl::OkStatus();
}

// SETITEM pops a key and a value, SETITEMS the pairs above the MARK; both
// add them to the dict below.
absl::Status Unpickler::SetItems(bool many) {
  size_t from = stack_.size() - std::min<size_t>(stack_.size(), 2);
  if (many) {
    CKPT_ASSIGN_OR_RETURN(from, PopMark());
  } else if (stack_.size() < 2 ||
             (!marks_.empty() && stack_.size() - 2 < marks_.back())) {
    return Fail("stack underflow");
  }
  if ((stack_.size() - from) % 2 != 0 || from == 0 ||
      !stack_[from - 1]->Is(Kind::kDict)) {
    return Fail("SETITEM(S) needs a dict and key-value pairs");
  }
  return TakeAbove(from, const_cast<PyValue*>(stack_[from - 1]));
}

// APPEND pops a value, APPENDS and ADDITEMS the values above the MARK; all
// add them to the list or set below.
absl::Status Unpickler::Appends(bool many) {
  size_t from = stack_.size() - std::min<size_t>(stack_.size(), 1);
  if (many) {
    CKPT_ASSIGN_OR_RETURN(from, PopMark());
  } else if (stack_.empty() ||
             (!marks_.empty() && stack_.size() - 1 < marks_.back())) {
    return Fail("stack underflow");
  }
  if (from == 0 || !(stack_[from - 1]->Is(Kind::kList) ||
                     stack_[from - 1]->Is(Kind::kSet))) {
    return Fail("APPEND(S)/ADDITEMS needs a list or set");
  }
  return TakeAbove(from, const_cast<PyValue*>(stack_[from - 1]));
}

absl::Status Unpickler::PushString(Kind k, int len_bytes) {
  CKPT_ASSIGN_OR_RETURN(uint64_t n, TakeUint(len_bytes));
  CKPT_ASSIGN_OR_RETURN(absl::string_view s, Take(n));
  CKPT_ASSIGN_OR_RETURN(PyValue * v, NewText(k, s));
  return PushValue(v);
}

absl::Status Unpickler::PushInt(int bytes, bool is_signed) {
  CKPT_ASSIGN_OR_RETURN(uint64_t u, TakeUint(bytes));
  if (is_signed && bytes < 8 && (u >> (8 * bytes - 1)) != 0)
    u |= ~0ull << (8 * bytes);
  if (u < small_ints_.size()) return PushShared(small_ints_[u], Kind::kInt, u);
  CKPT_ASSIGN_OR_RETURN(PyValue * v, New(Kind::kInt));
  v->integer = static_cast<int64_t>(u);
  return PushValue(v);
}

absl::Status Unpickler::Mark() {
  if (marks_.size() >= kPickleMaxMarkDepth) {
    return absl::ResourceExhaustedError(
        "pickle: MARKs nest deeper than the limit");
  }
  marks_.push_back(stack_.size());
  return absl::OkStatus();
}

// LONG1: a length byte, then that many little-endian two's-complement bytes.
absl::Status Unpickler::PushLong1() {
  CKPT_ASSIGN_OR_RETURN(uint64_t n, TakeUint(1));
  if (n > 8) return Fail("integer wider than 64 bits");
  if (n == 0) return PushShared(small_ints_[0], Kind::kInt);
  return PushInt(static_cast<int>(n), true);
}

// BINFLOAT: an IEEE double, big-endian.
absl::Status Unpickler::PushFloat() {
  CKPT_ASSIGN_OR_RETURN(absl::string_view s, Take(8));
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u = (u << 8) | static_cast<uint8_t>(s[i]);
  CKPT_ASSIGN_OR_RETURN(PyValue * v, New(Kind::kFloat));
  std::memcpy(&v->real, &u, 8);
  return PushValue(v);
}

// TUPLE: the values above the MARK.
absl::Status Unpickler::Tuple() {
  CKPT_ASSIGN_OR_RETURN(const size_t m, PopMark());
  if (m == stack_.size()) return PushShared(empty_tuple_, Kind::kTuple);
  CKPT_ASSIGN_OR_RETURN(PyValue * v, New(Kind::kTuple));
  CKPT_RETURN_IF_ERROR(TakeAbove(m, v));
  return PushValue(v);
}

// TUPLE1..3: the top n values, in stack order.
absl::Status Unpickler::SmallTuple(int n) {
  if (stack_.size() < static_cast<size_t>(n) ||
      (!marks_.empty() && stack_.size() - n < marks_.back())) {
    return Fail("stack underflow");
  }
  CKPT_ASSIGN_OR_RETURN(PyValue * v, New(Kind::kTuple));
  CKPT_RETURN_IF_ERROR(TakeAbove(stack_.size() - n, v));
  return PushValue(v);
}

// GLOBAL: "module\nname\n" inline.
absl::Status Unpickler::GlobalFromLines() {
  absl::string_view parts[2];
  for (auto& p : parts) {
    const size_t nl = data_.find('\n', pos_);
    if (nl == absl::string_view::npos) return Fail("GLOBAL without a newline");
    p = data_.substr(pos_, nl - pos_);
    pos_ = nl + 1;
  }
  return Global(parts[0], parts[1]);
}

absl::Status Unpickler::StackGlobal() {
  CKPT_ASSIGN_OR_RETURN(const PyValue* name, Pop());
  CKPT_ASSIGN_OR_RETURN(const PyValue* module, Pop());
  if (!name->Is(Kind::kStr) || !module->Is(Kind::kStr)) {
    return Fail("STACK_GLOBAL needs two strings");
  }
  return Global(module->text, name->text);
}

// BINPERSID: the id (a tuple's items, or the value alone) kept as a value.
absl::Status Unpickler::PersistentId() {
  CKPT_ASSIGN_OR_RETURN(const PyValue* pid, Pop());
  CKPT_ASSIGN_OR_RETURN(PyValue * v, New(Kind::kPersistentId));
  CKPT_RETURN_IF_ERROR(SetItems(
      pid->Is(Kind::kTuple) ? pid->items : std::vector<const PyValue*>{pid},
      v));
  return PushValue(v);
}

absl::Status Unpickler::MemoAt(int bytes) {
  CKPT_ASSIGN_OR_RETURN(uint64_t i, TakeUint(bytes));
  return Memo(i);
}

absl::Status Unpickler::GetAt(int bytes) {
  CKPT_ASSIGN_OR_RETURN(uint64_t i, TakeUint(bytes));
  return Get(i);
}

// Dispatch only: one opcode, one call.
absl::Status Unpickler::Step(uint8_t op) {
  switch (op) {
    case 0x80:
      return TakeUint(1).status();  // PROTO
    case 0x95:
      return TakeUint(8).status();  // FRAME: a size hint
    case '.':
      stopped_ = true;
      return absl::OkStatus();  // STOP
    case '(':
      return Mark();
    case '0':
      return Pop().status();  // POP
    case '1': {               // POP_MARK
      CKPT_ASSIGN_OR_RETURN(const size_t m, PopMark());
      stack_.resize(m);
      return absl::OkStatus();
    }
    case 'N':
      return PushShared(none_, Kind::kNone);
    case 0x88:
      return PushShared(true_, Kind::kBool, 1);  // NEWTRUE
    case 0x89:
      return PushShared(false_, Kind::kBool, 0);  // NEWFALSE
    case 'J':
      return PushInt(4, true);  // BININT
    case 'K':
      return PushInt(1, false);  // BININT1
    case 'M':
      return PushInt(2, false);  // BININT2
    case 0x8a:
      return PushLong1();
    case 'G':
      return PushFloat();  // BINFLOAT
    case 'X':
      return PushString(Kind::kStr, 4);  // BINUNICODE
    case 0x8c:
      return PushString(Kind::kStr, 1);  // SHORT_BINUNICODE
    case 0x8d:
      return PushString(Kind::kStr, 8);  // BINUNICODE8
    case 'B':
      return PushString(Kind::kBytes, 4);  // BINBYTES
    case 'C':
      return PushString(Kind::kBytes, 1);  // SHORT_BINBYTES
    case 0x8e:
      return PushString(Kind::kBytes, 8);  // BINBYTES8
    case ')':
      return PushShared(empty_tuple_, Kind::kTuple);  // EMPTY_TUPLE
    case 't':
      return Tuple();
    case 0x85:
    case 0x86:
    case 0x87:
      return SmallTuple(op - 0x84);  // TUPLE1..3
    case ']':
      return PushNew(Kind::kList);
    case '}':
      return PushNew(Kind::kDict);
    case 0x8f:
      return PushNew(Kind::kSet);
    case 'a':
      return Appends(false);
    case 'e':
    case 0x90:
      return Appends(true);  // APPENDS, ADDITEMS
    case 's':
      return SetItems(false);
    case 'u':
      return SetItems(true);
    case 'c':
      return GlobalFromLines();
    case 0x93:
      return StackGlobal();
    case 'R':
      return Reduce();
    case 0x81:
      return NewObj();
    case 'b':
      return Build();
    case 'Q':
      return PersistentId();
    case 'q':
      return MemoAt(1);  // BINPUT
    case 'r':
      return MemoAt(4);  // LONG_BINPUT
    case 0x94:
      return Memo(memo_count_);  // MEMOIZE
    case 'h':
      return GetAt(1);  // BINGET
    case 'j':
      return GetAt(4);  // LONG_BINGET
    default:
      return absl::FailedPreconditionError(
          absl::StrFormat("pickle: opcode 0x%02x at offset %d is not read (not "
                          "used by checkpoint metadata)",
                          op, op_pos_));
  }
}

absl::StatusOr<Unpickled> Unpickler::Run() {
  while (!stopped_) {
    if (pos_ >= data_.size())
      return absl::DataLossError("pickle: ends without STOP");
    op_pos_ = pos_;
    op_ = static_cast<uint8_t>(data_[pos_++]);
    CKPT_RETURN_IF_ERROR(Step(op_));
  }
  if (stack_.size() != 1 || !marks_.empty()) {
    return absl::DataLossError(absl::StrCat("pickle: STOP with ", stack_.size(),
                                            " values on the stack"));
  }
  Unpickled out;
  out.root = stack_[0];
  out.arena = std::move(arena_);
  out.memory = budget_;
  return out;
}

void Describe(const PyValue& v, int depth, std::string& out, size_t max_chars);

// `items` described between `open` and `close`, comma-separated.
void DescribeItems(const std::vector<const PyValue*>& items, const char* open,
                   const char* close, int depth, std::string& out,
                   size_t max_chars) {
  out += open;
  for (size_t i = 0; i < items.size() && out.size() <= max_chars; ++i) {
    if (i) out += ", ";
    Describe(*items[i], depth - 1, out, max_chars);
  }
  out += close;
}

// A dict as "{key: value, ...}".
void DescribeDict(const PyValue& v, int depth, std::string& out,
                  size_t max_chars) {
  out += "{";
  for (size_t i = 0; i < v.DictSize() && out.size() <= max_chars; ++i) {
    if (i) out += ", ";
    Describe(*v.Key(i), depth - 1, out, max_chars);
    out += ": ";
    Describe(*v.Value(i), depth - 1, out, max_chars);
  }
  out += "}";
}

void Describe(const PyValue& v, int depth, std::string& out, size_t max_chars) {
  if (out.size() > max_chars) return;
  if (depth <= 0) {
    out += "...";
    return;
  }
  auto list = [&](const std::vector<const PyValue*>& items, const char* open,
                  const char* close) {
    DescribeItems(items, open, close, depth, out, max_chars);
  };
  switch (v.kind) {
    case Kind::kNone:
      out += "None";
      break;
    case Kind::kBool:
      out += v.boolean ? "True" : "False";
      break;
    case Kind::kInt:
      out += std::to_string(v.integer);
      break;
    case Kind::kFloat:
      out += absl::StrFormat("%g", v.real);
      break;
    case Kind::kStr:
      out += absl::StrCat("'", format::EscapeText(v.text), "'");
      break;
    case Kind::kBytes:
      out += absl::StrCat("<", v.text.size(), " bytes>");
      break;
    case Kind::kTuple:
      list(v.items, "(", ")");
      break;
    case Kind::kList:
      list(v.items, "[", "]");
      break;
    case Kind::kSet:
      list(v.items, "{", "}");
      break;
    case Kind::kGlobal:
      absl::StrAppend(&out, v.text);
      break;
    case Kind::kPersistentId:
      list(v.items, "persistent_id(", ")");
      break;
    case Kind::kObject:
      list(v.items, absl::StrCat(v.text, "(").c_str(), ")");
      break;
    case Kind::kDict:
      DescribeDict(v, depth, out, max_chars);
      break;
  }
}

}  // namespace

const PyValue* PyValue::Get(absl::string_view key) const {
  for (size_t i = 0; i < DictSize(); ++i) {
    if (Key(i)->Is(Kind::kStr) && Key(i)->text == key) return Value(i);
  }
  return nullptr;
}

uint64_t PickleMemoryBudget(uint64_t pickle_bytes) {
  constexpr uint64_t kMax = ~0ull;
  if (pickle_bytes > (kMax - kPickleBudgetFixed) / kPickleBudgetPerByte) {
    return kMax;
  }
  return kPickleBudgetPerByte * pickle_bytes + kPickleBudgetFixed;
}

absl::Status MemoryBudget::Charge(uint64_t bytes,
                                  absl::FunctionRef<std::string()> what) {
  if (bytes > limit_ - used_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what(), " need more than ", limit_,
        " bytes of memory, the budget of decoding it (", kPickleBudgetPerByte,
        " bytes per byte of the pickle + ", kPickleBudgetFixed >> 20,
        " MiB); checkpoint metadata needs far less"));
  }
  used_ += bytes;
  return absl::OkStatus();
}

absl::StatusOr<Unpickled> Unpickle(absl::string_view data) {
  return Unpickle(data, PickleMemoryBudget(data.size()));
}

absl::StatusOr<Unpickled> Unpickle(absl::string_view data,
                                   uint64_t memory_budget) {
  return Unpickler(data, memory_budget).Run();
}

std::vector<std::string> AllowedGlobals() {
  std::vector<std::string> out;
  for (const auto& [name, _] : AllowList()) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

std::string DescribePy(const PyValue& v, size_t max_chars, int max_depth) {
  std::string out;
  Describe(v, max_depth, out, max_chars);
  if (out.size() > max_chars) out = out.substr(0, max_chars) + "...";
  return out;
}

bool IsDcpClass(const PyValue& v, absl::string_view name) {
  if (!v.Is(Kind::kObject)) return false;
  for (const char* mod : kDcpModules) {
    if (v.text == absl::StrCat(mod, ".", name)) return true;
  }
  // 1.13 kept TensorProperties with the sharded tensor, and _StorageInfo
  // is in filesystem.
  return v.text ==
             absl::StrCat("torch.distributed._shard.sharded_tensor.metadata.",
                          name) ||
         v.text ==
             absl::StrCat("torch.distributed.checkpoint.filesystem.", name) ||
         v.text == absl::StrCat(
                       "torch.distributed._shard.checkpoint.filesystem.", name);
}

}  // namespace ckpt::interop

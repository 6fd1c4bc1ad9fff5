#include "ckpt/interop/pickle.h"

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
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
Role RoleOf(const std::string& name) {
  auto it = AllowList().find(name);
  return it == AllowList().end() ? Role::kName : it->second;
}

class Unpickler {
 public:
  explicit Unpickler(absl::string_view data)
      : data_(data), arena_(new std::deque<PyValue>()) {}
  absl::StatusOr<Unpickled> Run();

 private:
  absl::Status Step(uint8_t op);
  absl::Status Fail(absl::string_view what) const {
    return absl::DataLossError(absl::StrFormat(
        "pickle: %s (opcode 0x%02x at offset %d)", what, op_, op_pos_));
  }
  absl::StatusOr<absl::string_view> Take(uint64_t n);
  absl::StatusOr<uint64_t> TakeUint(int bytes);
  PyValue* New(Kind k);
  absl::StatusOr<const PyValue*> Pop();
  absl::StatusOr<std::vector<const PyValue*>> PopToMark();
  absl::Status Memo(uint64_t index);
  absl::Status Get(uint64_t index);
  absl::Status Global(const std::string& module, const std::string& name);
  absl::Status Reduce();
  absl::Status NewObj();
  absl::Status Build();
  absl::Status SetItems(bool many);
  absl::Status Appends(bool many);
  absl::Status PushString(Kind k, int len_bytes);
  absl::Status PushInt(int bytes, bool is_signed);
  absl::Status Push(Kind k) {
    stack_.push_back(New(k));
    return absl::OkStatus();
  }
  absl::Status Mark();
  absl::Status PushBool(bool value);
  absl::Status PushLong1();
  absl::Status PushFloat();
  absl::Status TupleOf(std::vector<const PyValue*> items);
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
  std::unique_ptr<std::deque<PyValue>> arena_;
  std::vector<const PyValue*> stack_;
  std::vector<size_t> marks_;
  absl::flat_hash_map<uint64_t, const PyValue*> memo_;
  bool stopped_ = false;
};

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

PyValue* Unpickler::New(Kind k) {
  arena_->emplace_back();
  arena_->back().kind = k;
  return &arena_->back();
}

absl::StatusOr<const PyValue*> Unpickler::Pop() {
  if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
    return Fail("stack underflow");
  }
  const PyValue* v = stack_.back();
  stack_.pop_back();
  return v;
}

absl::StatusOr<std::vector<const PyValue*>> Unpickler::PopToMark() {
  if (marks_.empty()) return Fail("no MARK");
  const size_t m = marks_.back();
  marks_.pop_back();
  std::vector<const PyValue*> items(stack_.begin() + m, stack_.end());
  stack_.resize(m);
  return items;
}

absl::Status Unpickler::Memo(uint64_t index) {
  if (stack_.empty()) return Fail("memoizing an empty stack");
  if (index >= kPickleMaxMemo) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pickle: memo index ", index, " over the limit"));
  }
  memo_[index] = stack_.back();
  return absl::OkStatus();
}

absl::Status Unpickler::Get(uint64_t index) {
  auto it = memo_.find(index);
  if (it == memo_.end())
    return Fail(absl::StrCat("memo ", index, " was never set"));
  stack_.push_back(it->second);
  return absl::OkStatus();
}

absl::Status Unpickler::Global(const std::string& module,
                               const std::string& name) {
  const std::string full = absl::StrCat(module, ".", name);
  if (!AllowList().contains(full)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pickle global '", full,
        "' is not allowed: only plain data and the classes of "
        "checkpoint metadata are read, and nothing is ever executed"));
  }
  PyValue* v = New(Kind::kGlobal);
  v->text = full;
  stack_.push_back(v);
  return absl::OkStatus();
}

absl::Status Unpickler::Reduce() {
  CKPT_ASSIGN_OR_RETURN(const PyValue* args, Pop());
  CKPT_ASSIGN_OR_RETURN(const PyValue* fn, Pop());
  if (!fn->Is(Kind::kGlobal) || !args->Is(Kind::kTuple)) {
    return Fail("REDUCE needs an allow-listed global and a tuple");
  }
  const Role role = RoleOf(fn->text);
  const auto& a = args->items;
  PyValue* out = nullptr;
  switch (role) {
    case Role::kSize:
      if (a.size() != 1 || !a[0]->Is(Kind::kTuple))
        return Fail("torch.Size needs a tuple");
      stack_.push_back(a[0]);
      return absl::OkStatus();
    case Role::kOrderedDict:
      out = New(Kind::kDict);
      if (a.size() == 1 && (a[0]->Is(Kind::kList) || a[0]->Is(Kind::kTuple))) {
        for (const PyValue* p : a[0]->items) {
          if (!p->Is(Kind::kTuple) || p->items.size() != 2)
            return Fail("OrderedDict item");
          out->entries.emplace_back(p->items[0], p->items[1]);
        }
      } else if (!a.empty()) {
        return Fail("OrderedDict arguments");
      }
      break;
    case Role::kRebuildParameter:
      if (a.empty()) return Fail("_rebuild_parameter without a tensor");
      stack_.push_back(a[0]);
      return absl::OkStatus();
    case Role::kGetLayout:
      if (a.size() != 1 || !a[0]->Is(Kind::kStr) ||
          !AllowList().contains(a[0]->text)) {
        return Fail("_get_layout of an unknown layout");
      }
      out = New(Kind::kGlobal);
      out->text = a[0]->text;
      break;
    case Role::kGetattr:
      if (a.size() != 2 || !a[0]->Is(Kind::kGlobal) || !a[1]->Is(Kind::kStr) ||
          RoleOf(a[0]->text) != Role::kEnum) {
        return Fail("getattr is read only as a member of an allow-listed enum");
      }
      out = New(Kind::kGlobal);
      out->text = absl::StrCat(a[0]->text, ".", a[1]->text);
      break;
    case Role::kPath: {
      out = New(Kind::kStr);
      std::vector<std::string> parts;
      for (const PyValue* p : a) {
        if (!p->Is(Kind::kStr)) return Fail("a path part is not a string");
        parts.push_back(p->text);
      }
      out->text = absl::StrJoin(parts, "/");
      break;
    }
    case Role::kRebuild:
    case Role::kEnum:
      out = New(Kind::kObject);
      out->text = fn->text;
      out->items = a;
      break;
    case Role::kName:
    case Role::kClass:
      return absl::FailedPreconditionError(absl::StrCat(
          "pickle: '", fn->text, "' is not read as a call (REDUCE)"));
  }
  stack_.push_back(out);
  return absl::OkStatus();
}

absl::Status Unpickler::NewObj() {
  CKPT_ASSIGN_OR_RETURN(const PyValue* args, Pop());
  CKPT_ASSIGN_OR_RETURN(const PyValue* cls, Pop());
  if (!cls->Is(Kind::kGlobal) || !args->Is(Kind::kTuple) ||
      RoleOf(cls->text) != Role::kClass) {
    return Fail("NEWOBJ needs an allow-listed class and a tuple");
  }
  PyValue* out = New(Kind::kObject);
  out->text = cls->text;
  out->items = args->items;
  stack_.push_back(out);
  return absl::OkStatus();
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

absl::Status Unpickler::SetItems(bool many) {
  std::vector<const PyValue*> kv;
  if (many) {
    CKPT_ASSIGN_OR_RETURN(kv, PopToMark());
  } else {
    CKPT_ASSIGN_OR_RETURN(const PyValue* v, Pop());
    CKPT_ASSIGN_OR_RETURN(const PyValue* k, Pop());
    kv = {k, v};
  }
  if (kv.size() % 2 != 0 || stack_.empty() || !stack_.back()->Is(Kind::kDict)) {
    return Fail("SETITEM(S) needs a dict and key-value pairs");
  }
  PyValue* dict = const_cast<PyValue*>(stack_.back());
  for (size_t i = 0; i < kv.size(); i += 2)
    dict->entries.emplace_back(kv[i], kv[i + 1]);
  return absl::OkStatus();
}

absl::Status Unpickler::Appends(bool many) {
  std::vector<const PyValue*> items;
  if (many) {
    CKPT_ASSIGN_OR_RETURN(items, PopToMark());
  } else {
    CKPT_ASSIGN_OR_RETURN(const PyValue* v, Pop());
    items = {v};
  }
  if (stack_.empty() ||
      !(stack_.back()->Is(Kind::kList) || stack_.back()->Is(Kind::kSet))) {
    return Fail("APPEND(S)/ADDITEMS needs a list or set");
  }
  PyValue* list = const_cast<PyValue*>(stack_.back());
  list->items.insert(list->items.end(), items.begin(), items.end());
  return absl::OkStatus();
}

absl::Status Unpickler::PushString(Kind k, int len_bytes) {
  CKPT_ASSIGN_OR_RETURN(uint64_t n, TakeUint(len_bytes));
  CKPT_ASSIGN_OR_RETURN(absl::string_view s, Take(n));
  PyValue* v = New(k);
  v->text = std::string(s);
  stack_.push_back(v);
  return absl::OkStatus();
}

absl::Status Unpickler::PushInt(int bytes, bool is_signed) {
  CKPT_ASSIGN_OR_RETURN(uint64_t u, TakeUint(bytes));
  PyValue* v = New(Kind::kInt);
  if (is_signed && bytes < 8 && (u >> (8 * bytes - 1)) != 0)
    u |= ~0ull << (8 * bytes);
  v->integer = static_cast<int64_t>(u);
  stack_.push_back(v);
  return absl::OkStatus();
}

absl::Status Unpickler::Mark() {
  if (marks_.size() >= kPickleMaxMarkDepth) {
    return absl::ResourceExhaustedError(
        "pickle: MARKs nest deeper than the limit");
  }
  marks_.push_back(stack_.size());
  return absl::OkStatus();
}

absl::Status Unpickler::PushBool(bool value) {
  PyValue* v = New(Kind::kBool);
  v->boolean = value;
  stack_.push_back(v);
  return absl::OkStatus();
}

// LONG1: a length byte, then that many little-endian two's-complement bytes.
absl::Status Unpickler::PushLong1() {
  CKPT_ASSIGN_OR_RETURN(uint64_t n, TakeUint(1));
  if (n > 8) return Fail("integer wider than 64 bits");
  if (n == 0) return Push(Kind::kInt);
  return PushInt(static_cast<int>(n), true);
}

// BINFLOAT: an IEEE double, big-endian.
absl::Status Unpickler::PushFloat() {
  CKPT_ASSIGN_OR_RETURN(absl::string_view s, Take(8));
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u = (u << 8) | static_cast<uint8_t>(s[i]);
  PyValue* v = New(Kind::kFloat);
  std::memcpy(&v->real, &u, 8);
  stack_.push_back(v);
  return absl::OkStatus();
}

absl::Status Unpickler::TupleOf(std::vector<const PyValue*> items) {
  PyValue* v = New(Kind::kTuple);
  v->items = std::move(items);
  stack_.push_back(v);
  return absl::OkStatus();
}

// TUPLE1..3: the top n values, in stack order.
absl::Status Unpickler::SmallTuple(int n) {
  std::vector<const PyValue*> items(n);
  for (int i = n - 1; i >= 0; --i) {
    CKPT_ASSIGN_OR_RETURN(items[i], Pop());
  }
  return TupleOf(std::move(items));
}

// GLOBAL: "module\nname\n" inline.
absl::Status Unpickler::GlobalFromLines() {
  std::string parts[2];
  for (auto& p : parts) {
    const size_t nl = data_.find('\n', pos_);
    if (nl == absl::string_view::npos) return Fail("GLOBAL without a newline");
    p = std::string(data_.substr(pos_, nl - pos_));
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
  PyValue* v = New(Kind::kPersistentId);
  v->items =
      pid->Is(Kind::kTuple) ? pid->items : std::vector<const PyValue*>{pid};
  stack_.push_back(v);
  return absl::OkStatus();
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
    case '1':
      return PopToMark().status();  // POP_MARK
    case 'N':
      return Push(Kind::kNone);
    case 0x88:
      return PushBool(true);  // NEWTRUE
    case 0x89:
      return PushBool(false);  // NEWFALSE
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
      return Push(Kind::kTuple);  // EMPTY_TUPLE
    case 't': {                   // TUPLE
      CKPT_ASSIGN_OR_RETURN(auto items, PopToMark());
      return TupleOf(std::move(items));
    }
    case 0x85:
    case 0x86:
    case 0x87:
      return SmallTuple(op - 0x84);  // TUPLE1..3
    case ']':
      return Push(Kind::kList);
    case '}':
      return Push(Kind::kDict);
    case 0x8f:
      return Push(Kind::kSet);
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
      return Memo(memo_.size());  // MEMOIZE
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
    if (arena_->size() >= kPickleMaxValues) {
      return absl::ResourceExhaustedError("pickle: more values than the limit");
    }
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
  return out;
}

void Describe(const PyValue& v, int depth, std::string& out, size_t max_chars) {
  if (out.size() > max_chars) return;
  if (depth <= 0) {
    out += "...";
    return;
  }
  auto list = [&](const std::vector<const PyValue*>& items, const char* open,
                  const char* close) {
    out += open;
    for (size_t i = 0; i < items.size() && out.size() <= max_chars; ++i) {
      if (i) out += ", ";
      Describe(*items[i], depth - 1, out, max_chars);
    }
    out += close;
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
      out += absl::StrCat("'", v.text, "'");
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
      out += v.text;
      break;
    case Kind::kPersistentId:
      list(v.items, "persistent_id(", ")");
      break;
    case Kind::kObject:
      list(v.items, (v.text + "(").c_str(), ")");
      break;
    case Kind::kDict:
      out += "{";
      for (size_t i = 0; i < v.entries.size() && out.size() <= max_chars; ++i) {
        if (i) out += ", ";
        Describe(*v.entries[i].first, depth - 1, out, max_chars);
        out += ": ";
        Describe(*v.entries[i].second, depth - 1, out, max_chars);
      }
      out += "}";
      break;
  }
}

}  // namespace

const PyValue* PyValue::Get(absl::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k->Is(Kind::kStr) && k->text == key) return v;
  }
  return nullptr;
}

absl::StatusOr<Unpickled> Unpickle(absl::string_view data) {
  return Unpickler(data).Run();
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

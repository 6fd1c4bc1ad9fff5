// A restricted reader of Python pickles (protocols 2 to 5): it turns the
// pickles that PyTorch writes for checkpoint metadata (DCP's ".metadata",
// the "data.pkl" of torch.save records, Megatron's common state) into plain
// data, and never executes anything.
//
// Only the opcodes these files use are read (SECURITY.md lists them); any
// other opcode is an error naming it and its offset. A global (a class or
// function reference) must be on an allow-list (AllowedGlobals()): the DCP
// metadata classes under torch.distributed.checkpoint and
// torch.distributed._shard.checkpoint, the planner dataclasses that
// Megatron-Core saves in Metadata.all_local_plans (SavePlan, WriteItem,
// WriteItemType, TensorWriteData, BytesIOWriteData of
// torch.distributed.checkpoint.planner), torch.Size, torch dtypes, layouts
// and memory formats, the storage types and tensor rebuild functions of
// torch.save, collections.OrderedDict, and a few helpers that these
// pickles call (builtins.getattr on an allow-listed enum,
// torch.serialization._get_layout, pathlib paths). Any other global, such
// as os.system, is an error naming it; nothing is ever imported or called.
// What REDUCE, NEWOBJ and BUILD produce is described, not performed:
// torch.Size(t) is the tuple t, OrderedDict() a dict, a dataclass an
// object with its class name and state, _rebuild_tensor_v2(...) an object
// holding its arguments.
//
// Bounded: the input size is the caller's; values live in an arena owned
// by the result (cycles made with the memo are harmless); MARK nesting,
// memo indices and integer widths are limited (kPickle* below); and the
// memory an unpickling holds (its values, their strings and item lists,
// the stack, the memo) is counted before each allocation against a budget
// of kPickleBudgetPerByte bytes per byte of the pickle plus
// kPickleBudgetFixed (PickleMemoryBudget), past which it fails: a pickle of
// millions of one-byte opcodes cannot take gigabytes. Immutable scalars
// (None, True, False, the empty tuple, the integers 0..255) are shared, so
// that a run of them costs a pointer each.
#ifndef CKPT_INTEROP_PICKLE_H_
#define CKPT_INTEROP_PICKLE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::interop {

inline constexpr int kPickleMaxMarkDepth = 1000;
inline constexpr uint64_t kPickleMaxMemo = 1u << 24;
inline constexpr uint64_t kPickleMaxValues = 1u << 26;
inline constexpr uint64_t kPickleBudgetPerByte = 16;
inline constexpr uint64_t kPickleBudgetFixed = 64ull << 20;  // 64 MiB

// kPickleBudgetPerByte * pickle_bytes + kPickleBudgetFixed (saturating).
uint64_t PickleMemoryBudget(uint64_t pickle_bytes);

// Bytes held against a limit: the memory of one unpickling and of what a
// decoder builds from its values (DecodeDcpMetadata). Thread-compatible.
class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit) : limit_(limit) {}
  // Counts `bytes` about to be allocated; ResourceExhausted (nothing
  // counted) if that would pass the limit, naming `what()` (called only
  // then) as what needs the memory.
  absl::Status Charge(uint64_t bytes, absl::FunctionRef<std::string()> what);
  uint64_t used() const { return used_; }
  uint64_t limit() const { return limit_; }

 private:
  uint64_t limit_, used_ = 0;
};

struct PyValue {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kStr,
    kBytes,
    kTuple,
    kList,
    kDict,
    kSet,
    kGlobal,        // an allow-listed name: `text` = "torch.float32"
    kObject,        // a described call: `text` = "module.Class", `items` = args
    kPersistentId,  // BINPERSID: `items` = the id's tuple items
  };
  Kind kind = Kind::kNone;
  bool boolean = false;
  union {
    int64_t integer = 0;  // kInt
    double real;          // kFloat
  };
  // str, bytes, global or class name; the bytes live in the Unpickled's
  // arena (an object's class name is its global's text, not a copy).
  absl::string_view text;
  // Tuple, list, set: the items; object: the arguments; dict: key, value,
  // key, value, ... (DictSize() pairs).
  std::vector<const PyValue*> items;
  const PyValue* state = nullptr;  // object: BUILD state (null if none)

  bool Is(Kind k) const { return kind == k; }
  bool IsObject(absl::string_view cls) const {
    return kind == Kind::kObject && text == cls;
  }
  // For dicts: the number of pairs, the key and the value of pair `i`.
  size_t DictSize() const { return items.size() / 2; }
  const PyValue* Key(size_t i) const { return items[2 * i]; }
  const PyValue* Value(size_t i) const { return items[2 * i + 1]; }
  // For dicts: the value of string key `key`, or null.
  const PyValue* Get(absl::string_view key) const;
};

// Where the values of one unpickling and their text live.
struct PyArena {
  std::deque<PyValue> values;
  std::vector<std::unique_ptr<char[]>> text_blocks;
};

// The values of one unpickling; the root and everything it refers to live
// as long as this.
struct Unpickled {
  std::unique_ptr<PyArena> arena;
  const PyValue* root = nullptr;
  // What the values hold, counted against the unpickling's budget; a
  // decoder of the values goes on charging what it builds to it.
  MemoryBudget memory{0};
};

// Unpickles `data`. Errors: FailedPrecondition naming a global that is not
// on the allow-list ("pickle global 'posix.system' is not allowed ..."), or
// an opcode it does not read; DataLoss for malformed or truncated input,
// naming the opcode and offset; ResourceExhausted past the limits above,
// the memory budget (PickleMemoryBudget(data.size()), or `memory_budget`)
// included.
absl::StatusOr<Unpickled> Unpickle(absl::string_view data);
absl::StatusOr<Unpickled> Unpickle(absl::string_view data,
                                   uint64_t memory_budget);

// The allow-listed globals, "module.name" each (for SECURITY.md and tests).
std::vector<std::string> AllowedGlobals();

// A short human-readable rendering (Python-like), at most `max_chars`
// characters and `max_depth` levels (deeper: "..."); strings shown through
// format::EscapeText.
std::string DescribePy(const PyValue& v, size_t max_chars = 200,
                       int max_depth = 8);

// The module paths under which DCP's metadata classes have lived:
// "torch.distributed.checkpoint.metadata" (PyTorch >= 2.0) and
// "torch.distributed._shard.checkpoint.metadata" (1.13).
// True iff `cls` is "<one of them>.<name>".
bool IsDcpClass(const PyValue& v, absl::string_view name);

}  // namespace ckpt::interop

#endif  // CKPT_INTEROP_PICKLE_H_

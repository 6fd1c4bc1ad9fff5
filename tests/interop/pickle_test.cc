// The restricted unpickler: the values of allow-listed pickles, and one
// test per refusal (globals off the allow-list, unread opcodes, malformed
// input, limits).
#include "ckpt/interop/pickle.h"

#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace ckpt::interop {
namespace {

using ::ckpt::testing::StatusIs;
using Kind = PyValue::Kind;

std::string Data(const std::string& name) {
  return ::ckpt::testing::ReadFileBytes(std::string(CKPT_SOURCE_DIR) +
                                        "/tests/data/interop/" + name);
}

// Protocol-2 framing around `body`.
std::string P2(const std::string& body) {
  return std::string("\x80\x02", 2) + body + ".";
}

TEST(PickleTest, PlainValues) {
  // pickle.dumps({'a': [1, -2, True, None], 'b': (b'xy', 2.5)}, protocol=4)
  const std::string data = absl::HexStringToBytes(
      "8004952a000000000000007d94288c0161945d94284b014afeffffff884e658c01629443"
      "02787994474004"
      "0000000000008694752e");
  CKPT_ASSERT_OK_AND_ASSIGN(Unpickled u, Unpickle(data));
  const PyValue& root = *u.root;
  ASSERT_TRUE(root.Is(Kind::kDict));
  const PyValue* a = root.Get("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items.size(), 4u);
  EXPECT_EQ(a->items[0]->integer, 1);
  EXPECT_EQ(a->items[1]->integer, -2);
  EXPECT_TRUE(a->items[2]->boolean);
  EXPECT_TRUE(a->items[3]->Is(Kind::kNone));
  const PyValue* b = root.Get("b");
  ASSERT_TRUE(b->Is(Kind::kTuple));
  EXPECT_EQ(b->items[0]->text, "xy");
  EXPECT_EQ(b->items[1]->real, 2.5);
  EXPECT_EQ(DescribePy(root),
            "{'a': [1, -2, True, None], 'b': (<2 bytes>, 2.5)}");
}

// DescribePy shows strings through format::EscapeText (its text reaches
// ckpt-inspect's output); a refused global's name is escaped too.
TEST(PickleTest, DescribedStringsAndRefusedGlobalsAreEscaped) {
  const std::string text("a\x1b]0;t\x07\xc2\x9b", 9);
  CKPT_ASSERT_OK_AND_ASSIGN(
      Unpickled u, Unpickle(P2(std::string("X\x09\x00\x00\x00", 5) + text)));
  EXPECT_EQ(DescribePy(*u.root), "'a\\x1b]0;t\\x07\\u009b'");
  EXPECT_THAT(Unpickle(P2("cos\nsys\x1b[2J\n")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "pickle global 'os.sys\\x1b[2J' is not allowed"));
}

TEST(PickleTest, TorchSizeAndDtypeAreData) {
  // torch.Size((3, 4)) and torch.float32
  const std::string body =
      std::string("ctorch\nSize\nK\x03K\x04\x86\x85R", 19) +
      "ctorch\nfloat32\n\x86";
  CKPT_ASSERT_OK_AND_ASSIGN(Unpickled u, Unpickle(P2(body)));
  EXPECT_EQ(DescribePy(*u.root), "((3, 4), torch.float32)");
}

TEST(PickleTest, OsSystemIsRefusedByName) {
  EXPECT_THAT(Unpickle(Data("hostile/os_system.pkl")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "pickle global 'posix.system' is not allowed"));
}

TEST(PickleTest, BuiltinsEvalIsRefused) {
  EXPECT_THAT(Unpickle(P2("cbuiltins\neval\nX\x01\x00\x00\x001\x85R")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "'builtins.eval' is not allowed"));
}

TEST(PickleTest, GetattrOnlyOnAnAllowListedEnum) {
  EXPECT_THAT(Unpickle(P2(std::string(
                  "cbuiltins\ngetattr\nctorch\nSize\nX\x03\x00\x00\x00"
                  "abc\x86R",
                  40))),
              StatusIs(absl::StatusCode::kDataLoss,
                       "getattr is read only as a member"));
}

TEST(PickleTest, AllowListedClassIsNotCallable) {
  EXPECT_THAT(
      Unpickle(P2("ctorch.distributed.checkpoint.metadata\nMetadata\n)R")),
      StatusIs(absl::StatusCode::kFailedPrecondition, "is not read as a call"));
}

// Found by ckpt_fuzz_pickle: calling the value that getattr produced threw
// from the allow-list lookup instead of returning an error.
TEST(PickleTest, CallingAGetattrResultIsRefusedNotThrown) {
  EXPECT_THAT(
      Unpickle(P2(std::string(
          "cbuiltins\ngetattr\n"
          "ctorch.distributed.checkpoint.metadata\n_MEM_FORMAT_ENCODING\n"
          "X\x01\x00\x00\x00"
          "A\x86R)R",
          88))),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               "'torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING.A' "
               "is not read "
               "as a call"));
}

TEST(PickleTest, UnreadOpcode) {
  EXPECT_THAT(Unpickle("I1\n."),  // protocol 0 INT
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "opcode 0x49 at offset 0 is not read"));
}

TEST(PickleTest, Truncated) {
  EXPECT_THAT(Unpickle(std::string("\x80\x02X\xff\x00\x00\x00"
                                   "ab",
                                   9)),
              StatusIs(absl::StatusCode::kDataLoss, "past the end"));
  EXPECT_THAT(Unpickle(std::string("\x80\x02K\x01", 4)),
              StatusIs(absl::StatusCode::kDataLoss, "ends without STOP"));
}

TEST(PickleTest, StackUnderflow) {
  EXPECT_THAT(Unpickle(P2("\x85")),
              StatusIs(absl::StatusCode::kDataLoss, "stack underflow"));
}

TEST(PickleTest, MemoNeverSet) {
  EXPECT_THAT(Unpickle(P2("h\x07")),
              StatusIs(absl::StatusCode::kDataLoss, "memo 7 was never set"));
}

TEST(PickleTest, MarkDepthLimit) {
  EXPECT_THAT(
      Unpickle(P2(std::string(kPickleMaxMarkDepth + 1, '('))),
      StatusIs(absl::StatusCode::kResourceExhausted, "MARKs nest deeper"));
}

TEST(PickleTest, IntegerWiderThan64Bits) {
  EXPECT_THAT(Unpickle(P2(std::string("\x8a\x09") + std::string(9, '\x01'))),
              StatusIs(absl::StatusCode::kDataLoss, "wider than 64 bits"));
}

TEST(PickleTest, SelfReferenceIsHarmless) {
  // l = []; l.append(l)
  CKPT_ASSERT_OK_AND_ASSIGN(Unpickled u, Unpickle(P2(std::string("]q\x00h\x00"
                                                                 "a",
                                                                 6))));
  EXPECT_EQ(u.root->items[0], u.root);
  EXPECT_EQ(DescribePy(*u.root, 40, 3), "[[[...]]]");
}

// Issue 28: 2^25 one-byte EMPTY_LIST opcodes took ~3.8 GB. Every value is
// counted against the budget before it is made: a run of mutable values
// fails once it passes the budget.
TEST(PickleTest, MemoryBudgetRefusesARunOfEmptyLists) {
  const std::string data = P2(std::string(100000, ']'));
  EXPECT_THAT(Unpickle(data, 1 << 20),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "need more than 1048576 bytes of memory"));
  // The same run fits the default budget of a pickle of its size (it then
  // fails at STOP, holding 100000 values).
  EXPECT_THAT(Unpickle(data),
              StatusIs(absl::StatusCode::kDataLoss, "STOP with 100000 values"));
}

TEST(PickleTest, DefaultBudgetIsSixteenBytesPerByteAndSixtyFourMiB) {
  EXPECT_EQ(PickleMemoryBudget(0), 64ull << 20);
  EXPECT_EQ(PickleMemoryBudget(1000), 16000 + (64ull << 20));
  EXPECT_EQ(PickleMemoryBudget(~0ull), ~0ull);  // saturates
}

// The other example of issue 28 (2^25 NONE): None, True, False, the empty
// tuple and the integers 0..255 are one value each, however often they
// occur, so a run of them costs the pointers that hold them.
TEST(PickleTest, ImmutableScalarsAreShared) {
  const int n = 100000;
  std::string body = "](";
  for (int i = 0; i < n; ++i) body += "N\x88\x89)K\x07";
  CKPT_ASSERT_OK_AND_ASSIGN(Unpickled u, Unpickle(P2(body + "e")));
  ASSERT_EQ(u.root->items.size(), 5u * n);
  EXPECT_EQ(u.arena->values.size(), 6u);  // the list and five scalars
  EXPECT_EQ(u.root->items[0], u.root->items[5]);
  EXPECT_TRUE(u.root->items[1]->boolean);
  EXPECT_FALSE(u.root->items[2]->boolean);
  EXPECT_EQ(u.root->items[4]->integer, 7);
  // The stack's and the list's pointers: at most 24 bytes per value.
  EXPECT_LE(u.memory.used(), 24u * 5 * n + 4096);
}

// A str memoized once and joined into a path by many references to it
// would be a copy per reference: the joined text is counted first.
TEST(PickleTest, PathOfManyReferencesIsCountedBeforeItIsJoined) {
  std::string body = "cpathlib\nPosixPath\n(" +
                     std::string("X\x00\x10\x00\x00", 5) +
                     std::string(4096, 'a') + std::string("q\x00", 2);
  for (int i = 0; i < 1000; ++i) body += std::string("h\x00", 2);
  body += "tR";
  EXPECT_THAT(
      Unpickle(P2(body), 1 << 20),
      StatusIs(absl::StatusCode::kResourceExhausted, "bytes of memory"));
  CKPT_ASSERT_OK_AND_ASSIGN(Unpickled u, Unpickle(P2(body), 8 << 20));
  EXPECT_EQ(u.root->text.size(), 1001u * 4096 + 1000);
}

// A memo index far past those set (LONG_BINPUT 2^24 - 1) is one hash
// entry, not a vector of 2^24 slots (128 MiB from a 5-byte opcode).
TEST(PickleTest, SparseMemoIndexCostsAnEntryNotAVector) {
  // None; PUT 2^24 - 1; POP; GET 2^24 - 1; MEMOIZE (index 1: one set so
  // far); POP; GET 1.
  const std::string body = std::string("N") +
                           std::string("r\xff\xff\xff\x00", 5) + "0" +
                           std::string("j\xff\xff\xff\x00", 5) + "\x94" + "0" +
                           std::string("h\x01", 2);
  CKPT_ASSERT_OK_AND_ASSIGN(Unpickled u, Unpickle(P2(body)));
  EXPECT_TRUE(u.root->Is(Kind::kNone));
  EXPECT_LT(u.memory.used(), 4096u);
}

TEST(PickleTest, ExtraValuesOnTheStackAtStop) {
  EXPECT_THAT(Unpickle(P2("NN")),
              StatusIs(absl::StatusCode::kDataLoss, "2 values on the stack"));
}

// Megatron-Core (>= 0.12) pickles each rank's SavePlan into
// Metadata.all_local_plans: DCP's planner dataclasses, read as data
// (NEWOBJ + BUILD) like the metadata classes, and WriteItemType(2) as an
// enum member.
TEST(PickleTest, PlannerDataclassesAreDataNotCalls) {
  using namespace std::string_literals;  // NUL bytes in the literals
  const std::string planner = "ctorch.distributed.checkpoint.planner\n";
  // SavePlan() with state {'items': [WriteItem() with state
  // {'type': WriteItemType(2)}]}
  const std::string body = planner + "SavePlan\n)\x81}X\x05\0\0\0items]"s +
                           planner + "WriteItem\n)\x81}X\x04\0\0\0type"s +
                           planner + "WriteItemType\nK\x02\x85Rsbasb";
  CKPT_ASSERT_OK_AND_ASSIGN(Unpickled u, Unpickle(P2(body)));
  const PyValue& plan = *u.root;
  EXPECT_TRUE(plan.IsObject("torch.distributed.checkpoint.planner.SavePlan"));
  ASSERT_NE(plan.state, nullptr);
  const PyValue* items = plan.state->Get("items");
  ASSERT_NE(items, nullptr);
  ASSERT_EQ(items->items.size(), 1u);
  const PyValue& item = *items->items[0];
  EXPECT_TRUE(item.IsObject("torch.distributed.checkpoint.planner.WriteItem"));
  ASSERT_NE(item.state, nullptr);
  EXPECT_EQ(DescribePy(*item.state->Get("type")),
            "torch.distributed.checkpoint.planner.WriteItemType(2)");
}

TEST(PickleTest, PlannerClassesAreNeitherCalledNorAllWelcome) {
  // A dataclass of the planner is not callable (REDUCE) ...
  EXPECT_THAT(
      Unpickle(P2("ctorch.distributed.checkpoint.planner\nSavePlan\n)R")),
      StatusIs(absl::StatusCode::kFailedPrecondition, "is not read as a call"));
  // ... and the planner module's other names (classes with behaviour) are
  // not on the list.
  for (const char* name : {"SavePlanner", "LoadPlan", "ReadItem"}) {
    EXPECT_THAT(Unpickle(P2(absl::StrCat(
                    "ctorch.distributed.checkpoint.planner\n", name, "\n"))),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         absl::StrCat("'torch.distributed.checkpoint.planner.",
                                      name, "' is not allowed")));
  }
}

TEST(PickleTest, AllowListNamesTheDcpClassesOfBothPytorchGenerations) {
  std::vector<std::string> g = AllowedGlobals();
  EXPECT_THAT(
      g, ::testing::Contains("torch.distributed.checkpoint.metadata.Metadata"));
  EXPECT_THAT(g, ::testing::Contains(
                     "torch.distributed._shard.checkpoint.metadata.Metadata"));
  for (const char* c : {"SavePlan", "WriteItem", "WriteItemType",
                        "TensorWriteData", "BytesIOWriteData"}) {
    EXPECT_THAT(g, ::testing::Contains(absl::StrCat(
                       "torch.distributed.checkpoint.planner.", c)));
  }
  EXPECT_THAT(g, ::testing::Not(::testing::Contains("posix.system")));
  EXPECT_THAT(g, ::testing::Not(::testing::Contains("builtins.eval")));
}

}  // namespace
}  // namespace ckpt::interop

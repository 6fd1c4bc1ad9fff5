#include "reshard/overrides.h"

#include <chrono>

#include "ckpt/format/status_macros.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::tools {
namespace {

using ::ckpt::testing::StatusIs;
using Kind = Split::Kind;

void ExpectError(absl::string_view text, absl::string_view message) {
  auto r = ParseOverrides(text);
  ASSERT_FALSE(r.ok()) << text;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), message) << text;
}

TEST(ParseOverrides, RulesInFileOrder) {
  CKPT_ASSERT_OK_AND_ASSIGN(Overrides o, ParseOverrides(R"({"entries": {
      "layers.0.w": {"split": "dim1"},
      "emb": {"split": "flat"},
      "norm": {"split": "replicated"},
      "layers.*.b": {"split": "dim0"}}})"));
  ASSERT_EQ(o.rules.size(), 4u);
  EXPECT_EQ(o.rules[0].pattern, "layers.0.w");
  EXPECT_EQ(o.rules[0].split, (Split{Kind::kDim, 1}));
  EXPECT_FALSE(o.rules[0].is_glob());
  EXPECT_EQ(o.rules[1].split.kind, Kind::kFlat);
  EXPECT_EQ(o.rules[2].split.kind, Kind::kReplicated);
  EXPECT_EQ(o.rules[3].pattern, "layers.*.b");
  EXPECT_TRUE(o.rules[3].is_glob());
}

TEST(ParseOverrides, NoEntriesIsValid) {
  CKPT_ASSERT_OK_AND_ASSIGN(Overrides o,
                            ParseOverrides(" {\"entries\": {}}\n"));
  EXPECT_TRUE(o.rules.empty());
}

TEST(ParseOverrides, SyntaxErrorNamesLineAndColumn) {
  ExpectError("{\"entries\": {\n  \"a\": {\"split\": \"dim0\"},\n  \"b\" {}}}",
              "line 3, column 7: syntax error while parsing object separator - "
              "unexpected '{'; "
              "expected ':'");
}

TEST(ParseOverrides, EmptyText) {
  ExpectError("",
              "line 1, column 1: syntax error while parsing value - unexpected "
              "end of input; "
              "expected '[', '{', or a literal");
}

TEST(ParseOverrides, TrailingText) {
  auto r = ParseOverrides("{\"entries\": {}} x");
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                          "line 1, column 17: syntax error"));
}

TEST(ParseOverrides, TopLevelNotAnObject) {
  ExpectError("[1]", "top level: expected an object, got an array");
  ExpectError("\"x\"", "top level: expected an object, got a string");
}

TEST(ParseOverrides, UnknownTopLevelKey) {
  ExpectError(R"({"entries": {}, "version": 1})",
              "top level: unknown key \"version\" (expected \"entries\")");
}

TEST(ParseOverrides, MissingEntries) {
  ExpectError("{}", "top level: missing key \"entries\"");
}

TEST(ParseOverrides, DuplicateTopLevelKey) {
  ExpectError(R"({"entries": {}, "entries": {}})",
              "top level: duplicate key \"entries\"");
}

TEST(ParseOverrides, EntriesNotAnObject) {
  ExpectError(R"({"entries": ["a"]})",
              "entries: expected an object, got an array");
  ExpectError(R"({"entries": null})", "entries: expected an object, got null");
}

TEST(ParseOverrides, EntryNotAnObject) {
  ExpectError(R"({"entries": {"emb": "flat"}})",
              "entries.\"emb\": expected an object, got a string");
}

TEST(ParseOverrides, EmptyKey) {
  ExpectError(R"({"entries": {"": {"split": "flat"}}})",
              "entries: empty entry name or pattern");
}

TEST(ParseOverrides, DuplicateEntry) {
  ExpectError(
      R"({"entries": {"a": {"split": "flat"}, "a": {"split": "dim0"}}})",
      "entries: duplicate key \"a\"");
}

TEST(ParseOverrides, UnknownEntryKey) {
  ExpectError(R"({"entries": {"a": {"spilt": "flat"}}})",
              "entries.\"a\": unknown key \"spilt\" (expected \"split\")");
}

TEST(ParseOverrides, DuplicateSplit) {
  ExpectError(R"({"entries": {"a": {"split": "flat", "split": "dim0"}}})",
              "entries.\"a\": duplicate key \"split\"");
}

TEST(ParseOverrides, MissingSplit) {
  ExpectError(R"({"entries": {"a": {}}})",
              "entries.\"a\": missing key \"split\"");
}

TEST(ParseOverrides, SplitNotAString) {
  ExpectError(R"({"entries": {"a": {"split": 0}}})",
              "entries.\"a\".split: expected a string, got a number");
  ExpectError(R"({"entries": {"a": {"split": {}}}})",
              "entries.\"a\".split: expected a string, got an object");
}

TEST(ParseOverrides, BadSplitValue) {
  ExpectError(R"({"entries": {"a": {"split": "rows"}}})",
              "entries.\"a\".split: expected \"dim<k>\" (k < 32), \"flat\" or "
              "\"replicated\", "
              "got \"rows\"");
}

TEST(ParseOverrides, LongKeyIsShortenedInMessages) {
  std::string key(100, 'k');
  auto r = ParseOverrides("{\"entries\": {\"" + key + "\": 1}}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "entries.\"" + std::string(80, 'k') +
                "...\": expected an object, got a number");
}

TEST(ParseOverrides, InvalidUtf8IsASyntaxError) {
  EXPECT_THAT(ParseOverrides("{\"entries\": {\"\xff\": {}}}"),
              StatusIs(absl::StatusCode::kInvalidArgument, "line 1, column"));
}

TEST(ParseOverrides, DeepNestingFailsFast) {
  std::string deep =
      "{\"entries\": {\"a\": {\"split\": " + std::string(100000, '[');
  EXPECT_THAT(ParseOverrides(deep),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "expected a string, got an array"));
}

TEST(ParseSplit, CanonicalForms) {
  EXPECT_EQ(*ParseSplit("dim0"), (Split{Kind::kDim, 0}));
  EXPECT_EQ(*ParseSplit("dim31"), (Split{Kind::kDim, 31}));
  EXPECT_EQ(ParseSplit("flat")->kind, Kind::kFlat);
  EXPECT_EQ(ParseSplit("replicated")->kind, Kind::kReplicated);
  for (const char* bad :
       {"dim", "dim32", "dim01", "dim-1", "dim1x", "Dim0", "dim 1", "flat "}) {
    EXPECT_THAT(ParseSplit(bad),
                StatusIs(absl::StatusCode::kInvalidArgument, "expected"))
        << bad;
  }
  EXPECT_EQ((Split{Kind::kDim, 3}).ToString(), "dim3");
}

TEST(GlobMatch, Basics) {
  EXPECT_TRUE(GlobMatch("layers.*.w", "layers.12.w"));
  EXPECT_TRUE(GlobMatch("layers.*.w", "layers..w"));
  EXPECT_FALSE(GlobMatch("layers.*.w", "layers.1.b"));
  EXPECT_TRUE(GlobMatch("*", ""));
  EXPECT_TRUE(GlobMatch("a?c", "abc"));
  EXPECT_FALSE(GlobMatch("a?c", "ac"));
  EXPECT_TRUE(GlobMatch("*b*", "abc"));
  EXPECT_TRUE(GlobMatch("a*b*c", "aXbYbZc"));
  EXPECT_FALSE(GlobMatch("a*b*c", "aXbYbZ"));
  EXPECT_TRUE(GlobMatch("exact", "exact"));
  EXPECT_FALSE(GlobMatch("exact", "exactly"));
}

TEST(GlobMatch, PathologicalPatternIsFast) {
  const std::string name(20000, 'a');
  const std::string pattern = "*a*a*a*a*a*a*a*a*b";
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(GlobMatch(pattern, name));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

TEST(OverridesFind, ExactKeyBeatsPatterns) {
  CKPT_ASSERT_OK_AND_ASSIGN(Overrides o, ParseOverrides(R"({"entries": {
      "layers.*": {"split": "dim0"}, "layers.0.w": {"split": "dim1"}}})"));
  CKPT_ASSERT_OK_AND_ASSIGN(const OverrideRule* r, o.Find("layers.0.w"));
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->split, (Split{Kind::kDim, 1}));
  CKPT_ASSERT_OK_AND_ASSIGN(r, o.Find("layers.1.w"));
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->pattern, "layers.*");
  CKPT_ASSERT_OK_AND_ASSIGN(r, o.Find("emb"));
  EXPECT_EQ(r, nullptr);
}

TEST(OverridesFind, SeveralPatternsAreAnError) {
  CKPT_ASSERT_OK_AND_ASSIGN(Overrides o, ParseOverrides(R"({"entries": {
      "layers.*": {"split": "dim0"}, "*.w": {"split": "dim1"}}})"));
  EXPECT_THAT(o.Find("layers.0.w"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "entry 'layers.0.w' matches several patterns: "
                       "\"layers.*\", \"*.w\""));
}

}  // namespace
}  // namespace ckpt::tools

// Replays the ParseOverrides fuzz target (tools/reshard/overrides_fuzz.cc)
// over its seeds and a fixed set of mutations of them, so the target stays
// compiled and its invariants hold in every build (no clang needed).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

const std::vector<std::string>& Seeds() {
  static const std::vector<std::string> seeds = {
      R"({"entries": {}})",
      R"({"entries": {"layers.0.w": {"split": "dim1"}, "emb": {"split": "flat"}}})",
      R"({"entries": {"norm": {"split": "replicated"}, "layers.*.b": {"split": "dim0"}}})",
      R"({"entries": {"a?c": {"split": "dim31"}, "*": {"split": "flat"}}})",
      R"({"entries": {"\u00e9t\u00e9": {"split": "dim2"}}})",
      R"({"entries": {"x": {"split": "dim01"}}})",
      R"({"entries": {"x": {"split": 1}}})",
      R"([{"entries": {}}])",
      "",
  };
  return seeds;
}

int FuzzOne(const std::string& s) {
  return LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()),
                                s.size());
}

TEST(OverridesFuzzReplay, Seeds) {
  for (const std::string& s : Seeds()) EXPECT_EQ(FuzzOne(s), 0) << s;
}

TEST(OverridesFuzzReplay, Mutations) {
  std::mt19937_64 rng(20240611);
  const std::string alphabet =
      "{}[]\":,*?dimflatreplicatedsplitentries0123 \\u\n\x80\xff";
  for (int i = 0; i < 20000; ++i) {
    std::string s = Seeds()[rng() % Seeds().size()];
    const int edits = 1 + rng() % 4;
    for (int e = 0; e < edits; ++e) {
      const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
      switch (rng() % 3) {
        case 0:  // insert
          s.insert(pos, 1, alphabet[rng() % alphabet.size()]);
          break;
        case 1:  // erase
          if (pos < s.size()) s.erase(pos, 1 + rng() % 3);
          break;
        default:  // replace
          if (pos < s.size()) s[pos] = alphabet[rng() % alphabet.size()];
          break;
      }
    }
    ASSERT_EQ(FuzzOne(s), 0) << s;
  }
}

}  // namespace

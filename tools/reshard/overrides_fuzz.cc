// libFuzzer target for ParseOverrides (tools/reshard/overrides.h), the parser
// of ckpt-reshard's --layout file. Besides "no crash, no sanitizer report":
//  - an accepted file survives serialize -> parse unchanged (same rules in
//    the same order);
//  - every split round-trips through ToString / ParseSplit;
//  - Find on every key returns that key's rule (a key equal to a name wins).
// Built with fuzz/'s flags by adding it to fuzz/CMakeLists.txt; also
// replayed over seeds and mutations by tests/tools/reshard/
// overrides_fuzz_replay_test.cc in every ordinary build.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "nlohmann/json.hpp"
#include "reshard/overrides.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ckpt::tools::Overrides;
  absl::string_view in = ckpt::fuzz::AsView(data, size);
  absl::StatusOr<Overrides> parsed = ckpt::tools::ParseOverrides(in);
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!parsed.status().message().empty());
    return 0;
  }
  nlohmann::ordered_json j;
  j["entries"] = nlohmann::ordered_json::object();
  for (const auto& rule : parsed->rules) {
    FUZZ_CHECK(!rule.pattern.empty());
    absl::StatusOr<ckpt::tools::Split> split =
        ckpt::tools::ParseSplit(rule.split.ToString());
    FUZZ_CHECK(split.ok() && *split == rule.split);
    j["entries"][rule.pattern] = {{"split", rule.split.ToString()}};
    absl::StatusOr<const ckpt::tools::OverrideRule*> found =
        parsed->Find(rule.pattern);
    FUZZ_CHECK(found.ok() && *found == &rule);
  }
  const std::string again =
      j.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  absl::StatusOr<Overrides> reparsed = ckpt::tools::ParseOverrides(again);
  FUZZ_CHECK(reparsed.ok());
  FUZZ_CHECK(reparsed->rules.size() == parsed->rules.size());
  for (size_t i = 0; i < parsed->rules.size(); ++i) {
    FUZZ_CHECK(reparsed->rules[i].pattern == parsed->rules[i].pattern);
    FUZZ_CHECK(reparsed->rules[i].split == parsed->rules[i].split);
  }
  return 0;
}

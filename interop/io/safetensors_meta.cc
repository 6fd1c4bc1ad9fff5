#include "ckpt/interop/io/safetensors_meta.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/interop/strict_json.h"
#include "nlohmann/json.hpp"

namespace ckpt::interop {
namespace {

constexpr char kPrefix[] = "ckpt.";
constexpr char kObjects[] = "ckpt.objects";
constexpr char kUser[] = "ckpt.user_metadata";
constexpr char kStep[] = "ckpt.step";

absl::StatusOr<std::string> Unhex(const nlohmann::json& v) {
  if (!v.is_string()) return absl::DataLossError("not a string");
  const std::string& s = v.get_ref<const std::string&>();
  if (s.size() % 2 != 0 ||
      s.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return absl::DataLossError(
        absl::StrCat("'", format::EscapeText(s), "' is not lower-case hex"));
  }
  return absl::HexStringToBytes(s);
}

absl::Status DecodeUser(const std::string& text, format::Metadata& user) {
  auto doc = interop::ParseStrictJson(text, kUser);
  if (!doc.ok()) return doc.status();
  if (!doc->is_array())
    return absl::DataLossError(absl::StrCat(kUser, " is not a JSON array"));
  for (const auto& pair : *doc) {
    if (!pair.is_array() || pair.size() != 2) {
      return absl::DataLossError(
          absl::StrCat(kUser, ": an item is not a [key, value] pair"));
    }
    auto k = Unhex(pair[0]);
    auto v = Unhex(pair[1]);
    if (!k.ok() || !v.ok()) {
      return absl::DataLossError(
          absl::StrCat(kUser, ": ", (!k.ok() ? k : v).status().message()));
    }
    user.emplace_back(*std::move(k), *std::move(v));
  }
  return absl::OkStatus();
}

}  // namespace

StringPairs ExportMetadata(const format::CheckpointInfo& info,
                           const format::Metadata& user,
                           const std::vector<std::string>& object_names) {
  StringPairs out;
  bool user_format = false;
  nlohmann::json hex = nlohmann::json::array();
  for (const auto& [k, v] : user) {
    hex.push_back({absl::BytesToHexString(k), absl::BytesToHexString(v)});
    if (k == "format") user_format = true;
  }
  if (!user_format) out.emplace_back("format", "pt");
  out.emplace_back(kStep, std::to_string(info.step));
  out.emplace_back("ckpt.world_size", std::to_string(info.world_size));
  out.emplace_back("ckpt.checkpoint_id", format::IdToHex(info.id));
  out.emplace_back(kObjects, nlohmann::json(object_names).dump());
  out.emplace_back(kUser, hex.dump());
  for (const auto& [k, v] : user) {
    if (absl::StartsWith(k, kPrefix) || !interop::IsValidUtf8(k) ||
        !interop::IsValidUtf8(v)) {
      continue;
    }
    out.emplace_back(k, v);
  }
  return out;
}

absl::StatusOr<ImportedMetadata> ImportMetadata(const StringPairs& metadata) {
  ImportedMetadata r;
  bool have_user = false;
  for (const auto& [k, v] : metadata) {
    if (k == kStep) {
      uint64_t step;
      if (!absl::SimpleAtoi(v, &step)) {
        return absl::DataLossError(absl::StrCat(
            kStep, " '", format::EscapeText(v), "' is not a step number"));
      }
      r.step = step;
    } else if (k == kObjects) {
      auto doc = interop::ParseStrictJson(v, kObjects);
      if (!doc.ok()) return doc.status();
      if (!doc->is_array())
        return absl::DataLossError(absl::StrCat(kObjects, " is not an array"));
      for (const auto& n : *doc) {
        if (!n.is_string()) {
          return absl::DataLossError(
              absl::StrCat(kObjects, ": a name is not a string"));
        }
        r.objects.insert(n.get<std::string>());
      }
    } else if (k == kUser) {
      have_user = true;
      CKPT_RETURN_IF_ERROR(DecodeUser(v, r.user));
    }
  }
  if (!have_user) {
    for (const auto& [k, v] : metadata) {
      if (!absl::StartsWith(k, kPrefix)) r.user.emplace_back(k, v);
    }
  }
  return r;
}

}  // namespace ckpt::interop

#include "common/tool_storage.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#ifdef CKPT_TOOLS_S3
#include "ckpt/open_storage.h"
#endif

namespace ckpt::tools {

bool ToolsHaveS3() {
#ifdef CKPT_TOOLS_S3
  return true;
#else
  return false;
#endif
}

absl::StatusOr<Storage*> ToolStorage(const std::vector<std::string>& paths) {
#ifdef CKPT_TOOLS_S3
  (void)paths;
  return UrlStorage();
#else
  for (const std::string& p : paths) {
    if (absl::StartsWith(p, "s3://")) {
      return absl::InvalidArgumentError(absl::StrCat(
          p,
          ": this build of the ckpt tools has no S3 support (libckpt/s3 "
          "is built when CMake finds libcurl and OpenSSL and CKPT_S3 is "
          "on)"));
    }
  }
  return DefaultStorage();
#endif
}

}  // namespace ckpt::tools

// The storage the tools open checkpoints through (tools/README.md): local
// paths and, where the tools are built with libckpt/s3 (ckpt_s3: libcurl
// and OpenSSL found, CKPT_S3 on), s3://bucket/prefix URLs, configured from
// the AWS_* environment variables (ckpt/open_storage.h, SECURITY.md).
#ifndef CKPT_TOOLS_COMMON_TOOL_STORAGE_H_
#define CKPT_TOOLS_COMMON_TOOL_STORAGE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/storage.h"

namespace ckpt::tools {

// Whether this build of the tools reads and writes s3:// URLs.
bool ToolsHaveS3();

// One storage for every path of `paths` (a tool's checkpoints): never null,
// the process's, thread-safe. Local paths go to DefaultStorage(), s3:// URLs
// to the S3 store of the environment (ckpt::UrlStorage()). Where the tools
// are built without S3, an s3:// path among `paths` is InvalidArgument
// naming it. A malformed AWS_* variable is reported by the first call on an
// s3:// path, naming the variable and never a secret's value.
absl::StatusOr<Storage*> ToolStorage(const std::vector<std::string>& paths);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_COMMON_TOOL_STORAGE_H_

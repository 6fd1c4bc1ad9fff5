// The storage for a checkpoint root given as a string: a local path or an
// s3:// URL. Part of ckpt_s3 (link ckpt::ckpt_s3), so that the core library
// keeps no dependency on libcurl or OpenSSL.
//
//   auto storage = ckpt::OpenStorage("s3://bucket/run");  // or "/ckpt/run"
//   Writer::Options wo;
//   wo.storage = storage->get();
//   ...
//   writer->Save("s3://bucket/run", step, ckpt::SaveOptions{});
#ifndef CKPT_OPEN_STORAGE_H_
#define CKPT_OPEN_STORAGE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt/storage.h"

namespace ckpt {

// Looks an environment variable up (getenv(3) when null); tests pass a map.
using EnvironmentLookup = std::function<const char*(const char*)>;

// DefaultStorage() (not owned: the pointer's deleter does nothing) for
// anything that is not an s3:// URL; for "s3://bucket[/prefix]", a new
// S3Storage (libckpt/s3/s3_storage.h) configured from the environment:
//   AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
//   AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION,
//   AWS_DEFAULT_REGION, CKPT_S3_ADDRESSING   (libckpt/s3/README.md)
//   CKPT_S3_CONDITIONAL_WRITES = 1 | 0   the store honours If-None-Match
//                                        (default 1; spec/FORMAT.md §4.3)
//   CKPT_S3_SINGLE_WRITER = 0 | 1        single-writer mode (default 0)
// The same storage serves every s3:// path, of any bucket. InvalidArgument
// for a malformed URL or variable, naming the variable and never the value
// of a secret. Thread-safe.
absl::StatusOr<std::shared_ptr<Storage>> OpenStorage(
    const std::string& root, const EnvironmentLookup& env = nullptr);

// One storage for local paths and s3:// URLs at once: each call goes to
// DefaultStorage() or, by its path, to one S3Storage made from the
// environment (as OpenStorage does) on the first call on an s3:// path;
// traits(path) answers by the path. Where the environment is malformed,
// every call on an s3:// path fails with OpenStorage's error. For a program
// that takes roots from its user, local or not (the Python package, the
// tools). The process's own: never null, never destroyed. Thread-safe.
Storage* UrlStorage();

}  // namespace ckpt

#endif  // CKPT_OPEN_STORAGE_H_

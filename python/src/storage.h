// The storage behind the package's readers and writers: local paths, and
// s3:// URLs where the extension is built with ckpt_s3 (libcurl and
// OpenSSL found; ckpt/open_storage.h), configured from the AWS environment
// variables on first use.
#ifndef CKPT_PYTHON_STORAGE_H_
#define CKPT_PYTHON_STORAGE_H_

#include "ckpt/storage.h"
#ifdef CKPT_PYTHON_S3
#include "ckpt/open_storage.h"
#endif

namespace ckpt::python {

// Never null; the process's.
inline Storage* PythonStorage() {
#ifdef CKPT_PYTHON_S3
  return UrlStorage();
#else
  return DefaultStorage();
#endif
}

}  // namespace ckpt::python

#endif  // CKPT_PYTHON_STORAGE_H_

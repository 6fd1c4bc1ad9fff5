// Status -> Python exception: the binding throws StatusError, and one
// exception translator (module.cc) raises the ckpt.Error subclass that
// ckpt._errors maps the status code to, carrying the library's message.
#ifndef CKPT_PYTHON_ERRORS_H_
#define CKPT_PYTHON_ERRORS_H_

#include <exception>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::python {

class StatusError : public std::exception {
 public:
  explicit StatusError(absl::Status status)
      : status_(std::move(status)), what_(status_.ToString()) {}
  const absl::Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  absl::Status status_;
  std::string what_;
};

// Throws StatusError unless `s` is OK.
inline void ThrowIfError(const absl::Status& s) {
  if (!s.ok()) throw StatusError(s);
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> v) {
  ThrowIfError(v.status());
  return *std::move(v);
}

}  // namespace ckpt::python

#endif  // CKPT_PYTHON_ERRORS_H_

// Status helpers shared by every ckpt library. Abseil 20220623 (Debian 12)
// has no RETURN_IF_ERROR, so it is defined once here.
#ifndef CKPT_FORMAT_STATUS_MACROS_H_
#define CKPT_FORMAT_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#define CKPT_STATUS_CONCAT_INNER_(a, b) a##b
#define CKPT_STATUS_CONCAT_(a, b) CKPT_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function when it is not OK.
#define CKPT_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status ckpt_status_ = (expr);        \
    if (!ckpt_status_.ok()) return ckpt_status_; \
  } while (0)

// `lhs` = value of `rexpr` (an absl::StatusOr<T>), or returns its status.
#define CKPT_ASSIGN_OR_RETURN(lhs, rexpr)                                    \
  CKPT_ASSIGN_OR_RETURN_IMPL_(CKPT_STATUS_CONCAT_(ckpt_sor_, __LINE__), lhs, \
                              rexpr)
#define CKPT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(tmp).value()

namespace ckpt {

// Returns `s` with "prefix: " put before its message, keeping the code and
// payloads. OK stays OK. Used to add the file name to codec errors.
inline absl::Status Annotate(const absl::Status& s, absl::string_view prefix) {
  if (s.ok()) return s;
  absl::Status out(s.code(), absl::StrCat(prefix, ": ", s.message()));
  s.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
    out.SetPayload(url, payload);
  });
  return out;
}

}  // namespace ckpt

#endif  // CKPT_FORMAT_STATUS_MACROS_H_

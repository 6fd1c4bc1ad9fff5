// StatusIs(code, substring) for absl::Status and absl::StatusOr<T>.
#ifndef CKPT_TESTS_TESTING_STATUS_MATCHERS_H_
#define CKPT_TESTS_TESTING_STATUS_MATCHERS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace ckpt::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER_P2(StatusIs, code, substr,
           std::string("has code ") + absl::StatusCodeToString(code) +
               " and a message containing '" + std::string(substr) + "'") {
  const absl::Status& s = ::ckpt::testing::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code &&
         std::string(s.message()).find(std::string(substr)) !=
             std::string::npos;
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = ::ckpt::testing::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.ok();
}

}  // namespace ckpt::testing

#define CKPT_ASSERT_OK(expr) ASSERT_THAT((expr), ::ckpt::testing::IsOk())
#define CKPT_EXPECT_OK(expr) EXPECT_THAT((expr), ::ckpt::testing::IsOk())
#define CKPT_ASSERT_OK_AND_ASSIGN(lhs, rexpr)                                \
  auto CKPT_STATUS_CONCAT_(sor_, __LINE__) = (rexpr);                        \
  ASSERT_THAT(CKPT_STATUS_CONCAT_(sor_, __LINE__), ::ckpt::testing::IsOk()); \
  lhs = std::move(CKPT_STATUS_CONCAT_(sor_, __LINE__)).value()

#endif  // CKPT_TESTS_TESTING_STATUS_MATCHERS_H_

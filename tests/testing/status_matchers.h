#pragma once

#include <gmock/gmock.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace varuna::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER(IsOk, "is OK") { return GetStatus(arg).ok(); }

// Matches a non-OK status whose code is `code` and whose message contains `substr`.
MATCHER_P2(StatusIs, code, substr, "") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status: " << s.ToString();
  return s.code() == code && s.message().find(substr) != absl::string_view::npos;
}

}  // namespace varuna::testing

#define VARUNA_TEST_CONCAT_INNER_(a, b) a##b
#define VARUNA_TEST_CONCAT_(a, b) VARUNA_TEST_CONCAT_INNER_(a, b)
// Asserts a StatusOr is OK and moves its value into `lhs` (which may declare a variable).
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL_(VARUNA_TEST_CONCAT_(statusor_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr)  \
  auto tmp = (expr);                                \
  ASSERT_TRUE(tmp.ok()) << tmp.status().ToString(); \
  lhs = std::move(tmp).value()
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::varuna::testing::IsOk())

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

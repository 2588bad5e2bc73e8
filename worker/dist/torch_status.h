#pragma once

// The one adapter layer between LibTorch/c10d/gloo (which throw) and absl::Status.
// Nothing above this layer catches exceptions.

#include <c10/util/Exception.h>

#include <exception>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace varuna {

// Converts the first line of an exception message (LibTorch messages carry a long C++ stack
// trace after it) into a status: timeouts become DeadlineExceeded, the rest Internal.
absl::Status StatusFromException(const std::string& context, const std::exception& e);

// Runs `fn`; exceptions become a status. `fn` returns void or absl::Status.
template <typename Fn>
absl::Status TorchCall(const std::string& context, Fn&& fn) {
  try {
    if constexpr (std::is_same_v<std::invoke_result_t<Fn>, absl::Status>) {
      return fn();
    } else {
      fn();
      return absl::OkStatus();
    }
  } catch (const std::exception& e) {
    return StatusFromException(context, e);
  }
}

}  // namespace varuna

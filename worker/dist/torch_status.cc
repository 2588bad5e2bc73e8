#include "worker/dist/torch_status.h"

#include "absl/strings/match.h"

namespace varuna {

absl::Status StatusFromException(const std::string& context, const std::exception& e) {
  std::string msg = e.what();
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) msg = c10->what_without_backtrace();
  if (auto nl = msg.find('\n'); nl != std::string::npos) msg = msg.substr(0, nl);
  const std::string full = absl::StrCat(context, ": ", msg);
  if (absl::StrContains(msg, "imed out") || absl::StrContains(msg, "Timeout") ||
      absl::StrContains(msg, "timeout")) {
    return absl::DeadlineExceededError(full);
  }
  if (absl::StrContains(msg, "Connection reset") || absl::StrContains(msg, "Connection closed") ||
      absl::StrContains(msg, "Connection refused")) {
    return absl::UnavailableError(full);
  }
  return absl::InternalError(full);
}

}  // namespace varuna

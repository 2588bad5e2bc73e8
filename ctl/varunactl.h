#pragma once

// varunactl: the command line for varuna-manager. All logic is here (tests call
// RunVarunactl); varunactl_main.cc only forwards argv.

#include <iosfwd>
#include <string>
#include <vector>

namespace varuna {

// Exit codes (docs/operations.md): 0 success; 1 the job failed or was cancelled (submit
// --follow), or the manager refused the request; 2 bad usage or a bad job spec (nothing was
// queued); 3 the manager could not be reached.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnreachable = 3;

// `env_manager` is $VARUNA_MANAGER (or empty).
int RunVarunactl(const std::vector<std::string>& args, const std::string& env_manager,
                 std::ostream& out, std::ostream& err);

}  // namespace varuna

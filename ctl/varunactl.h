#pragma once

// varunactl: the command line for varuna-manager. All logic is in this library (tests call
// RunVarunactl); varunactl_main.cc only forwards argv and the environment. The commands are
// a table (ctl/command_table.h, ctl/commands.h); `varunactl help` is generated from it.

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

// What varunactl takes from the environment; the global flags override each. Empty = unset.
struct CtlEnvironment {
  std::string manager;  // $VARUNA_MANAGER: HOST:PORT
  std::string tls_ca;   // $VARUNA_TLS_CA: the cluster CA, to talk TLS
  std::string token;    // $VARUNA_TOKEN: the bearer token
};

// Runs one command line (`args` without the program name): output on `out`, errors and
// progress on `err`. Returns the exit code. Help (`help`, `-h`, `--help`) never contacts the
// manager. Blocks while the command runs (`--follow`, `-f` until the job ends).
int RunVarunactl(const std::vector<std::string>& args, const CtlEnvironment& env, std::ostream& out,
                 std::ostream& err);

}  // namespace varuna

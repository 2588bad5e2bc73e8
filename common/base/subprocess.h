#pragma once

// Running another program and reading what it says (Slurm's commands for the manager's
// machine source, manager/sources/slurm_source.h): no shell, a time limit, bounded output.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace varuna {

struct CommandResult {
  int exit_code = 0;  // the exit status, or 128 + the signal that ended it
  std::string out;    // stdout, at most max_output bytes (the rest is read and dropped)
  std::string err;    // stderr, likewise
};

// Runs argv[0] (looked up in PATH when it has no '/') with argv, this process's environment
// plus `env` (each NAME=VALUE replaces one of the same name), stdin from /dev/null, in a
// process group of its own. Past `timeout` the group is killed and the result is
// DeadlineExceeded naming the command. A program that cannot be started is NotFound /
// PermissionDenied naming it; a non-zero exit is not an error here (see exit_code).
// Thread-safe; blocks the caller (run it off an event loop).
absl::StatusOr<CommandResult> RunCommand(
    const std::vector<std::string>& argv,
    const std::vector<std::pair<std::string, std::string>>& env, absl::Duration timeout,
    size_t max_output = 64 << 20);

}  // namespace varuna

#pragma once

// The varuna-worker program, as a library function so tests can drive it.

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace varuna {

// Runs the worker with `argv` (argv[0] is the program name) and the process environment.
// Returns OK after the last step; any error is a status whose message is one clear line.
absl::Status RunWorker(const std::vector<std::string>& argv);

}  // namespace varuna

#pragma once

// Starting, signalling and reaping worker processes, behind an interface so the agent's
// logic runs against a fake in tests.

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace varuna {

struct ProcessSpec {
  std::vector<std::string> argv;           // argv[0]: a path, or a name looked up in PATH
  std::map<std::string, std::string> env;  // the whole environment
  std::string log_path;                    // stdout and stderr are appended here
  std::string cwd;                         // empty = the agent's
};

struct ProcessExit {
  int pid = 0;
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;
};

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  // Starts the process in its own process group; returns its pid.
  virtual absl::StatusOr<int> Launch(const ProcessSpec& spec) = 0;
  // Sends `sig` to the process group of `pid` (the worker and anything it started).
  virtual absl::Status Signal(int pid, int sig) = 0;
  // Returns the processes that ended since the last call. Never blocks.
  virtual std::vector<ProcessExit> Reap() = 0;
};

// fork/exec. Children die with the agent (PR_SET_PDEATHSIG), so a killed agent leaves no
// worker behind. Thread-safe.
class RealProcessLauncher final : public ProcessLauncher {
 public:
  absl::StatusOr<int> Launch(const ProcessSpec& spec) override;
  absl::Status Signal(int pid, int sig) override;
  std::vector<ProcessExit> Reap() override;

 private:
  absl::Mutex mu_;
  std::vector<int> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace varuna

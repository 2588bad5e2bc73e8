#pragma once

// Starting, signalling and reaping worker processes, behind an interface so the agent's
// logic runs against a fake in tests.

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace varuna {

struct ProcessSpec {
  std::vector<std::string> argv;           // argv[0]: a path, or a name looked up in PATH
  std::map<std::string, std::string> env;  // the whole environment
  std::string log_path;                    // stdout and stderr are appended here
  std::string cwd;                         // empty = the agent's
  // Give the process a pipe the agent's commands go through (Note [Worker protocol] in
  // common/launch/worker_protocol.cc): its read end as file descriptor 3, named in
  // VARUNA_CONTROL_FD. Closed when the process is reaped.
  bool control_pipe = false;
  // Note [Worker user] in agent/launch_request.h: the Unix user to run as, when the launcher runs
  // as root ("" = as the launcher itself; ignored when it is not root). Root (uid 0) only with
  // allow_root. `owned_paths` are given to that user first.
  std::string user;
  bool allow_root = false;
  std::vector<std::string> owned_paths;
};

// Who a worker runs as (Note [Worker user] in agent/launch_request.h), resolved before a fork,
// since getpwnam and getgrouplist are not async-signal-safe.
struct WorkerIdentity {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
  std::string name;
  std::string home;
};

// nullopt: run as the caller (it is not root, or `user` is empty). "#UID" is a tenant's uid
// (Note [Tenant uids] in common/launch/tenant_uid.cc): no passwd entry, gid = uid, no other
// groups, no home. Errors name the problem: no such user, or root without `allow_root`.
absl::StatusOr<std::optional<WorkerIdentity>> ResolveWorkerUser(const std::string& user,
                                                                bool allow_root);

// What a process started as `id` gets: USER, LOGNAME and HOME in `env` (`home` where the
// user has none), and `paths` (which the agent made) given to it, never following a link the
// job may have planted.
void SetUserEnvironment(const WorkerIdentity& id, const std::string& home,
                        std::map<std::string, std::string>* env);
absl::Status GiveToUser(const WorkerIdentity& id, const std::vector<std::string>& paths);

// Whether `id` can enter `dir` and run `program` (through every directory above them), asked
// as that user in a child process. Errors (PermissionDenied) name the user, its uid, the path
// and why: what a worker started as `id` would fail on at once.
absl::Status CheckUserCanUse(const WorkerIdentity& id, const std::string& dir,
                             const std::string& program);

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
  // Writes one command line (common/launch/worker_protocol.h, without its newline) to the
  // control pipe of `pid`. Never blocks. Errors mean the command did not arrive and the
  // caller should signal instead: UnavailableError when the process does not read the pipe
  // (a program that ignores it, a worker still starting; Listening) or it is full;
  // UnimplementedError where there is no channel (this default, and a process launched
  // without control_pipe).
  virtual absl::Status SendCommand(int pid, const std::string& line) {
    return absl::UnimplementedError("no control channel");
  }
  // Whether `pid` reads its control pipe yet (it took the agent's first, empty line).
  virtual bool Listening(int pid) { return false; }
};

// fork/exec. Children die with the agent (PR_SET_PDEATHSIG), so a killed agent leaves no
// worker behind. Thread-safe.
class RealProcessLauncher final : public ProcessLauncher {
 public:
  absl::StatusOr<int> Launch(const ProcessSpec& spec) override;
  absl::Status Signal(int pid, int sig) override;
  std::vector<ProcessExit> Reap() override;
  absl::Status SendCommand(int pid, const std::string& line) override;
  bool Listening(int pid) override;
  ~RealProcessLauncher() override;

 private:
  struct Control {
    int fd = -1;             // the pipe's write end, non-blocking
    bool listening = false;  // the process drained the first line
  };
  absl::Mutex mu_;
  std::vector<int> live_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, Control> control_ ABSL_GUARDED_BY(mu_);  // pid -> its pipe
  bool ListeningLocked(Control& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetControl(int pid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace varuna

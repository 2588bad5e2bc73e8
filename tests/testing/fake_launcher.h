#pragma once

// A ProcessLauncher that starts nothing: tests see what would have run and decide when
// and how each "process" ends.

#include <signal.h>

#include <map>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "agent/process_launcher.h"

namespace varuna::testing {

class FakeLauncher final : public ProcessLauncher {
 public:
  struct Proc {
    int pid = 0;
    ProcessSpec spec;
    bool alive = true;
    std::vector<int> signals;
  };

  // SIGTERM ends a fake process unless told otherwise (a worker that ignores it).
  void set_exit_on_sigterm(bool v) {
    absl::MutexLock lock(&mu_);
    exit_on_sigterm_ = v;
  }

  absl::StatusOr<int> Launch(const ProcessSpec& spec) override {
    absl::MutexLock lock(&mu_);
    const int pid = next_pid_++;
    procs_[pid] = Proc{pid, spec, true, {}};
    return pid;
  }
  absl::Status Signal(int pid, int sig) override {
    absl::MutexLock lock(&mu_);
    auto it = procs_.find(pid);
    if (it == procs_.end() || !it->second.alive) return absl::OkStatus();
    it->second.signals.push_back(sig);
    if (sig == SIGKILL || (sig == SIGTERM && exit_on_sigterm_)) EndLocked(pid, 0, sig);
    return absl::OkStatus();
  }
  std::vector<ProcessExit> Reap() override {
    absl::MutexLock lock(&mu_);
    std::vector<ProcessExit> out;
    out.swap(exits_);
    return out;
  }

  // Ends a process as if it exited with `code` (or was killed by `sig`).
  void Exit(int pid, int code, int sig = 0) {
    absl::MutexLock lock(&mu_);
    EndLocked(pid, code, sig);
  }
  std::vector<Proc> procs() const {
    absl::MutexLock lock(&mu_);
    std::vector<Proc> out;
    for (const auto& [pid, p] : procs_) out.push_back(p);
    return out;
  }
  int alive() const {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const auto& [pid, p] : procs_) n += p.alive ? 1 : 0;
    return n;
  }

 private:
  void EndLocked(int pid, int code, int sig) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = procs_.find(pid);
    if (it == procs_.end() || !it->second.alive) return;
    it->second.alive = false;
    exits_.push_back(ProcessExit{pid, code, sig});
  }

  mutable absl::Mutex mu_;
  int next_pid_ ABSL_GUARDED_BY(mu_) = 1000;
  bool exit_on_sigterm_ ABSL_GUARDED_BY(mu_) = true;
  std::map<int, Proc> procs_ ABSL_GUARDED_BY(mu_);
  std::vector<ProcessExit> exits_ ABSL_GUARDED_BY(mu_);
};

}  // namespace varuna::testing

#pragma once

// Note [Standby workers] in worker/runtime/standby.cc: the agent keeps warm varuna-worker
// processes (LibTorch loaded, waiting on their control pipe) in slots that stayed free a while,
// and a launch takes one instead of starting a process. The pool: its size kept (Keep),
// one handed to a launch (Take), one that exited forgotten (Forget), all stopped at shutdown.
// On the agent's event loop, like the agent.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/process_launcher.h"
#include "common/base/clock.h"

namespace varuna {

class StandbyPool {
 public:
  struct Options {
    int size = -1;  // -1: one per free slot; 0: none (AgentConfig::standby_workers)
    int slots = 0;  // the node's
    std::string work_dir;
    std::string worker_binary;
    std::string node;
    bool allow_root_workers = false;
  };
  StandbyPool(Options options, Clock* clock, ProcessLauncher* launcher);

  // The node's address, which standbys bind their transport to (VARUNA_NODE_ADDR).
  void set_node_addr(std::string addr) { node_addr_ = std::move(addr); }
  // Keeps the pool at its size, with `running` workers on the node: starts standbys in slots
  // free for 2 s, stops those the workers now need, and notes which are ready.
  void Keep(int running);
  // Starts the launch `spec` (rank `rank` of a generation in `gen_dir`) in a ready standby,
  // which becomes `user` (Note [Worker user] in agent/launch_request.h); returns its pid, or an
  // error when none can take it (the caller then launches a process).
  absl::StatusOr<int> Take(const ProcessSpec& spec, const std::string& user,
                           const std::string& gen_dir, int rank);
  // A process that exited: if it was a standby, it is gone.
  void Forget(int pid);
  // Agent shutdown: standbys hold no state, they go at once and no new one starts.
  void StopAll();

 private:
  struct Standby {
    int pid = 0;
    std::string dir;     // VARUNA_STANDBY_DIR
    bool ready = false;  // it reads its control pipe: LibTorch is loaded
  };

  const Options options_;
  Clock* const clock_;
  ProcessLauncher* const launcher_;
  std::string node_addr_;
  std::vector<Standby> standbys_;
  int seq_ = 0;
  bool failed_ = false;    // the last start failed (logged once; retried each tick)
  bool stopping_ = false;  // StopAll ran
  // Running workers when Keep last looked, and since when (standbys fill slots that stayed
  // free for a while).
  int running_seen_ = -1;
  absl::Time running_since_ = absl::InfinitePast();
};

}  // namespace varuna

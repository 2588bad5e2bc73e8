#pragma once

// What the varuna-worker process shares between its signal handlers, the agent's command
// listener, the rescue thread and the training thread: one object, reached from the handlers
// through ProcessState::Get() (a handler has no other way in). The flags are lock-free
// atomics, so setting them from a signal handler is safe; the regroup mailbox is touched only
// by threads.

#include <atomic>
#include <memory>

#include "common/launch/worker_channel.h"
#include "worker/engine/regroup.h"

namespace varuna {

struct ProcessState {
  // SIGUSR1 (Varuna's contract), the agent's stop, or Slurm's first SIGTERM: finish the step,
  // checkpoint, exit 0 (or park, for a graceful morph in place).
  std::atomic<bool> stop_requested{false};
  // SIGUSR2 (a peer is gone, abort the step), the agent's checkpoint_now, or the training
  // thread after a failed step: the rescue thread saves the last completed step and exits.
  std::atomic<bool> rescue_requested{false};
  // Note [Morph in place] in worker/engine/regroup.cc: with --in_place, the agent's commands
  // for a regroup arrive here (from the listener's thread) for the training thread.
  RegroupMailbox regroup;

  static ProcessState& Get();
  // SIGUSR1, SIGUSR2 and, under Slurm (`under_slurm`), SIGTERM set the flags above; SIGPIPE
  // is ignored (Note [SIGPIPE] in process_state.cc).
  static void InstallSignalHandlers(bool under_slurm);
  static_assert(std::atomic<bool>::is_always_lock_free, "flags set by signal handlers");
};

// The agent's control pipe (VARUNA_CONTROL_FD, or a FIFO in VARUNA_CONTROL_FIFO), its
// commands setting ProcessState, or null: without it (a worker run by hand, a FIFO that
// cannot be opened) the agent's signals still work.
std::unique_ptr<AgentCommandListener> ListenToAgent();

}  // namespace varuna

#include "worker/runtime/process_state.h"

#include <csignal>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/launch/launch_args.h"
#include "common/launch/worker_protocol.h"
#include "worker/runtime/worker_main_lib.h"

namespace varuna {
namespace {

void OnSigusr1(int) { ProcessState::Get().stop_requested.store(true); }
void OnSigusr2(int) { ProcessState::Get().rescue_requested.store(true); }
// Under Slurm: the first SIGTERM asks for that stop (Slurm's preemption notice); a second is
// the hard stop SIGTERM always was (an agent's stop past its grace, a kill).
void OnSigtermUnderSlurm(int sig) {
  if (ProcessState::Get().stop_requested.exchange(true)) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

// The agent's commands do what its signals do: stop is SIGUSR1, checkpoint_now SIGUSR2.
// Runs on the listener's thread.
void OnAgentCommand(const v1::AgentCommand& c) {
  ProcessState& ps = ProcessState::Get();
  switch (c.kind_case()) {
    case v1::AgentCommand::kStop:
      if (c.stop().park() && ps.regroup.in_place()) {
        LOG(INFO) << "the agent asks to checkpoint after this step and wait to regroup";
        ps.regroup.ParkOnStop();
      } else {
        LOG(INFO) << "the agent asks to stop after this step (checkpoint, exit)";
      }
      ps.stop_requested.store(true);
      break;
    case v1::AgentCommand::kCheckpointNow:
      LOG(INFO) << "the agent asks to abort the step and save the last completed one";
      ps.rescue_requested.store(true);
      break;
    case v1::AgentCommand::kReconfigure: {
      if (ps.regroup.in_place()) {
        ps.regroup.Post(c.reconfigure());
        break;
      }
      const std::string msg =
          absl::StrCat("reconfigure to generation ", c.reconfigure().generation(),
                       " refused: this worker was not started with --in_place; keeps running");
      LOG(WARNING) << msg;
      v1::WorkerEvent e = ErrorEvent(msg);
      e.mutable_error()->set_command(CommandKindName(c));
      ReportToAgent(std::move(e));
      break;
    }
    case v1::AgentCommand::kStart:  // a standby takes it before it runs this (standby.cc)
    case v1::AgentCommand::KIND_NOT_SET:
      break;
  }
}

}  // namespace

ProcessState& ProcessState::Get() {
  static ProcessState* const state = new ProcessState();  // never destroyed: handlers outlive
  return *state;
}

void ProcessState::InstallSignalHandlers(bool under_slurm) {
  Get();  // constructed before any handler can run
  std::signal(SIGUSR1, OnSigusr1);
  std::signal(SIGUSR2, OnSigusr2);
  // Note [SIGPIPE]: gloo's TCP pairs write with writev(2), which raises SIGPIPE when the peer
  // is gone; its default action would kill a survivor before it can rescue or regroup (the one
  // failure the commit soak found: a rank killed by signal 13 after its replica died). Python,
  // which PyTorch users run, ignores SIGPIPE from the start; so does this process. Writes then
  // fail with EPIPE, which gloo reports as an error of the step.
  std::signal(SIGPIPE, SIG_IGN);
  // Under Slurm (docs/operations.md "Slurm"): its preemption signal (SIGTERM to every process
  // of the job, GraceTime before SIGKILL) means what SIGUSR1 means; a second SIGTERM still
  // kills. Under an agent the agent asks the same at the same time (Note [Slurm preemption]
  // in agent/main.cc); a worker that died of the signal would lose the step.
  if (under_slurm) std::signal(SIGTERM, OnSigtermUnderSlurm);
}

std::unique_ptr<AgentCommandListener> ListenToAgent() {
  int generation = 0;
  if (auto g = GetEnv("VARUNA_GENERATION"); g && !absl::SimpleAtoi(*g, &generation)) {
    generation = 0;
  }
  // Note [Worker protocol] in common/launch/worker_protocol.cc: the agent's pipe, or a FIFO
  // named by whoever started this worker by hand.
  absl::StatusOr<std::unique_ptr<AgentCommandListener>> listener;
  if (const std::optional<std::string> fd = GetEnv(kControlFdEnv); fd && !fd->empty()) {
    int n = -1;
    if (!absl::SimpleAtoi(*fd, &n)) n = -1;
    listener = AgentCommandListener::Adopt(n, generation, OnAgentCommand);
  } else if (const std::optional<std::string> path = GetEnv(kControlFifoEnv);
             path && !path->empty()) {
    listener = AgentCommandListener::Start(*path, generation, OnAgentCommand);
  } else {
    return nullptr;
  }
  if (!listener.ok()) {
    LOG(WARNING) << listener.status().message() << "; the agent's commands come as signals only";
    return nullptr;
  }
  return *std::move(listener);
}

}  // namespace varuna

#pragma once

// Slurm as a source of machines (docs/operations.md "Slurm"; config: SlurmSourceConfig). The
// manager keeps up to max_nodes agent jobs on a partition, one varuna-agent per node
// (sbatch --nodes=1 --exclusive), asks for more while its jobs could use them, cancels agent
// jobs that stayed idle with nobody wanting them, and treats an agent job that Slurm ended
// (preempted without a notice, failed, node failure, time limit) as a lost node. When Slurm
// preempts with a grace time, the agent's own SIGTERM handler sends the preemption notice
// first (Note [Slurm preemption] in agent/main.cc), so the job moves off in time.
//
// Note [Slurm interfaces]: the source speaks to Slurm through its command-line tools, never
// through their human output: `squeue --json` to read the queue (filtered here by job name
// and user too, because 22.05's --json ignores squeue's filters), `sbatch --parsable` to
// submit (the job id alone), `scancel` to release. Not slurmrestd: it is a separate daemon
// that many sites do not run, and it needs JWT setup, while the commands work wherever a
// login node can submit (munge). Commands run off the manager's loop with a time limit; a
// failure (Slurm down, a partition that does not exist, sbatch refusing) is an error in
// `varunactl nodes` and one event per new message, retried with backoff, and never touches
// the nodes and jobs the manager already has.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/subprocess.h"
#include "manager/sources/slurm_source_config.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

// One of the source's agent jobs as squeue reports it.
struct SlurmJob {
  int64_t id = 0;
  std::string state;   // RUNNING, PENDING, PREEMPTED, ... (23.02+'s list: its first entry)
  std::string node;    // the node it runs on ("" while pending)
  std::string reason;  // Slurm's state_reason ("Resources", "Priority", "None", ...)
};

// The jobs named `name` (and of `user` unless "") in `squeue --json` output. InvalidArgument
// for output that is not squeue's JSON, and for the errors squeue reports inside it.
absl::StatusOr<std::vector<SlurmJob>> ParseSqueueJson(const std::string& json,
                                                      const std::string& name,
                                                      const std::string& user);

// The command lines (Note [Slurm interfaces]); `user` filters squeue where Slurm honours it.
std::vector<std::string> SqueueArgv(const SlurmSourceConfig& c, const std::string& user);
std::vector<std::string> SbatchArgv(const SlurmSourceConfig& c);
std::vector<std::string> ScancelArgv(const SlurmSourceConfig& c, int64_t job);

// What the manager's tables say, for the source's decisions.
struct SlurmView {
  struct Node {
    std::string name;
    bool alive = false;    // registered and not DEAD
    bool leaving = false;  // draining or under a preemption notice
    int used_slots = 0;
  };
  std::vector<Node> nodes;
  // Slots the manager's unfinished jobs could use (a job's fixed shape, else its max_slots,
  // else unbounded), less the free slots of nodes that are not the source's.
  int64_t wanted_slots = 0;
};

// What the source remembers between polls (loop thread only).
struct SlurmMemory {
  std::map<std::string, int64_t> node_job;  // node -> its running agent job
  std::map<int64_t, absl::Time> running_since;
  std::map<std::string, absl::Time> idle_since;  // the source's nodes with no used slot
  std::set<int64_t> released;                    // cancelled by the source as idle
};

// One poll's decisions.
struct SlurmPlan {
  int wanted_nodes = 0;
  int running = 0, pending = 0, ending = 0;
  std::string pending_reason;
  int submit = 0;                                         // sbatch this many
  std::vector<std::pair<int64_t, std::string>> cancel;    // scancel, and why
  std::vector<std::pair<std::string, std::string>> lost;  // node, why
  std::vector<std::string> forget;                        // released nodes to drop
  std::string warning;  // an agent job that runs but whose agent never registered
  int64_t warning_job = 0;
};

// The policy, pure: what to submit, cancel, declare lost or forget, given the queue, the
// manager's view and what the source remembers (updated).
SlurmPlan PlanSlurm(const SlurmSourceConfig& c, const std::vector<SlurmJob>& jobs,
                    const SlurmView& view, SlurmMemory* memory, absl::Time now);

// Runs one Slurm command (a fake in tests).
class SlurmCommands {
 public:
  virtual ~SlurmCommands() = default;
  virtual absl::StatusOr<CommandResult> Run(const std::vector<std::string>& argv) = 0;
};
// RunCommand with the config's SLURM_CONF and time limit.
std::unique_ptr<SlurmCommands> MakeSlurmCommands(const SlurmSourceConfig& c);

class SlurmSource {
 public:
  // The manager's side.
  class Host {
   public:
    virtual ~Host() = default;
    virtual SlurmView View() = 0;
    virtual void LoseNode(const std::string& node, const std::string& why) = 0;
    virtual void ForgetNode(const std::string& node) = 0;
    virtual void Event(const std::string& kind, const std::string& node,
                       const std::string& message) = 0;
  };
  using Post = std::function<void(std::function<void()>)>;
  // `on_loop` posts to the manager's loop, `off_loop` to a thread that may block on commands.
  SlurmSource(const SlurmSourceConfig& config, Clock* clock, SlurmCommands* commands, Post on_loop,
              Post off_loop, Host* host);

  // Loop thread: starts a poll when one is due and none is in flight.
  void Tick();
  v1::MachineSource Status() const;
  // "slurm job 12" for a node one of the agent jobs runs on, else "".
  std::string SourceOf(const std::string& node) const;

 private:
  struct Acted {
    std::vector<int64_t> submitted;
    std::vector<int64_t> cancelled;
    std::string error;
  };
  void OnQueue(absl::StatusOr<CommandResult> r);
  void OnActed(const SlurmPlan& plan, const Acted& acted);
  void Failed(const std::string& message);
  void Done();
  // The error text of a failed command: its stderr's last line, else its exit status.
  static std::string CommandError(const std::string& what, const absl::StatusOr<CommandResult>& r);

  const SlurmSourceConfig config_;
  Clock* const clock_;
  SlurmCommands* const commands_;
  const Post on_loop_, off_loop_;
  Host* const host_;
  const std::string user_;
  bool busy_ = false;
  absl::Time next_at_ = absl::InfinitePast();
  SlurmMemory memory_;
  SlurmPlan last_;
  std::set<int64_t> warned_;  // agent jobs whose silent agent was reported
  std::string error_;
  absl::Time error_at_;
  int failures_ = 0;
};

}  // namespace varuna

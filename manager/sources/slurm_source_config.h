#pragma once

// The manager config file's `slurm:` block (docs/operations.md "Slurm"), the options of the
// Slurm source of machines (manager/sources/slurm_source.h).

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace varuna {

// The `slurm:` block (docs/operations.md "Slurm"): Slurm as a source of machines. The manager
// keeps up to max_nodes one-node agent jobs on `partition` (manager/sources/slurm_source.h).
struct SlurmSourceConfig {
  std::string partition;  // "" = no Slurm source
  std::string account, qos;
  std::string time_limit;  // sbatch --time, e.g. "1-00:00:00"; "" = the partition's default
  int max_nodes = 0;       // at most this many agent jobs (running + pending); required >= 1
  int min_nodes = 0;       // kept even when no job wants them
  int slots_per_node = 1;  // what each agent offers (its --slots), for counting demand
  std::vector<std::string> sbatch_args;  // extra sbatch arguments, e.g. --gres=gpu:8
  // The agent's command line on the node, run by sbatch --wrap (a shell, so $VARS work);
  // the source appends --name "$SLURMD_NODENAME" --slurm_grace_s GRACE.
  std::string agent_command;
  std::string job_name = "varuna-agent";  // the agent jobs' name: one per manager
  int grace_s = 30;  // the partition's GraceTime: the agents' preemption notice lead
  std::string output = "/tmp/varuna-agent-%j.out";   // sbatch --output, on the node
  absl::Duration poll_period = absl::Seconds(5);     // squeue every this long
  absl::Duration idle_release = absl::Seconds(300);  // an idle agent job nobody wants is cancelled
  absl::Duration command_timeout = absl::Seconds(30);
  std::string slurm_conf;  // SLURM_CONF for the commands; "" = the manager's environment
  std::string bin_dir;     // where sbatch, squeue, scancel are; "" = PATH

  bool enabled() const { return !partition.empty(); }
  absl::Status Validate() const;
};

}  // namespace varuna

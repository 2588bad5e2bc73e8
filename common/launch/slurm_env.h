#pragma once

// A worker started by Slurm's srun, with no torchrun: its place in the job step from Slurm's
// variables, the way Lightning reads them (docs/operations.md "Slurm"):
//   RANK        <- SLURM_PROCID          WORLD_SIZE <- SLURM_STEP_NUM_TASKS (SLURM_NTASKS)
//   LOCAL_RANK  <- SLURM_LOCALID         NODE_RANK  <- SLURM_NODEID
//   LOCAL_WORLD_SIZE <- this node's count in SLURM_STEP_TASKS_PER_NODE ("2(x3),1")
//   MASTER_ADDR <- the first host of SLURM_STEP_NODELIST (inside a step SLURM_NODELIST is
//                  still the whole job's)
//   MASTER_PORT <- 15000 + the last four digits of SLURM_JOB_ID
// Only for an srun task (SLURM_STEP_ID set): a batch script has SLURM_PROCID=0 and the job's
// task count, and a worker run there directly is one process, not rank 0 of many.
// A torchrun variable that is set wins over Slurm's, so `srun torchrun ...` and an agent's
// launch (which sets them all) are unchanged. No LibTorch, no I/O but the environment.

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/launch/launch_args.h"

namespace varuna {

// The first host of a Slurm host list: "node[1-3],gpu7" -> "node1", "gpu[07-09]" -> "gpu07",
// "rack[1-2]-n[3-4]" -> "rack1-n3". InvalidArgument for an empty or malformed list.
absl::StatusOr<std::string> FirstSlurmHost(const std::string& nodelist);

// The count of tasks on node `node_id` from SLURM_TASKS_PER_NODE ("2(x3),1" -> 2, 2, 2, 1).
std::optional<int> SlurmTasksOnNode(const std::string& tasks_per_node, int node_id);

// `base` with Slurm's variables behind the torchrun names above.
EnvGetter WithSlurmFallback(EnvGetter base);

// True if this process is an srun task (SLURM_JOB_ID, SLURM_STEP_ID, SLURM_PROCID set).
bool UnderSlurm(const EnvGetter& env);

}  // namespace varuna

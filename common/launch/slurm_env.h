#pragma once

// A worker started by Slurm's srun, with no torchrun: its place in the job from Slurm's
// variables, the way Lightning reads them (docs/operations.md "Slurm"):
//   RANK        <- SLURM_PROCID          WORLD_SIZE <- SLURM_NTASKS
//   LOCAL_RANK  <- SLURM_LOCALID         NODE_RANK  <- SLURM_NODEID
//   LOCAL_WORLD_SIZE <- SLURM_NTASKS_PER_NODE, else this node's count in SLURM_TASKS_PER_NODE
//   MASTER_ADDR <- the first host of SLURM_NODELIST (SLURM_JOB_NODELIST)
//   MASTER_PORT <- 15000 + the last four digits of SLURM_JOB_ID
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

// True if this process runs as a Slurm task (SLURM_JOB_ID and SLURM_PROCID are set).
bool UnderSlurm(const EnvGetter& env);

}  // namespace varuna

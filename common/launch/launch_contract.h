#pragma once

// Note [Launch contract]: what a launcher hands one worker process, written in one place
// beside its reader (ParseWorkerArgs and ResolveTopology, launch_args.h). varuna-worker gets
// Varuna's launcher flags (--rank, --stage_to_rank_map, --chunk_size, ...); a user's
// entrypoint, which may not know them, gets the plan in VARUNA_* variables instead. Every
// process gets torchrun's variables (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT) and Varuna's (VARUNA_JOB_ID, VARUNA_GENERATION, ...). The
// agent builds a launch's processes with it; a worker regrouping in place (Note [Morph in
// place] in worker/engine/regroup.cc) sets the torchrun part for its new generation with
// RegroupEnvironment. Plain data: no gRPC (the worker-only build has none).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace varuna {

// One launch of a job's generation on one node (the LaunchRequest, as the agent resolved it).
struct LaunchContract {
  std::string job_id;
  std::string job_name;
  int generation = 1;
  std::string why;           // why the generation exists (LaunchRequest.why); "" for the first
  int world_size = 0;        // processes in the generation
  int local_world_size = 0;  // processes of it on this node
  std::string master_addr;
  int master_port = 0;
  std::string spec_path;  // the job spec on this node
  std::string gen_dir;    // this generation's directory on this node
  std::string node;       // this node's name
  std::string node_addr;  // its address, "" if unknown
  // The shape: a stage map with micro-batch and per-replica batch, or heterogeneous pipelines.
  std::string stage_to_rank_map;
  std::string pipelines;
  int micro_batch = 0;
  int64_t per_replica_batch = 0;
  // The plan's extras (docs/autoconfig.md): 0 / empty = not given.
  std::string schedule;
  std::vector<int> stage_boundaries;
  int tp_size = 0;
  std::string resume_step;  // "" = none
  bool in_place = false;    // may regroup in place (the agent's morphs)
  bool join_in_place = false;
  bool profile = false;  // a profile job: --profile_out=<gen_dir>/profile.json
  // The program: varuna-worker (worker_binary --job spec_path) or the user's entrypoint.
  std::string worker_binary;
  std::vector<std::string> entrypoint;
};

struct RankProcess {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;  // over the launcher's own environment
};

// The process of rank `rank` (`local_rank` on this node), with `progress_file` (the worker
// protocol's events; its command pipe is the launcher's, worker_protocol.h), over `base_env`
// (the launcher's environment and the request's extra variables; OMP_NUM_THREADS defaults
// to 1).
RankProcess RankContract(const LaunchContract& c, int rank, int local_rank,
                         const std::string& progress_file,
                         std::map<std::string, std::string> base_env);

// torchrun's variables for a worker that regroups into `generation` of `world_size`
// processes as rank `rank`, reaching the rendezvous at master_addr:master_port.
std::map<std::string, std::string> RegroupEnvironment(int world_size, int rank,
                                                      const std::string& master_addr,
                                                      int master_port, int generation);

}  // namespace varuna

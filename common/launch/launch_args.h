#pragma once

// Command line + environment of a varuna-worker process: torchrun's environment (RANK,
// LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and Varuna's launcher arguments
// (--rank=, --local_rank=, --stage_to_rank_map=, --chunk_size=, --batch-size=). Pure; the
// worker resolves everything here before it opens a socket, so bad input fails fast.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/pipeline/stage_map.h"
#include "common/pipeline/topology.h"
#include "common/spec/job_spec.h"

namespace varuna {

struct WorkerArgs {
  std::string job_path;
  std::optional<std::string> stage_to_rank_map;
  // Heterogeneous pipelines in Topology's text form (the manager's plan); replaces the map.
  std::optional<std::string> pipelines;
  // Print the model's ordered module names (PipelineTemplate::GetModules) and exit.
  bool list_modules = false;
  std::string metrics_out;
  bool metrics_all_ranks = false;  // every rank writes <metrics_out>.rank<R> (benchmarks)
  std::optional<int64_t> steps;
  // --resume_step: "latest" (newest complete checkpoint, or start fresh if there is none) or
  // a step number. Empty: start fresh.
  std::optional<std::string> resume_step;
  std::optional<int> rank;
  std::optional<int> local_rank;
  std::optional<int> chunk_size;
  std::optional<int64_t> per_replica_batch;  // Varuna's --batch-size
  // The plan from the manager (LaunchRequest): overrides parallel.schedule, and fixes the
  // stage boundaries (segment indices) instead of balancing the model's own layer costs.
  std::optional<std::string> schedule;
  std::vector<int> stage_boundaries;
  // The plan's tensor-parallel size: replaces parallel.tp_size (checked against the model).
  std::optional<int> tp_size;
  // Run the profiler instead of training and write the profile (JSON) here.
  std::string profile_out;
  // One JSON line per step with its split by device events (Note [Step timeline] in
  // worker/engine/step_timeline.cc), and with trace_steps > 0 a profiler summary of that many
  // steps (worker/runtime/step_trace.h).
  std::string timeline_out;
  int64_t trace_steps = 0;
  // Morph in place (Note [Morph in place] in worker/engine/regroup.cc): after a failed step, wait
  // up to park_timeout_s for the agent's ReconfigureCommand instead of saving and exiting;
  // without one, save and exit as before.
  bool in_place = false;
  double park_timeout_s = 60;
  // A fresh process of a generation made by a morph in place: it takes its stage's state
  // from the live ranks (and the checkpoint) by the hand-over, not by --resume_step.
  bool join_in_place = false;
  bool help = false;
};

// Parses argv[1..]. Accepts "--flag value" and "--flag=value". Unknown flags and missing or
// malformed values are InvalidArgument naming the flag.
absl::StatusOr<WorkerArgs> ParseWorkerArgs(const std::vector<std::string>& argv);

// Usage text for --help and errors.
std::string WorkerUsage();

using EnvGetter = std::function<std::optional<std::string>(const std::string&)>;
// Reads the process environment.
std::optional<std::string> GetEnv(const std::string& name);

// Everything a worker needs to know about its place in the job.
// With tensor parallelism (parallel.tp_size > 1) the stage map and pipelines place
// positions, each a group of tp_size processes (consecutive RANKs, one node): process RANK is
// tp rank RANK mod tp_size of position RANK div tp_size. `rank` and `world_size` are then
// positions; the rendezvous uses process_rank() and processes().
struct WorkerTopology {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int tp_size = 1;
  int tp_rank = 0;
  int process_rank() const { return rank * tp_size + tp_rank; }
  int processes() const { return world_size * tp_size; }
  // Every pipeline's stages, ranks and batch share (common/pipeline/topology.h). Uniform unless the
  // job has parallel.pipelines or the launcher passed --pipelines.
  Topology topology;
  int stage = 0;    // within this rank's pipeline
  int replica = 0;  // this rank's pipeline
  int64_t global_batch = 0;
  int64_t per_replica_batch = 0;  // this pipeline's share of the global batch
  int64_t sample_offset = 0;      // its first sample within a step's global batch
  int micro_batch = 0;
  int64_t steps = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool store_is_external = false;  // TORCHELASTIC_USE_AGENT_STORE: rank 0 must not host it
};

// Resolves rank/world/topology/batch from args, environment and the (already validated) job
// spec: --pipelines, else parallel.pipelines (templates checked against the model's modules,
// ModulesOf), else the stage map (--stage_to_rank_map or parallel.stages over WORLD_SIZE).
// `num_segments` caps the number of stages. Errors name the inconsistency (map vs WORLD_SIZE,
// parallel.stages vs map, global batch not divisible by replicas, rank out of range, ...).
absl::StatusOr<WorkerTopology> ResolveTopology(const WorkerArgs& args, JobSpec* spec,
                                               int num_segments, const EnvGetter& env);

// The micro-batch size a rank uses: `requested` (spec or --chunk_size) capped at the
// per-replica batch, or for requested == 0 (auto) about 4 micro-batches per stage.
absl::StatusOr<int> MicroBatchFor(int requested, int64_t per_replica_batch, int stages);

}  // namespace varuna

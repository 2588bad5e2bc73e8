#include "common/launch/launch_args.h"

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_store.h"
#include "common/pipeline/pipeline_template.h"
#include "common/pipeline/schedule.h"
#include "common/spec/job_topology.h"
#include "common/spec/model_spec.h"

namespace varuna {
namespace {

template <typename T>
absl::Status ParseInt(const std::string& flag, const std::string& value, T* out) {
  int64_t v;
  if (!absl::SimpleAtoi(value, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --", flag, " needs an integer, got '", value, "'"));
  }
  *out = static_cast<T>(v);
  return absl::OkStatus();
}

absl::StatusOr<int> EnvInt(const EnvGetter& env, const std::string& name, int fallback) {
  auto v = env(name);
  if (!v || v->empty()) return fallback;
  int out;
  if (!absl::SimpleAtoi(*v, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", *v, "' is not an integer"));
  }
  return out;
}

}  // namespace

std::string WorkerUsage() {
  return "usage: varuna-worker --job JOB.yaml [--stage_to_rank_map S | --pipelines T]\n"
         "                     [--metrics_out FILE] [--list_modules]\n"
         "                     [--metrics_all_ranks] [--resume_step latest|auto|N]\n"
         "                     [--steps N] [--rank=R] [--local_rank=L] [--chunk_size=M]\n"
         "                     [--batch-size=PER_REPLICA_BATCH] [--schedule "
         "varuna|gpipe|1f1b|zb-h1]\n"
         "                     [--tp_size T]\n"
         "                     [--stage_boundaries B0,B1,...] [--profile_out FILE]\n"
         "                     [--timeline_out FILE [--trace_steps N]]\n"
         "                     [--in_place [--park_timeout_s S] [--join_in_place]]\n"
         "environment (torchrun): RANK LOCAL_RANK WORLD_SIZE MASTER_ADDR MASTER_PORT\n";
}

std::optional<std::string> GetEnv(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

namespace {

// --stage_boundaries: increasing segment indices from 0, e.g. "0,3,6".
absl::StatusOr<std::vector<int>> ParseStageBoundaries(const std::string& v) {
  std::vector<int> bounds;
  for (absl::string_view part : absl::StrSplit(v, ',')) {
    int b = 0;
    if (!absl::SimpleAtoi(part, &b) || b < 0 || b > kMaxLayers + 2 ||
        (!bounds.empty() && b <= bounds.back())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flag --stage_boundaries needs increasing segment indices like 0,3,6, got '", v, "'"));
    }
    bounds.push_back(b);
  }
  if (bounds.size() < 2 || bounds.front() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flag --stage_boundaries needs at least two indices starting at 0, got '", v, "'"));
  }
  return bounds;
}

// The numeric flags of a rank's place and batch (--steps, --rank, --local_rank, --chunk_size,
// --batch-size or --batch_size): the value checked and stored.
absl::Status ParseNumberFlag(const std::string& flag, const std::string& v, WorkerArgs* args) {
  if (flag == "steps") {
    int64_t n = 0;
    RETURN_IF_ERROR(ParseInt(flag, v, &n));
    if (n < 0 || n > kMaxSteps) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --steps must be in [0, ", kMaxSteps, "]"));
    }
    args->steps = n;
  } else if (flag == "rank" || flag == "local_rank" || flag == "chunk_size") {
    int n = 0;
    RETURN_IF_ERROR(ParseInt(flag, v, &n));
    if (n < 0 || (flag == "chunk_size" && n < 1)) {
      return absl::InvalidArgumentError(absl::StrCat("flag --", flag, " out of range: ", v));
    }
    (flag == "rank" ? args->rank : flag == "local_rank" ? args->local_rank : args->chunk_size) = n;
  } else if (flag == "batch-size" || flag == "batch_size") {
    int64_t n = 0;
    RETURN_IF_ERROR(ParseInt(flag, v, &n));
    if (n < 1 || n > kMaxGlobalBatch) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --batch-size must be in [1, ", kMaxGlobalBatch, "]"));
    }
    args->per_replica_batch = n;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<WorkerArgs> ParseWorkerArgs(const std::vector<std::string>& argv) {
  WorkerArgs args;
  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "-h" || a == "--help") {
      args.help = true;
      continue;
    }
    if (!absl::StartsWith(a, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "'"));
    }
    std::string flag = a.substr(2), value;
    bool has_value = false;
    if (auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    auto take = [&]() -> absl::StatusOr<std::string> {
      if (has_value) return value;
      if (i + 1 >= argv.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", flag, " needs a value"));
      }
      return argv[++i];
    };
    if (flag == "metrics_all_ranks" && !has_value) {
      args.metrics_all_ranks = true;
    } else if (flag == "list_modules" && !has_value) {
      args.list_modules = true;
    } else if (flag == "in_place" && !has_value) {
      args.in_place = true;
    } else if (flag == "join_in_place" && !has_value) {
      args.join_in_place = true;
    } else if (flag == "park_timeout_s") {
      ASSIGN_OR_RETURN(std::string v, take());
      if (!absl::SimpleAtod(v, &args.park_timeout_s) || !(args.park_timeout_s > 0) ||
          args.park_timeout_s > 86400) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --park_timeout_s needs seconds in (0, 86400], got '", v, "'"));
      }
    } else if (flag == "pipelines") {
      ASSIGN_OR_RETURN(std::string v, take());
      RETURN_IF_ERROR(Topology::Parse(v).status());
      args.pipelines = v;
    } else if (flag == "job") {
      ASSIGN_OR_RETURN(args.job_path, take());
    } else if (flag == "stage_to_rank_map") {
      ASSIGN_OR_RETURN(args.stage_to_rank_map, take());
    } else if (flag == "resume_step") {
      ASSIGN_OR_RETURN(std::string v, take());
      if (auto step = ParseResumeStep(v); !step.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --resume_step ", step.status().message()));
      }
      args.resume_step = v;
    } else if (flag == "profile_out") {
      ASSIGN_OR_RETURN(args.profile_out, take());
      if (args.profile_out.empty()) {
        return absl::InvalidArgumentError("flag --profile_out needs a file name");
      }
    } else if (flag == "timeline_out") {
      ASSIGN_OR_RETURN(args.timeline_out, take());
      if (args.timeline_out.empty()) {
        return absl::InvalidArgumentError("flag --timeline_out needs a file name");
      }
    } else if (flag == "trace_steps") {
      ASSIGN_OR_RETURN(std::string v, take());
      RETURN_IF_ERROR(ParseInt(flag, v, &args.trace_steps));
      if (args.trace_steps < 1 || args.trace_steps > 1000) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --trace_steps must be in [1, 1000], got ", v));
      }
    } else if (flag == "schedule") {
      ASSIGN_OR_RETURN(std::string v, take());
      if (auto p = ParseSchedulePolicy(v); !p.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("flag --schedule: ", p.status().message()));
      }
      args.schedule = v;
    } else if (flag == "tp_size") {
      ASSIGN_OR_RETURN(std::string v, take());
      int n = 0;
      RETURN_IF_ERROR(ParseInt(flag, v, &n));
      if (n < 1 || n > kMaxTensorParallel) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --tp_size must be in [1, ", kMaxTensorParallel, "], got ", v));
      }
      args.tp_size = n;
    } else if (flag == "stage_boundaries") {
      ASSIGN_OR_RETURN(std::string v, take());
      ASSIGN_OR_RETURN(args.stage_boundaries, ParseStageBoundaries(v));
    } else if (flag == "metrics_out") {
      ASSIGN_OR_RETURN(args.metrics_out, take());
    } else if (flag == "steps" || flag == "rank" || flag == "local_rank" || flag == "chunk_size" ||
               flag == "batch-size" || flag == "batch_size") {
      ASSIGN_OR_RETURN(std::string v, take());
      RETURN_IF_ERROR(ParseNumberFlag(flag, v, &args));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", flag));
    }
  }
  if (!args.help && args.job_path.empty()) {
    return absl::InvalidArgumentError("missing required flag --job JOB.yaml");
  }
  if (args.trace_steps > 0 && args.timeline_out.empty()) {
    return absl::InvalidArgumentError(
        "flag --trace_steps writes into the --timeline_out file: give --timeline_out FILE too");
  }
  return args;
}

namespace {

// The tensor-parallel size the run uses (the manager's plan: --tp_size or VARUNA_TP_SIZE, else
// the spec's; auto with no plan is 1), checked against what a tp run does not do yet;
// *env_world becomes the number of tp groups.
absl::StatusOr<int> ResolveTensorParallel(const WorkerArgs& args, JobSpec* spec,
                                          const EnvGetter& env, int* env_world) {
  // Tensor parallelism: everything below places positions (WorkerTopology). The manager's
  // plan decides tp_size (--tp_size, or VARUNA_TP_SIZE for a program of the user's that
  // links libvaruna; a profile job measures at 1).
  std::optional<int> planned_tp = args.tp_size;
  ASSIGN_OR_RETURN(int env_tp, EnvInt(env, "VARUNA_TP_SIZE", 0));
  if (const std::optional<std::string> text = env("VARUNA_TP_SIZE");
      !planned_tp && text && !text->empty() && env_tp == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "VARUNA_TP_SIZE=0 is invalid; it must be in [1, ", kMaxTensorParallel, "] (or unset)"));
  }
  if (!planned_tp && env_tp != 0) {
    if (env_tp < 1 || env_tp > kMaxTensorParallel) {
      return absl::InvalidArgumentError(absl::StrCat(
          "VARUNA_TP_SIZE=", env_tp, " is invalid; it must be in [1, ", kMaxTensorParallel, "]"));
    }
    planned_tp = env_tp;
  }
  if (planned_tp && *planned_tp != spec->parallel.tp_size) {
    if (*planned_tp > 1) RETURN_IF_ERROR(CheckTensorParallel(spec->model, *planned_tp));
    spec->parallel.tp_size = *planned_tp;
  }
  if (spec->parallel.tp_size == 0) spec->parallel.tp_size = 1;  // auto, with no plan to say
  const int tp = std::max(1, spec->parallel.tp_size);
  if (tp > 1) {
    // What a tensor-parallel run does not do yet (Note [Tensor parallelism] in
    // worker/models/tensor_parallel.cc).
    const std::string what = absl::StrCat("parallel.tp_size = ", tp);
    if (!args.profile_out.empty()) {
      return absl::InvalidArgumentError(what +
                                        ": profiling measures unsplit layers; profile with "
                                        "tp_size 1");
    }
    if (args.in_place || args.join_in_place) {
      return absl::InvalidArgumentError(
          what +
          ": a morph in place hands over full layers; a tp job relaunches from its "
          "checkpoint instead");
    }
    if (!spec->model.init_from.empty()) {
      return absl::InvalidArgumentError(
          what +
          ": model.init_from loads unsplit Hugging Face tensors; start with tp_size 1 "
          "and resume its checkpoint at any tp_size");
    }
  }
  if (tp > 1 && *env_world <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.tp_size = ", tp, " needs WORLD_SIZE (ranks of the stage map or pipelines x ", tp,
        " processes) and RANK: launch with torchrun or scripts/run_local.sh"));
  }
  if (tp > 1) {
    if (*env_world % tp != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("WORLD_SIZE=", *env_world, " is not a multiple of parallel.tp_size=", tp,
                       " (world = ranks of the stage map or pipelines x tp_size)"));
    }
    *env_world /= tp;
  }
  return tp;
}

// Heterogeneous pipelines (--pipelines or parallel.pipelines): each pipeline's own stages and
// share of the batch.
absl::Status PipelinesTopology(const WorkerArgs& args, const JobSpec& spec, int num_segments,
                               int env_world, int tp, WorkerTopology* t_out) {
  WorkerTopology& t = *t_out;
  // Each pipeline's share comes from the pipelines themselves: a launcher's --batch-size
  // and --stage_to_rank_map (Varuna's uniform arguments) do not apply and are ignored.
  if (args.pipelines) {
    ASSIGN_OR_RETURN(t.topology, Topology::Parse(*args.pipelines));
  } else {
    ASSIGN_OR_RETURN(std::vector<std::string> modules, ModulesOf(spec.model, num_segments));
    ASSIGN_OR_RETURN(t.topology, TopologyFromSpec(spec, modules, env_world > 0 ? env_world : 0));
  }
  t.world_size = env_world > 0 ? env_world : t.topology.world_size();
  if (t.topology.world_size() != t.world_size) {
    // Seed 004's wording, in processes: sum(stages per pipeline) x tp_size.
    return absl::InvalidArgumentError(absl::StrCat(
        "Number of ranks in pipeline templates (", t.topology.world_size() * tp,
        tp > 1 ? absl::StrCat(" = ", t.topology.world_size(), " stages x tp_size ", tp) : "",
        ") does not match world size (", t.world_size * tp, ")."));
  }
  RETURN_IF_ERROR(t.topology.Validate(num_segments, spec.train.global_batch));
  if (spec.parallel.micro_batch < 1) {
    return absl::InvalidArgumentError(
        "heterogeneous pipelines need parallel.micro_batch (or --chunk_size)");
  }
  return absl::OkStatus();
}

// P x D pipelines from --stage_to_rank_map, or parallel.stages over WORLD_SIZE; optional
// --stage_boundaries.
absl::Status StageMapTopology(const WorkerArgs& args, JobSpec* spec, int num_segments,
                              int env_world, WorkerTopology* t_out) {
  WorkerTopology& t = *t_out;
  StageMap map = StageMap::Make(1, 1);
  if (args.stage_to_rank_map) {
    ASSIGN_OR_RETURN(map, StageMap::Parse(*args.stage_to_rank_map));
    t.world_size = env_world > 0 ? env_world : map.world_size();
    RETURN_IF_ERROR(map.ValidateWorldSize(t.world_size));
  } else {
    t.world_size = env_world > 0 ? env_world : 1;
    int stages = spec->parallel.stages > 0 ? spec->parallel.stages : 1;
    if (t.world_size % stages != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parallel.stages=", stages, " does not divide WORLD_SIZE=", t.world_size));
    }
    map = StageMap::Make(stages, t.world_size / stages);
  }
  if (spec->parallel.stages > 0 && spec->parallel.stages != map.stages()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.stages=", spec->parallel.stages, " disagrees with stage_to_rank_map '",
        map.ToString(), "' (", map.stages(), " stages)"));
  }
  if (map.stages() > num_segments) {
    return absl::InvalidArgumentError(absl::StrCat("the model has ", num_segments,
                                                   " segments, fewer than the ", map.stages(),
                                                   " pipeline stages requested"));
  }
  if (args.per_replica_batch) {
    spec->train.global_batch = *args.per_replica_batch * map.replicas();
  }
  ASSIGN_OR_RETURN(t.topology,
                   Topology::Uniform(map.stages(), map.replicas(), spec->train.global_batch));
  if (!args.stage_boundaries.empty()) {
    if (static_cast<int>(args.stage_boundaries.size()) != map.stages() + 1) {
      return absl::InvalidArgumentError(absl::StrCat("--stage_boundaries has ",
                                                     args.stage_boundaries.size(), " indices for ",
                                                     map.stages(), " stages (want stages + 1)"));
    }
    RETURN_IF_ERROR(t.topology.SetUniformBoundaries(args.stage_boundaries));
    RETURN_IF_ERROR(t.topology.Validate(num_segments, spec->train.global_batch));
  }
  return absl::OkStatus();
}

// This process's place (rank, tp rank, stage, pipeline, batch share, micro-batch), the steps,
// and the rendezvous address.
absl::Status PlaceProcess(const WorkerArgs& args, JobSpec* spec, const EnvGetter& env, int env_rank,
                          int tp, WorkerTopology* t_out) {
  WorkerTopology& t = *t_out;
  if (t.world_size > 1 && !args.rank && !env("RANK")) {
    return absl::InvalidArgumentError(
        absl::StrCat("WORLD_SIZE=", t.world_size, " but no rank: set RANK or pass --rank"));
  }
  const int process = args.rank.value_or(env_rank);
  if (process < 0 || process >= t.world_size * tp) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", process, " is outside the world of size ", t.world_size * tp));
  }
  t.rank = process / tp;
  t.tp_rank = process % tp;
  ASSIGN_OR_RETURN(int env_local, EnvInt(env, "LOCAL_RANK", t.process_rank()));
  t.local_rank = args.local_rank.value_or(env_local);
  t.replica = t.topology.PipelineOf(t.rank);
  t.stage = t.topology.StageOf(t.rank);
  t.global_batch = spec->train.global_batch;
  t.per_replica_batch = t.topology.pipeline(t.replica).samples;
  t.sample_offset = t.topology.SampleOffset(t.replica);
  if (t.topology.uniform()) {
    ASSIGN_OR_RETURN(t.micro_batch, MicroBatchFor(spec->parallel.micro_batch, t.per_replica_batch,
                                                  t.topology.pipeline(0).stages()));
  } else {
    t.micro_batch = spec->parallel.micro_batch;
  }
  if (args.steps) spec->train.steps = *args.steps;
  t.steps = spec->train.steps;
  if (auto a = env("MASTER_ADDR"); a && !a->empty()) t.master_addr = *a;
  ASSIGN_OR_RETURN(t.master_port, EnvInt(env, "MASTER_PORT", 29500));
  if (t.master_port <= 0 || t.master_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("MASTER_PORT=", t.master_port, " is invalid"));
  }
  auto agent_store = env("TORCHELASTIC_USE_AGENT_STORE");
  t.store_is_external =
      agent_store && (*agent_store == "True" || *agent_store == "true" || *agent_store == "1");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<WorkerTopology> ResolveTopology(const WorkerArgs& args, JobSpec* spec,
                                               int num_segments, const EnvGetter& env) {
  WorkerTopology t;
  ASSIGN_OR_RETURN(int env_world, EnvInt(env, "WORLD_SIZE", -1));
  if (auto w = env("WORLD_SIZE"); w && !w->empty() && (env_world < 1 || env_world > kMaxSlots)) {
    return absl::InvalidArgumentError(
        absl::StrCat("WORLD_SIZE=", env_world, " is invalid; it must be in [1, ", kMaxSlots, "]"));
  }
  ASSIGN_OR_RETURN(int env_rank, EnvInt(env, "RANK", 0));
  ASSIGN_OR_RETURN(const int tp, ResolveTensorParallel(args, spec, env, &env_world));
  t.tp_size = tp;
  if (args.chunk_size) spec->parallel.micro_batch = *args.chunk_size;
  if (args.pipelines || !spec->parallel.pipelines.empty()) {
    RETURN_IF_ERROR(PipelinesTopology(args, *spec, num_segments, env_world, tp, &t));
  } else {
    RETURN_IF_ERROR(StageMapTopology(args, spec, num_segments, env_world, &t));
  }
  RETURN_IF_ERROR(PlaceProcess(args, spec, env, env_rank, tp, &t));
  return t;
}

absl::StatusOr<int> MicroBatchFor(int requested, int64_t per_replica_batch, int stages) {
  if (requested > per_replica_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.micro_batch (", requested, ") is larger than the per-replica batch (",
        per_replica_batch, " = train.global_batch / replicas)"));
  }
  if (requested > 0) return requested;
  // auto: about 4 micro-batches per stage keeps the bubble near (P-1)/(4P+P-1).
  const int64_t target = 4 * static_cast<int64_t>(stages);
  return static_cast<int>(std::max<int64_t>(1, (per_replica_batch + target - 1) / target));
}

}  // namespace varuna

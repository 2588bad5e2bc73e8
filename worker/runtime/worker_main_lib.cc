#include "worker/runtime/worker_main_lib.h"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <unistd.h>

#include <yaml-cpp/yaml.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_store.h"
#include "common/launch/exit_codes.h"
#include "common/launch/launch_args.h"
#include "common/launch/slurm_env.h"
#include "common/launch/worker_channel.h"
#include "common/launch/worker_protocol.h"
#include "common/net/proto_json.h"
#include "common/planner/profile.h"
#include "varuna/v1/types.pb.h"
#include "worker/dist/device.h"
#include "worker/dist/torch_status.h"
#include "worker/engine/data.h"
#include "worker/engine/heterogeneous.h"
#include "worker/engine/lr_schedule.h"
#include "worker/engine/optimizer.h"
#include "worker/engine/profiler.h"
#include "worker/engine/regroup.h"
#include "worker/engine/varuna.h"
#include "worker/models/hf.h"
#include "worker/models/registry.h"

namespace varuna {
namespace {

// Set by SIGUSR1 (Varuna's contract): finish the step, checkpoint, exit 0.
std::atomic<bool> g_stop_requested{false};
void OnSigusr1(int) { g_stop_requested.store(true); }
// Under Slurm (RunWorker): the first SIGTERM asks for that stop (Slurm's preemption notice);
// a second is the hard stop SIGTERM always was (an agent's stop past its grace, a kill).
void OnSigtermUnderSlurm(int sig) {
  if (g_stop_requested.exchange(true)) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}
// Set by SIGUSR2 (the manager: a peer is gone, abort the step) or by the training thread
// after a failed step: the rescue thread saves the last completed step and exits.
std::atomic<bool> g_rescue_requested{false};
void OnSigusr2(int) { g_rescue_requested.store(true); }

using Clock = std::chrono::steady_clock;

// Note [Morph in place] in regroup.cc: with --in_place, the agent's commands for a regroup
// arrive here (from the listener's thread) for the training thread.
RegroupMailbox g_regroup;

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

// Every report goes through the protocol's codec (Note [Worker protocol] in
// common/launch/worker_protocol.cc): a "ready" event after the rendezvous and resume, one
// "step" per step, and a last event saying how the worker ended.
void ReportToAgent(v1::WorkerEvent event) {
  absl::Status s = AppendWorkerEvent(std::move(event));
  if (!s.ok()) LOG(WARNING) << "report to the agent lost: " << s.message();
}

namespace {

v1::WorkerEvent ErrorEvent(std::string message) {
  v1::WorkerEvent e;
  e.mutable_error()->set_message(std::move(message));
  return e;
}

// How the worker ended after saving `step` (0: nothing saved): stopped on request, or
// rescued after an abort.
v1::WorkerEvent SavedEvent(bool rescued, int64_t step, int64_t committed = 0,
                           int64_t also_saved = 0) {
  v1::WorkerEvent e;
  const auto saved = static_cast<int32_t>(step);
  if (rescued) {
    e.mutable_rescued()->set_saved_step(saved);
    e.mutable_rescued()->set_committed_step(static_cast<int32_t>(committed));
    e.mutable_rescued()->set_also_saved_step(static_cast<int32_t>(also_saved));
  } else {
    e.mutable_stopped()->set_saved_step(saved);
  }
  return e;
}

// The agent's commands do what its signals do: stop is SIGUSR1, checkpoint_now SIGUSR2.
// Runs on the listener's thread.
void OnAgentCommand(const v1::AgentCommand& c) {
  switch (c.kind_case()) {
    case v1::AgentCommand::kStop:
      if (c.stop().park() && g_regroup.in_place()) {
        LOG(INFO) << "the agent asks to checkpoint after this step and wait to regroup";
        g_regroup.ParkOnStop();
      } else {
        LOG(INFO) << "the agent asks to stop after this step (checkpoint, exit)";
      }
      g_stop_requested.store(true);
      break;
    case v1::AgentCommand::kCheckpointNow:
      LOG(INFO) << "the agent asks to abort the step and save the last completed one";
      g_rescue_requested.store(true);
      break;
    case v1::AgentCommand::kReconfigure: {
      if (g_regroup.in_place()) {
        g_regroup.Post(c.reconfigure());
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

// The agent's control FIFO (VARUNA_CONTROL_FIFO), or null: without it (a worker run by hand,
// a FIFO that cannot be opened) the agent's signals still work.
std::unique_ptr<AgentCommandListener> ListenToAgent() {
  const std::optional<std::string> path = GetEnv(kControlFifoEnv);
  if (!path || path->empty()) return nullptr;
  int generation = 0;
  if (auto g = GetEnv("VARUNA_GENERATION"); g && !absl::SimpleAtoi(*g, &generation)) {
    generation = 0;
  }
  auto listener = AgentCommandListener::Start(*path, generation, OnAgentCommand);
  if (!listener.ok()) {
    LOG(WARNING) << listener.status().message() << "; the agent's commands come as signals only";
    return nullptr;
  }
  return *std::move(listener);
}

}  // namespace

// --profile_out (docs/autoconfig.md "Profiling"): every rank profiles the compute at once (as
// in training, every slot is busy), then the links between ranks; rank 0 writes the file and
// reports it in its progress file.
absl::Status RunProfiler(const JobSpec& spec, int64_t global_batch, Model model, TokenDataset& data,
                         const WorkerTopology& topo, const ProcessGroups& groups,
                         const std::string& out, std::chrono::milliseconds timeout,
                         torch::Device device) {
  ProfilerOptions po;
  po.model_key = ModelKey(spec.model);
  po.optimizer = spec.train.optimizer;
  po.seed = spec.train.seed;
  po.rank = topo.rank;
  po.world = groups.world;
  po.timeout = timeout;
  // Host identity: the agent's node name (VARUNA_NODE), else the host name.
  std::string me = GetEnv("VARUNA_NODE").value_or("");
  if (me.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    me = host;
  }
  RETURN_IF_ERROR(TorchCall("exchanging host names", [&] {
    groups.store->set(absl::StrCat("profile_host", topo.rank),
                      std::vector<uint8_t>(me.begin(), me.end()));
    for (int r = 0; r < topo.world_size; ++r) {
      auto v = groups.store->get(absl::StrCat("profile_host", r));
      po.hosts.emplace_back(v.begin(), v.end());
    }
  }));
  ASSIGN_OR_RETURN(Precision precision, ParsePrecision(spec.train.precision));
  std::vector<int> sizes;
  const int64_t cap = std::min<int64_t>(32, global_batch);
  for (int b = 1; b <= cap; b *= 2) sizes.push_back(b);
  Profiler profiler(std::move(model), device, precision, po);
  auto get_batch = [&data](int n) { return data.Batch(0, n); };
  RETURN_IF_ERROR(profiler.Initialize(get_batch));
  const auto t0 = Clock::now();
  ASSIGN_OR_RETURN(v1::Profile profile, profiler.ProfileAll(get_batch, sizes, ""));
  if (topo.rank == 0) {
    RETURN_IF_ERROR(WriteProfileFile(out, profile));
    v1::WorkerEvent e;
    e.mutable_profile()->set_path(out);
    ReportToAgent(std::move(e));
    LOG(INFO) << "profile of " << profile.model_key() << " (" << profile.segments_size()
              << " segments, micro-batches " << absl::StrJoin(sizes, ",") << ") written to " << out
              << " in " << std::chrono::duration<double>(Clock::now() - t0).count() << " s";
  }
  ReportToAgent(SavedEvent(/*rescued=*/false, 0));
  return absl::OkStatus();
}

absl::Status RunWorker(const std::vector<std::string>& argv) {
  // Installed first: a SIGUSR1/2 during start-up must not kill the process (default action).
  std::signal(SIGUSR1, OnSigusr1);
  std::signal(SIGUSR2, OnSigusr2);
  // Gloo's TCP pairs write with writev(2), which raises SIGPIPE when the peer is gone; its
  // default action would kill a survivor before it can rescue or regroup (the one failure the
  // commit soak found: a rank killed by signal 13 after its replica died). Python, which
  // PyTorch users run, ignores SIGPIPE from the start; so does this process. Writes then fail
  // with EPIPE, which gloo reports as an error of the step.
  std::signal(SIGPIPE, SIG_IGN);
  // Under Slurm (docs/operations.md "Slurm"): Slurm's place in the job stands in for
  // torchrun's when the launcher set none, and its preemption signal (SIGTERM to every
  // process of the job, GraceTime before SIGKILL) means what SIGUSR1 means: finish the step,
  // checkpoint, exit; a second SIGTERM still kills. Under an agent the agent asks the same at
  // the same time (Note [Slurm preemption] in agent/main.cc); a worker that died of the
  // signal would lose the step.
  const EnvGetter env = WithSlurmFallback(GetEnv);
  if (GetEnv("SLURM_JOB_ID")) std::signal(SIGTERM, OnSigtermUnderSlurm);
  // The agent's commands (the same requests as those signals) from here on.
  const std::unique_ptr<AgentCommandListener> agent_commands = ListenToAgent();
  // Until the engine is up, an abort (SIGUSR2: a peer is gone) means exit at once: nothing
  // was trained, so the checkpoint this rank would resume from is the state. Without this a
  // rank blocked in the rendezvous with a dead peer would wait for timeout_s.
  auto started = std::make_shared<std::atomic<bool>>(false);
  std::thread startup_watch([started] {
    while (!started->load()) {
      if (g_rescue_requested.load()) {
        ReportToAgent(SavedEvent(/*rescued=*/true, 0));
        std::_Exit(kExitRescued);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  struct StopWatch {
    std::thread& t;
    std::atomic<bool>& started;
    ~StopWatch() {
      started.store(true);
      t.join();
    }
  } stop_watch{startup_watch, *started};
  // Everything wrong before the rendezvous is the input's fault (common/launch/exit_codes.h).
  absl::StatusOr<WorkerArgs> parsed = ParseWorkerArgs(argv);
  if (!parsed.ok()) return MarkBadInput(parsed.status());
  WorkerArgs args = *std::move(parsed);
  {
    int generation = 0;
    if (auto g = GetEnv("VARUNA_GENERATION"); !g || !absl::SimpleAtoi(*g, &generation)) {
      generation = 0;
    }
    g_regroup.Start(args.in_place, generation);
  }
  if (args.help) {
    std::cout << WorkerUsage();
    return absl::OkStatus();
  }
  // Everything that can be wrong with the input is checked before the rendezvous.
  JobSpec spec;
  std::optional<Model> built;
  WorkerTopology topo;
  SchedulePolicy policy = SchedulePolicy::kVaruna;
  Precision precision = Precision::kFp32;
  std::optional<TokenDataset> opened;
  int64_t profile_batch = 0;  // the job's global batch, for a profile run
  absl::Status input = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(spec, LoadJobSpec(args.job_path));
    RETURN_IF_ERROR(ResolveInitFrom(&spec.model));
    RETURN_IF_ERROR(spec.ValidateFiles());
    ASSIGN_OR_RETURN(built, BuildModel(spec.model));
    if (args.list_modules) return absl::OkStatus();
    if (!args.profile_out.empty()) {
      // A profile run measures the model and the links; the shape it was launched with (one
      // replica per slot, say) is irrelevant, so the spec's parallel section is ignored.
      int world = 1;
      if (auto w = env("WORLD_SIZE"); w && !absl::SimpleAtoi(*w, &world)) world = 1;
      profile_batch = spec.train.global_batch;
      spec.parallel.stages = spec.parallel.replicas = spec.parallel.micro_batch = 0;
      spec.parallel.pipelines.clear();
      args.pipelines.reset();
      spec.train.global_batch = std::max(1, world);
      args.per_replica_batch.reset();
      args.chunk_size.reset();
      args.stage_to_rank_map = StageMap::Make(1, std::max(1, world)).ToString();
    }
    ASSIGN_OR_RETURN(topo, ResolveTopology(args, &spec, built->num_segments(), env));
    // The manager's plan (LaunchRequest) fixes the schedule; "auto" run by hand is varuna.
    if (args.schedule) spec.parallel.schedule = *args.schedule;
    if (spec.parallel.schedule == "auto") spec.parallel.schedule = "varuna";
    ASSIGN_OR_RETURN(policy, ParseSchedulePolicy(spec.parallel.schedule));
    ASSIGN_OR_RETURN(precision, ParsePrecision(spec.train.precision));
    if (!args.resume_step && !spec.checkpoint.resume.empty()) {
      args.resume_step = spec.checkpoint.resume;
    }
    if (args.resume_step && spec.checkpoint.dir.empty()) {
      return absl::InvalidArgumentError("--resume_step needs checkpoint.dir in the job spec");
    }
    absl::StatusOr<TokenDataset> d =
        TokenDataset::Open(spec.data, spec.model.seq_len, spec.model.vocab, spec.train.seed);
    if (!d.ok()) return d.status();
    opened.emplace(*std::move(d));
    return absl::OkStatus();
  }();
  if (!input.ok()) return MarkBadInput(input);
  if (args.list_modules) {
    std::cout << absl::StrJoin(PipelineTemplate::GetModules(*built), " ") << "\n";
    return absl::OkStatus();
  }
  Model model = *std::move(built);
  TokenDataset data = *std::move(opened);
  std::string who = absl::StrCat("job=", spec.name, " rank=", topo.rank,
                                 topo.tp_size > 1 ? absl::StrCat(" tp=", topo.tp_rank) : "");
  LOG(INFO) << who << " world=" << topo.world_size << " pipelines=" << topo.topology.ToString()
            << " stage=" << topo.stage << " pipeline=" << topo.replica
            << " global_batch=" << topo.global_batch << " micro_batch=" << topo.micro_batch
            << " schedule=" << spec.parallel.schedule << " precision=" << spec.train.precision;

  // The last stage of pipeline 0 reports the step (the loss is global after the step); after
  // a morph in place the rank that is it now appends to the same file.
  std::ofstream metrics;
  bool writes_metrics = false, metrics_rank = false;
  auto open_metrics = [&](bool append) -> absl::Status {
    // One process per position reports (its tp rank 0).
    metrics_rank = topo.rank == topo.topology.pipeline(0).stages() - 1 && topo.tp_rank == 0;
    writes_metrics =
        !args.metrics_out.empty() && topo.tp_rank == 0 && (metrics_rank || args.metrics_all_ranks);
    if (metrics.is_open()) metrics.close();
    if (!writes_metrics) return absl::OkStatus();
    const std::string path =
        metrics_rank ? args.metrics_out : absl::StrCat(args.metrics_out, ".rank", topo.rank);
    metrics.open(path, append ? std::ios::app : std::ios::trunc);
    if (!metrics) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_out '", path, "' cannot be written"));
    }
    return absl::OkStatus();
  };
  if (absl::Status m = open_metrics(/*append=*/false); !m.ok()) return MarkBadInput(m);
  const int num_segments = model.num_segments();
  const bool has_tied = !model.tied().empty();

  const auto timeout =
      std::chrono::milliseconds(static_cast<int64_t>(spec.parallel.timeout_s * 1000));
  absl::StatusOr<torch::Device> device = ResolveDevice(spec.train.device, topo.local_rank);
  if (!device.ok()) return MarkBadInput(device.status());
  // Ranks on this machine (the agent and torchrun set LOCAL_WORLD_SIZE): more than its GPUs
  // means ranks share a GPU, which NCCL cannot do.
  int local_world = topo.world_size;
  if (auto w = env("LOCAL_WORLD_SIZE");
      w && (!absl::SimpleAtoi(*w, &local_world) || local_world < 1)) {
    local_world = topo.world_size;
  }
  absl::StatusOr<Backend> backend =
      ChooseBackend(*device, local_world, device->is_cuda() ? CudaDeviceCount() : 0);
  if (!backend.ok()) return MarkBadInput(backend.status());
  LOG(INFO) << "rank=" << topo.rank << " device=" << device->str()
            << " backend=" << BackendName(*backend);
  // A malformed VARUNA_FAULT is a start-up error naming it, before any rendezvous.
  ASSIGN_OR_RETURN(FaultInjector faults, FaultInjector::FromEnvironment(topo.rank));
  ASSIGN_OR_RETURN(ProcessGroups groups, CreateProcessGroups(topo, has_tied, timeout, *backend));
  if (groups.tp) {
    ASSIGN_OR_RETURN(model, BuildModel(spec.model, TensorParallelOf(groups)));
  }
  if (!args.profile_out.empty()) {
    started->store(true);
    return RunProfiler(spec, profile_batch, std::move(model), data, topo, groups, args.profile_out,
                       timeout, *device);
  }
  VarunaOptions base_opts;
  base_opts.schedule = policy;
  base_opts.precision = precision;
  base_opts.seed = spec.train.seed;
  base_opts.clip_grad_norm = spec.train.clip_grad_norm;
  base_opts.init_loss_scale = spec.train.init_loss_scale;
  base_opts.loss_scale_window = spec.train.loss_scale_window;
  base_opts.stop_flag = &g_stop_requested;
  const TrainSpec train = spec.train;
  auto lr_at = [train](int64_t step) {
    return LearningRate(train.schedule, train.lr, train.min_lr, train.warmup, train.steps, step);
  };
  // One generation's engine: the stage of `t`, over `g`, optimizer and schedule set.
  auto build_engine = [&](Model m, const WorkerTopology& t, ProcessGroups g, FaultInjector f,
                          SchedulePolicy schedule) -> absl::StatusOr<std::unique_ptr<Varuna>> {
    VarunaOptions opts = base_opts;
    opts.schedule = schedule;
    // Note [Committed step] in varuna.cc: only a job that can be rescued or regrouped pays.
    // Tensor-parallel jobs neither rescue nor regroup (Note [Tensor parallelism]).
    opts.keep_pre_update = spec.checkpoint.commit && t.topology.world_size() > 1 &&
                           t.tp_size == 1 && (!spec.checkpoint.dir.empty() || args.in_place);
    opts.faults = std::move(f);
    ASSIGN_OR_RETURN(auto e, Varuna::Create(std::move(m), t.topology, t.rank, std::move(g),
                                            data.Batch(0, 2), t.micro_batch, *device, opts));
    e->set_optimizer(MakeOptimizer(spec.train, e->named_parameters()));
    e->set_lr_schedule(lr_at);
    return e;
  };
  ASSIGN_OR_RETURN(auto engine, build_engine(std::move(model), topo, std::move(groups),
                                             std::move(faults), policy));
  const double peak_flops = PeakFlops(*device, spec.train.precision);
  LOG(INFO) << who << " peak " << absl::StrFormat("%.3g", peak_flops)
            << " FLOP/s per rank for MFU (docs/observability.md)";

  // Note [Resume]: the checkpoint records the model spec; a different one is refused. The
  // global batch is checked by the engine. Data position = step, so nothing else is needed.
  const std::string model_spec = ModelSpecLine(spec.model);
  const std::string& ckpt_dir = spec.checkpoint.dir;
  int64_t first_step = 1;
  std::optional<HandoverStats> joined;  // a joiner's hand-over (Note [Morph in place])
  if (args.join_in_place) {
    const auto j0 = Clock::now();
    absl::StatusOr<HandoverStats> h =
        HandOver(nullptr, *engine, engine->groups(), topo.rank, ckpt_dir);
    if (!h.ok()) return h.status();
    joined = *h;
    first_step = h->step + 1;
    LOG(INFO) << who << " joined in place after " << h->reason << "; " << h->moved_bytes
              << " bytes from live ranks, " << h->checkpoint_bytes_read
              << " from the checkpoint in "
              << absl::StrFormat("%.3f", std::chrono::duration<double>(Clock::now() - j0).count())
              << " s";
  } else if (args.resume_step) {
    // A checkpoint that cannot be used is the input's fault too: restarting cannot fix it.
    absl::Status resumed = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(std::optional<int64_t> requested, ParseResumeStep(*args.resume_step));
      const std::vector<std::string> model_layers = engine->model_layer_names();
      absl::StatusOr<std::optional<int64_t>> resolved =
          ResolveResumeStep(ckpt_dir, requested, &model_layers);
      if (!resolved.ok() && *args.resume_step == "auto") {
        // A morph's relaunch (docs/morphing.md): nothing complete was saved, so the run
        // starts over rather than fail; a user's "latest" still refuses to.
        LOG(WARNING) << who << " " << resolved.status().message() << "; starting fresh";
        resolved = std::optional<int64_t>();
      }
      RETURN_IF_ERROR(resolved.status());
      const std::optional<int64_t> resume = *resolved;
      if (!resume) {
        LOG(INFO) << who << " no checkpoint in " << ckpt_dir << "; starting fresh";
        return absl::OkStatus();
      }
      const std::string path = CheckpointPath(ckpt_dir, *resume);
      ASSIGN_OR_RETURN(CheckpointCommon common, ReadCheckpointCommon(path));
      const std::string& written = common.model_spec;
      if (written != model_spec) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint ", path, " has model '", written, "' but the job has '", model_spec, "'"));
      }
      ASSIGN_OR_RETURN(int64_t step, engine->load_checkpoint(path));
      first_step = step + 1;
      return absl::OkStatus();
    }();
    if (!resumed.ok()) return MarkBadInput(resumed);
  }
  if (first_step == 1 && !joined && !spec.model.init_from.empty()) {
    // A fresh start from a Hugging Face model (docs/models.md): each rank reads the tensors
    // of its own layers only. A resumed or joined rank has its state already.
    const std::string& dir = spec.model.init_from;
    std::set<std::string> upcast;
    absl::Status loaded = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(HfWeights weights, HfWeights::Open(dir));
      return engine->InitWeights([&](const std::string& layer, torch::nn::Module& module) {
        return LoadHfLayer(weights, spec.model, dir, layer, module, &upcast);
      });
    }();
    if (!loaded.ok()) return MarkBadInput(loaded);
    LOG(INFO) << who << " initialized " << engine->layer_names().size() << " layers from " << dir
              << (upcast.empty() ? std::string()
                                 : absl::StrCat("; ", absl::StrJoin(upcast, ", "),
                                                " weights upcast to fp32 master weights"));
  }
  std::map<std::string, std::string> ckpt_info = {{"model_spec", model_spec},
                                                  {"job_name", spec.name}};
  if (!spec.data.tokenizer_dir.empty()) ckpt_info["tokenizer_dir"] = spec.data.tokenizer_dir;

  // The rescue thread (Note [Rescue] in checkpoint.cc): on SIGUSR2 or a failed step, save the
  // last completed step and exit kExitRescued. It owns the exit from then on, so the
  // training thread, blocked on a dead peer or back from a failed step, never has to return.
  // It rescues whichever engine is current (a morph in place replaces it under engine_mu).
  auto engine_mu = std::make_shared<std::mutex>();
  auto current = std::make_shared<Varuna*>(engine.get());
  started->store(true);  // the rescue thread below takes over
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::thread rescuer([engine_mu, current, ckpt_dir, ckpt_info, who, finished] {
    while (!g_rescue_requested.load()) {
      if (finished->load()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (ckpt_dir.empty()) {
      LOG(WARNING) << who << " step aborted; the job has no checkpoint.dir, nothing saved";
      ReportToAgent(ErrorEvent("step aborted with no checkpoint.dir: nothing saved"));
      std::_Exit(1);
    }
    std::lock_guard<std::mutex> hold(*engine_mu);
    Varuna* eng = *current;
    const auto c0 = Clock::now();
    absl::StatusOr<int64_t> saved = eng->rescue(ckpt_dir, ckpt_info);
    if (!saved.ok()) {
      LOG(ERROR) << who << " rescue failed: " << saved.status();
      ReportToAgent(ErrorEvent(absl::StrCat("rescue failed: ", saved.status().message())));
      std::_Exit(1);
    }
    LOG(INFO) << who << " rescued step " << *saved
              << (eng->rescued_also() > 0 ? absl::StrCat(" and step ", eng->rescued_also()) : "")
              << " (committed " << eng->committed_step() << ") in "
              << absl::StrFormat("%.3f", std::chrono::duration<double>(Clock::now() - c0).count())
              << " s; exiting";
    ReportToAgent(SavedEvent(/*rescued=*/true, *saved, eng->committed_step(), eng->rescued_also()));
    std::_Exit(kExitRescued);
  });
  struct JoinOnReturn {
    std::thread& t;
    std::atomic<bool>& finished;
    ~JoinOnReturn() {
      finished.store(true);
      t.join();
    }
  } join_rescuer{rescuer, *finished};
  {
    v1::WorkerEvent ready;
    ready.mutable_ready()->set_resumed_from(static_cast<int32_t>(first_step - 1));
    if (joined) {
      v1::InPlaceJoin* j = ready.mutable_ready()->mutable_in_place();
      j->set_moved_bytes(joined->moved_bytes);
      j->set_checkpoint_bytes_read(joined->checkpoint_bytes_read);
      j->set_agree_s(joined->agree_s);
      j->set_transfer_s(joined->transfer_s);
      j->set_handover(joined->reason);
    }
    ReportToAgent(std::move(ready));
  }
  g_regroup.SetCurrentAbort(engine->groups().abort);

  // One generation's steps; returns false when this process should regroup (Note [Morph in
  // place] in regroup.cc), true when training ended (done or stopped).
  const int64_t B = topo.global_batch;
  bool stopped = false;  // on request, after a checkpoint
  auto train_steps = [&]() -> absl::StatusOr<bool> {
    for (int64_t step = first_step; step <= topo.steps; ++step) {
      if (g_regroup.Pending()) return false;
      const auto t0 = Clock::now();
      TensorMap batch = data.Batch((step - 1) * B + topo.sample_offset, topo.per_replica_batch);
      absl::StatusOr<StepResult> stepped = engine->step(batch);
      if (!stepped.ok()) {
        LOG(ERROR) << who << " step " << step << " failed: " << stepped.status();
        if (args.in_place) {  // park: wait for the agent's reconfigure
          v1::WorkerEvent e;
          e.set_t(UnixNow());
          e.mutable_parked()->set_step(engine->iteration());
          e.mutable_parked()->set_reason(
              absl::StrCat("step ", step, " failed: ", stepped.status().message()));
          ReportToAgent(std::move(e));
          return false;
        }
        g_rescue_requested.store(true);
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the rescuer exits
      }
      const StepResult r = *stepped;
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      const double lr = lr_at(step);
      // One schema for --metrics_out and the agent: the StepMetrics message (as JSON here, as
      // the step event's payload there).
      v1::StepMetrics m;
      m.set_step(step);
      m.set_loss(r.loss);
      m.set_grad_norm(r.grad_norm);
      m.set_lr(lr);
      m.set_overflow(r.overflow);
      m.set_step_time_s(dt);
      m.set_samples_per_s(B / dt);
      m.set_tokens_per_s(B * spec.model.seq_len / dt);
      m.set_at(UnixNow());
      m.set_pipeline_s(r.pipeline_s);
      m.set_recv_wait_s(r.wait_s);
      m.set_loss_scale(engine->loss_scale());
      m.set_bubble_ratio(r.bubble_ratio);
      // MFU (Note [MFU] in device.h): 6 N FLOPs per token (forward + backward) over the
      // world's peak.
      if (peak_flops > 0) {
        m.set_mfu(6.0 * static_cast<double>(r.model_parameters) * m.tokens_per_s() /
                  (peak_flops * topo.world_size));
      }
      for (double v : r.stage_busy_s) m.add_stage_busy_s(v);
      for (double v : r.stage_wait_s) m.add_stage_wait_s(v);
      if (static_cast<int>(r.rank_busy_s.size()) <= kMaxRankValues) {
        for (double v : r.rank_busy_s) m.add_rank_busy_s(v);
        for (double v : r.rank_wait_s) m.add_rank_wait_s(v);
      }
      if (writes_metrics) {
        metrics << ProtoJson(m) << "\n";
        metrics.flush();
      }
      {
        v1::WorkerEvent e;
        e.set_t(m.at());
        *e.mutable_step() = m;
        ReportToAgent(std::move(e));
      }
      if ((topo.rank == 0 && topo.tp_rank == 0) || metrics_rank) {
        if (step == 1 || step % 10 == 0 || step == topo.steps) {
          LOG(INFO) << who << " step=" << step << " loss=" << absl::StrFormat("%.4f", r.loss)
                    << " grad_norm=" << absl::StrFormat("%.3f", r.grad_norm)
                    << " step_time_s=" << absl::StrFormat("%.3f", dt)
                    << (r.overflow ? " overflow=skipped" : "");
        }
      }
      const bool periodic =
          spec.checkpoint.every_steps > 0 && step % spec.checkpoint.every_steps == 0;
      if (!ckpt_dir.empty() && (periodic || r.stop)) {
        const auto c0 = Clock::now();
        RETURN_IF_ERROR(engine->checkpoint(ckpt_dir, ckpt_info, spec.checkpoint.tempdir,
                                           spec.checkpoint.shard));
        LOG(INFO) << who << " checkpoint step=" << step << " blocked training for "
                  << absl::StrFormat("%.3f",
                                     std::chrono::duration<double>(Clock::now() - c0).count())
                  << " s" << (spec.checkpoint.tempdir.empty() ? "" : " (upload continues)");
        if (topo.rank == 0 && topo.tp_rank == 0) {
          for (int64_t old : PruneCheckpoints(ckpt_dir, spec.checkpoint.keep)) {
            LOG(INFO) << who << " deleted old checkpoint " << CheckpointPath(ckpt_dir, old);
          }
        }
      }
      if (r.stop && g_regroup.in_place() && !g_stop_requested.load()) {
        // The stop is agreed by every rank as soon as one of them was asked; this rank's own
        // command, which says whether it parks (it stays) or exits (it leaves), may still be
        // on its way from its agent. Wait for it a little, else exit (the relaunch serves).
        const auto deadline = Clock::now() + std::chrono::seconds(5);
        while (!g_stop_requested.load() && Clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      }
      if (r.stop && g_regroup.park_on_stop()) {
        RETURN_IF_ERROR(engine->WaitForCheckpoint());
        LOG(INFO) << who << " checkpointed step " << step << " for a morph in place; parked";
        v1::WorkerEvent e;
        e.set_t(UnixNow());
        e.mutable_parked()->set_step(step);
        e.mutable_parked()->set_reason(
            absl::StrCat("checkpointed step ", step, " at a step boundary for a morph"));
        ReportToAgent(std::move(e));
        return false;
      }
      if (r.stop) {
        RETURN_IF_ERROR(engine->WaitForCheckpoint());
        ReportToAgent(SavedEvent(/*rescued=*/false, ckpt_dir.empty() ? 0 : step));
        LOG(INFO) << who << " stop requested: "
                  << (ckpt_dir.empty() ? "no checkpoint.dir, nothing saved" : "checkpointed")
                  << " step=" << step << "; exiting";
        stopped = true;
        return true;
      }
    }
    return true;
  };

  for (;;) {
    ASSIGN_OR_RETURN(bool ended, train_steps());
    if (ended) break;
    // Note [Morph in place] in regroup.cc: wait for the new topology, keep this engine's
    // state, build the new stage, hand layers over.
    std::optional<v1::ReconfigureCommand> cmd =
        g_regroup.Wait(args.park_timeout_s, g_rescue_requested);
    if (!cmd) {
      LOG(WARNING) << who << " no reconfigure within " << args.park_timeout_s
                   << " s; saving the last completed step and exiting";
      g_rescue_requested.store(true);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the rescuer exits
    }
    const auto r0 = Clock::now();
    RETURN_IF_ERROR(engine->WaitForCheckpoint());
    WorkerArgs next = args;
    next.pipelines.reset();
    next.stage_to_rank_map.reset();
    next.per_replica_batch.reset();
    if (!cmd->pipelines().empty()) {
      next.pipelines = cmd->pipelines();
    } else {
      next.stage_to_rank_map = cmd->stage_to_rank_map();
      next.per_replica_batch = cmd->per_replica_batch();
    }
    next.rank = cmd->rank();
    if (cmd->micro_batch() > 0) next.chunk_size = cmd->micro_batch();
    if (!cmd->schedule().empty()) next.schedule = cmd->schedule();
    next.stage_boundaries.assign(cmd->stage_boundaries().begin(), cmd->stage_boundaries().end());
    JobSpec next_spec = spec;
    // Checked by the codec (ValidateCommand).
    const int world = cmd->pipelines().empty()
                          ? StageMap::Parse(cmd->stage_to_rank_map())->world_size()
                          : Topology::Parse(cmd->pipelines())->world_size();
    const std::map<std::string, std::string> overrides = {
        {"WORLD_SIZE", absl::StrCat(world)},
        {"RANK", absl::StrCat(cmd->rank())},
        {"MASTER_ADDR", cmd->master_addr().empty() ? topo.master_addr : cmd->master_addr()},
        {"MASTER_PORT", absl::StrCat(cmd->master_port())},
        {"VARUNA_GENERATION", absl::StrCat(cmd->generation())},
        {"TORCHELASTIC_RESTART_COUNT", absl::StrCat(cmd->generation() - 1)}};
    for (const auto& [k, v] : overrides) setenv(k.c_str(), v.c_str(), /*overwrite=*/1);
    absl::StatusOr<WorkerTopology> nt = ResolveTopology(next, &next_spec, num_segments, GetEnv);
    if (!nt.ok()) {
      LOG(ERROR) << who << " reconfigure refused: " << nt.status();
      g_rescue_requested.store(true);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    if (next.schedule) spec.parallel.schedule = *next.schedule;
    absl::StatusOr<SchedulePolicy> next_policy = ParseSchedulePolicy(
        spec.parallel.schedule == "auto" ? std::string("varuna") : spec.parallel.schedule);
    absl::StatusOr<std::unique_ptr<Varuna>> built_engine = [&]() -> decltype(built_engine) {
      RETURN_IF_ERROR(next_policy.status());
      ASSIGN_OR_RETURN(FaultInjector f, FaultInjector::FromEnvironment(nt->rank));
      ASSIGN_OR_RETURN(ProcessGroups g, CreateProcessGroups(*nt, has_tied, timeout, *backend));
      ASSIGN_OR_RETURN(Model m, BuildModel(spec.model));
      return build_engine(std::move(m), *nt, std::move(g), std::move(f), *next_policy);
    }();
    const auto r1 = Clock::now();
    absl::StatusOr<HandoverStats> handed =
        built_engine.ok()
            ? HandOver(engine.get(), **built_engine, (*built_engine)->groups(), nt->rank, ckpt_dir)
            : absl::StatusOr<HandoverStats>(built_engine.status());
    if (!handed.ok()) {
      // The old engine still holds this rank's state: save it the usual way.
      LOG(ERROR) << who << " morph in place failed: " << handed.status()
                 << "; saving the last completed step and exiting";
      g_rescue_requested.store(true);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    {
      std::lock_guard<std::mutex> hold(*engine_mu);
      RetireGroups(engine->groups());
      engine = *std::move(built_engine);
      *current = engine.get();
    }
    g_regroup.SetCurrentAbort(engine->groups().abort);
    g_regroup.Done(cmd->generation());
    g_stop_requested.store(false);
    if (agent_commands) agent_commands->set_generation(cmd->generation());
    topo = *nt;
    who = absl::StrCat("job=", spec.name, " rank=", topo.rank);
    first_step = handed->step + 1;
    if (absl::Status m = open_metrics(/*append=*/true); !m.ok()) return m;
    const double regroup_s = std::chrono::duration<double>(r1 - r0).count();
    const double transfer_s = handed->transfer_s;
    LOG(INFO) << who << " regrouped in place into generation " << cmd->generation() << " ("
              << topo.topology.ToString() << "): continues after " << handed->reason << "; "
              << handed->moved_bytes << " bytes from live ranks, " << handed->checkpoint_bytes_read
              << " from the checkpoint; regroup " << absl::StrFormat("%.3f", regroup_s)
              << " s, transfer " << absl::StrFormat("%.3f", transfer_s) << " s";
    v1::WorkerEvent ready;
    ready.mutable_ready()->set_resumed_from(static_cast<int32_t>(handed->step));
    v1::InPlaceJoin* rd = ready.mutable_ready()->mutable_in_place();
    rd->set_moved_bytes(handed->moved_bytes);
    rd->set_checkpoint_bytes_read(handed->checkpoint_bytes_read);
    rd->set_regroup_s(regroup_s);
    rd->set_transfer_s(transfer_s);
    rd->set_agree_s(handed->agree_s);
    rd->set_handover(handed->reason);
    ReportToAgent(std::move(ready));
  }
  if (stopped) return absl::OkStatus();
  RETURN_IF_ERROR(engine->WaitForCheckpoint());
  // Held-out evaluation: one global batch from far beyond any training index.
  constexpr int64_t kEvalFirstSample = int64_t{1} << 40;
  ASSIGN_OR_RETURN(
      double eval_loss,
      engine->evaluate(data.Batch(kEvalFirstSample + topo.sample_offset, topo.per_replica_batch)));
  LOG(INFO) << who << " done steps=" << topo.steps
            << " eval_loss=" << absl::StrFormat("%.9g", eval_loss);
  return absl::OkStatus();
}

}  // namespace varuna

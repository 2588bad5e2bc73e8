#include "worker/runtime/worker_run.h"

#include <time.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_store.h"
#include "common/launch/exit_codes.h"
#include "common/launch/launch_contract.h"
#include "common/launch/slurm_env.h"
#include "worker/dist/device.h"
#include "worker/dist/torch_status.h"
#include "worker/engine/heterogeneous.h"
#include "worker/engine/lr_schedule.h"
#include "worker/engine/optimizer.h"
#include "worker/models/hf.h"
#include "worker/models/registry.h"
#include "worker/models/tensor_parallel.h"
#include "worker/runtime/events.h"
#include "worker/runtime/process_state.h"
#include "worker/runtime/worker_main_lib.h"

namespace varuna {
namespace {

using Clock = std::chrono::steady_clock;

// CPU time of this process (a synchronous checkpoint's cost beside its wall time: training
// waits meanwhile, so it is the save's, helper threads included).
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// A masked LM's sample-log fragments: each sample's input_ids and labels after masking (-100
// where a position is not predicted), as Hugging Face takes them. None for other models.
std::vector<std::string> MaskedRecords(const TokenDataset& data, const TensorMap& batch) {
  std::vector<std::string> out;
  if (!data.masked_lm()) return out;
  const torch::Tensor ids = batch.at("input_ids").contiguous();
  const torch::Tensor labels = batch.at("labels").contiguous();
  const int64_t n = ids.size(0), t = ids.size(1);
  const int64_t* a = ids.data_ptr<int64_t>();
  const int64_t* b = labels.data_ptr<int64_t>();
  for (int64_t s = 0; s < n; ++s) {
    out.push_back(absl::StrCat("\"input_ids\": [", absl::StrJoin(a + s * t, a + (s + 1) * t, ", "),
                               "], \"labels\": [", absl::StrJoin(b + s * t, b + (s + 1) * t, ", "),
                               "]"));
  }
  return out;
}

}  // namespace

WorkerRun::WorkerRun(std::vector<std::string> argv)
    // Under Slurm, Slurm's place in the job stands in for torchrun's when the launcher set none.
    : argv_(std::move(argv)), env_(WithSlurmFallback(GetEnv)) {}

absl::Status WorkerRun::Run() {
  // Installed first: a SIGUSR1/2 during start-up must not kill the process (default action).
  ProcessState::InstallSignalHandlers(GetEnv("SLURM_JOB_ID").has_value());
  // The agent's commands (the same requests as those signals) from here on.
  agent_commands_ = ListenToAgent();
  startup_ = std::make_unique<StartupWatch>();
  bool done = false;
  RETURN_IF_ERROR(CheckInput(&done));
  if (done) return absl::OkStatus();
  RETURN_IF_ERROR(Connect());
  if (!in_.args.profile_out.empty()) {
    startup_->Done();
    return RunProfiler(in_.spec, in_.profile_batch, *std::move(in_.model), *in_.data, in_.topo,
                       *link_.groups, in_.args.profile_out, link_.timeout, link_.device);
  }
  RETURN_IF_ERROR(StartEngine());
  RETURN_IF_ERROR(Restore());
  startup_->Done();  // the rescuer takes over
  rescuer_ = std::make_unique<Rescuer>(
      engine_.get(), in_.spec.checkpoint.dir, [this](int64_t step) { return CheckpointInfo(step); },
      in_.who);
  ReportReady(first_step_ - 1, joined_ ? &*joined_ : nullptr, 0);
  ProcessState::Get().regroup.SetCurrentAbort(engine_->view().groups().abort);
  for (;;) {
    ASSIGN_OR_RETURN(bool ended, TrainGeneration());
    if (ended) break;
    RETURN_IF_ERROR(Regroup());
  }
  if (done_.stopped) return absl::OkStatus();
  return Evaluate();
}

// Everything that can be wrong with the input is checked before the rendezvous, and is the
// input's fault (common/launch/exit_codes.h).
absl::Status WorkerRun::CheckInput(bool* done) {
  absl::StatusOr<WorkerArgs> parsed = ParseWorkerArgs(argv_);
  if (!parsed.ok()) return MarkBadInput(parsed.status());
  WorkerArgs& args = in_.args;
  args = *std::move(parsed);
  int generation = 0;
  if (auto g = GetEnv("VARUNA_GENERATION"); !g || !absl::SimpleAtoi(*g, &generation)) {
    generation = 0;
  }
  ProcessState::Get().regroup.Start(args.in_place, generation);
  if (args.help) {
    std::cout << WorkerUsage();
    *done = true;
    return absl::OkStatus();
  }
  JobSpec& spec = in_.spec;
  absl::Status input = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(spec, LoadJobSpec(args.job_path));
    RETURN_IF_ERROR(ResolveInitFrom(&spec.model));
    RETURN_IF_ERROR(ResolveMaskToken(&spec.model, spec.data.tokenizer_dir));
    RETURN_IF_ERROR(spec.ValidateFiles());
    ASSIGN_OR_RETURN(in_.model, BuildModel(spec.model));
    if (args.list_modules) return absl::OkStatus();
    if (!args.profile_out.empty()) {
      // A profile run measures the model and the links; the shape it was launched with (one
      // replica per slot, say) is irrelevant, so the spec's parallel section is ignored.
      int world = 1;
      if (auto w = env_("WORLD_SIZE"); w && !absl::SimpleAtoi(*w, &world)) world = 1;
      in_.profile_batch = spec.train.global_batch;
      spec.parallel.stages = spec.parallel.replicas = spec.parallel.micro_batch = 0;
      spec.parallel.pipelines.clear();
      args.pipelines.reset();
      spec.train.global_batch = std::max(1, world);
      args.per_replica_batch.reset();
      args.chunk_size.reset();
      args.stage_to_rank_map = StageMap::Make(1, std::max(1, world)).ToString();
    }
    ASSIGN_OR_RETURN(in_.topo, ResolveTopology(args, &spec, in_.model->num_segments(), env_));
    // The manager's plan (LaunchRequest) fixes the schedule; "auto" run by hand is varuna.
    if (args.schedule) spec.parallel.schedule = *args.schedule;
    if (spec.parallel.schedule == "auto") spec.parallel.schedule = "varuna";
    ASSIGN_OR_RETURN(in_.policy, ParseSchedulePolicy(spec.parallel.schedule));
    ASSIGN_OR_RETURN(in_.precision, ParsePrecision(spec.train.precision));
    if (!args.resume_step && !spec.checkpoint.resume.empty()) {
      args.resume_step = spec.checkpoint.resume;
    }
    if (args.resume_step && spec.checkpoint.dir.empty()) {
      return absl::InvalidArgumentError("--resume_step needs checkpoint.dir in the job spec");
    }
    ASSIGN_OR_RETURN(TokenDataset d, TokenDataset::Open(spec.data, spec.model.seq_len,
                                                        spec.model.vocab, spec.train.seed));
    in_.data.emplace(std::move(d));
    if (spec.eval.enabled) {
      ASSIGN_OR_RETURN(TokenDataset e, TokenDataset::Open(spec.eval.data, spec.model.seq_len,
                                                          spec.model.vocab, spec.train.seed));
      in_.eval_data.emplace(std::move(e));
    }
    if (IsMaskedLm(spec.model.kind)) {  // Note [Masking] in worker/engine/data.cc
      in_.data->set_masked_lm(spec.model.mask_token, spec.model.vocab);
      if (in_.eval_data) in_.eval_data->set_masked_lm(spec.model.mask_token, spec.model.vocab);
    }
    return absl::OkStatus();
  }();
  if (!input.ok()) return MarkBadInput(input);
  if (args.list_modules) {
    std::cout << absl::StrJoin(PipelineTemplate::GetModules(*in_.model), " ") << "\n";
    *done = true;
    return absl::OkStatus();
  }
  const WorkerTopology& topo = in_.topo;
  in_.who = absl::StrCat("job=", spec.name, " rank=", topo.rank,
                         topo.tp_size > 1 ? absl::StrCat(" tp=", topo.tp_rank) : "");
  LOG(INFO) << in_.who << " world=" << topo.world_size << " pipelines=" << topo.topology.ToString()
            << " stage=" << topo.stage << " pipeline=" << topo.replica
            << " global_batch=" << topo.global_batch << " micro_batch=" << topo.micro_batch
            << " schedule=" << spec.parallel.schedule << " precision=" << spec.train.precision;
  // The last stage of pipeline 0 reports the step (the metrics file is opened, and checked,
  // before the rendezvous).
  reporter_ =
      std::make_unique<StepReporter>(args.metrics_out, args.metrics_all_ranks, spec.model.seq_len);
  if (absl::Status m = reporter_->Open(topo, in_.who, /*append=*/false); !m.ok()) {
    return MarkBadInput(m);
  }
  // Any rank may come to report (after a morph): each checks the directory.
  if (const std::string& tb = spec.observability.tensorboard_dir; !tb.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(tb, ec);
    if (ec) {
      return MarkBadInput(absl::InvalidArgumentError(absl::StrCat(
          "observability.tensorboard_dir '", tb, "' cannot be created: ", ec.message())));
    }
    reporter_->set_tensorboard_dir(tb);
  }
  done_.generation_why = env_("VARUNA_GENERATION_WHY").value_or("");
  in_.num_segments = in_.model->num_segments();
  in_.has_tied = !in_.model->tied().empty();
  link_.timeout = std::chrono::milliseconds(static_cast<int64_t>(spec.parallel.timeout_s * 1000));
  absl::StatusOr<torch::Device> device = ResolveDevice(spec.train.device, topo.local_rank);
  if (!device.ok()) return MarkBadInput(device.status());
  link_.device = *device;
  // Before anything touches the GPU (a context on GPU 0 otherwise, for every rank).
  if (absl::Status cur = MakeCurrent(link_.device); !cur.ok()) return MarkBadInput(cur);
  if (!args.timeline_out.empty()) {
    absl::StatusOr<std::unique_ptr<TimelineOut>> t =
        TimelineOut::Open(args.timeline_out, topo.process_rank(), args.trace_steps, link_.device);
    if (!t.ok()) return MarkBadInput(t.status());
    timeline_ = *std::move(t);
  }
  return absl::OkStatus();
}

absl::Status WorkerRun::Connect() {
  const WorkerTopology& topo = in_.topo;
  // Ranks on this machine (the agent and torchrun set LOCAL_WORLD_SIZE): more than its GPUs
  // means ranks share a GPU, which NCCL cannot do.
  int local_world = topo.world_size;
  if (auto w = env_("LOCAL_WORLD_SIZE");
      w && (!absl::SimpleAtoi(*w, &local_world) || local_world < 1)) {
    local_world = topo.world_size;
  }
  absl::StatusOr<Backend> backend =
      ChooseBackend(link_.device, local_world, link_.device.is_cuda() ? CudaDeviceCount() : 0);
  if (!backend.ok()) return MarkBadInput(backend.status());
  link_.backend = *backend;
  if (link_.device.is_cuda() && link_.backend == Backend::kGloo && !env_("VARUNA_BACKEND") &&
      local_world > CudaDeviceCount()) {
    LOG(WARNING) << "rank=" << topo.rank << " " << local_world << " ranks on this machine and "
                 << CudaDeviceCount() << " GPU(s) visible: ranks share a GPU, which NCCL "
                 << "refuses, so every transfer goes through host memory over gloo (slow); "
                    "where each rank sees a GPU of its own (CUDA_VISIBLE_DEVICES per rank), "
                    "set VARUNA_BACKEND=nccl";
  }
  LOG(INFO) << "rank=" << topo.rank << " device=" << link_.device.str()
            << " backend=" << BackendName(link_.backend);
  // A malformed VARUNA_FAULT is a start-up error naming it, before any rendezvous: bad input
  // (exit 3), which no restart fixes.
  absl::StatusOr<FaultInjector> faults = FaultInjector::FromEnvironment(topo.rank);
  if (!faults.ok()) return MarkBadInput(faults.status());
  link_.faults = *std::move(faults);
  absl::StatusOr<int64_t> step_min = StepMinMsFromEnvironment();
  if (!step_min.ok()) return MarkBadInput(step_min.status());
  const int64_t step_min_ms = *step_min;
  link_.step_min = std::chrono::milliseconds(step_min_ms);
  ASSIGN_OR_RETURN(link_.groups, CreateProcessGroups(topo, in_.has_tied, link_.timeout,
                                                     link_.backend, link_.device));
  if (link_.groups->tp) {
    ASSIGN_OR_RETURN(in_.model,
                     BuildModel(in_.spec.model, TensorParallelOf(*link_.groups, link_.device)));
  }
  return absl::OkStatus();
}

absl::Status WorkerRun::StartEngine() {
  const JobSpec& spec = in_.spec;
  base_opts_.schedule = in_.policy;
  base_opts_.precision = in_.precision;
  base_opts_.seed = spec.train.seed;
  base_opts_.clip_grad_norm = spec.train.clip_grad_norm;
  base_opts_.init_loss_scale = spec.train.init_loss_scale;
  base_opts_.loss_scale_window = spec.train.loss_scale_window;
  base_opts_.stop_flag = &ProcessState::Get().stop_requested;
  if (timeline_) base_opts_.timeline = timeline_->timeline();
  ASSIGN_OR_RETURN(engine_, BuildEngine(*std::move(in_.model), in_.topo, *std::move(link_.groups),
                                        *std::move(link_.faults), in_.policy));
  in_.model.reset();
  link_.groups.reset();
  link_.faults.reset();
  // Measured once, after the engine is up (on a CPU it is a short benchmark).
  const double peak_flops = PeakFlops(link_.device, spec.train.precision);
  reporter_->set_peak_flops(peak_flops);
  LOG(INFO) << in_.who << " peak " << absl::StrFormat("%.3g", peak_flops)
            << " FLOP/s per rank for MFU (docs/observability.md)";
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Varuna>> WorkerRun::BuildEngine(Model m, const WorkerTopology& t,
                                                               ProcessGroups g, FaultInjector f,
                                                               SchedulePolicy schedule) {
  const JobSpec& spec = in_.spec;
  VarunaOptions opts = base_opts_;
  opts.schedule = schedule;
  opts.rolled_rescue = spec.checkpoint.commit;  // Note [Committed step] in varuna.cc
  opts.generation = ProcessState::Get().regroup.generation();
  opts.faults = std::move(f);
  ASSIGN_OR_RETURN(TensorMap sample_batch, in_.data->Batch(0, 2));
  ASSIGN_OR_RETURN(auto e,
                   Varuna::Create(std::move(m), t.topology, t.rank, std::move(g),
                                  std::move(sample_batch), t.micro_batch, link_.device, opts));
  e->set_optimizer(MakeOptimizer(spec.train, e->view().named_parameters()));
  const TrainSpec train = spec.train;
  e->set_lr_schedule([train](int64_t step) {
    return LearningRate(train.schedule, train.lr, train.min_lr, train.warmup, train.steps, step);
  });
  return e;
}

// Note [Resume]: the checkpoint records the model spec; a different one is refused. The
// global batch is checked by the engine. For text and tokens data the position is the step;
// a corpus's stream position is recorded too (data_position) and taken back, refused when the
// corpus changed (TokenDataset::ResumeFrom).
absl::Status WorkerRun::Restore() {
  const JobSpec& spec = in_.spec;
  const std::string& ckpt_dir = spec.checkpoint.dir;
  if (in_.args.join_in_place) {
    const auto j0 = Clock::now();
    ASSIGN_OR_RETURN(HandoverStats h, HandOver(nullptr, *engine_, engine_->view().groups(),
                                               in_.topo.rank, ckpt_dir));
    joined_ = h;
    first_step_ = h.step + 1;
    LOG(INFO) << in_.who << " joined in place after " << h.reason << "; " << h.moved_bytes
              << " bytes from live ranks, " << h.checkpoint_bytes_read << " from the checkpoint in "
              << absl::StrFormat("%.3f", Seconds(j0)) << " s";
  } else if (in_.args.resume_step) {
    // A checkpoint that cannot be used is the input's fault too: restarting cannot fix it.
    if (absl::Status resumed = ResumeFromCheckpoint(); !resumed.ok()) return MarkBadInput(resumed);
  }
  if (first_step_ == 1 && !joined_ && !spec.model.init_from.empty()) {
    // A fresh start from a Hugging Face model (docs/models.md): each rank reads the tensors
    // of its own layers only. A resumed or joined rank has its state already.
    const std::string& dir = spec.model.init_from;
    std::set<std::string> upcast;
    absl::Status loaded = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(HfWeights weights, HfWeights::Open(dir));
      return engine_->InitWeights([&](const std::string& layer, torch::nn::Module& module) {
        return LoadHfLayer(weights, spec.model, dir, layer, module, &upcast);
      });
    }();
    if (!loaded.ok()) return MarkBadInput(loaded);
    LOG(INFO) << in_.who << " initialized " << engine_->view().layer_names().size()
              << " layers from " << dir
              << (upcast.empty() ? std::string()
                                 : absl::StrCat("; ", absl::StrJoin(upcast, ", "),
                                                " weights upcast to fp32 master weights"));
  }
  ckpt_info_ = {{"model_spec", ModelSpecLine(spec.model)}, {"job_name", spec.name}};
  if (!spec.data.tokenizer_dir.empty()) ckpt_info_["tokenizer_dir"] = spec.data.tokenizer_dir;
  return absl::OkStatus();
}

absl::Status WorkerRun::ResumeFromCheckpoint() {
  const std::string& ckpt_dir = in_.spec.checkpoint.dir;
  const std::string& want = *in_.args.resume_step;
  ASSIGN_OR_RETURN(std::optional<int64_t> requested, ParseResumeStep(want));
  const std::vector<std::string> model_layers = engine_->view().model_layer_names();
  absl::StatusOr<std::optional<int64_t>> resolved =
      ResolveResumeStep(ckpt_dir, requested, &model_layers);
  if (!resolved.ok() && want == "auto") {
    // A morph's relaunch (docs/morphing.md): nothing complete was saved, so the run starts
    // over rather than fail; a user's "latest" still refuses to.
    LOG(WARNING) << in_.who << " " << resolved.status().message() << "; starting fresh";
    resolved = std::optional<int64_t>();
  }
  RETURN_IF_ERROR(resolved.status());
  const std::optional<int64_t> resume = *resolved;
  if (!resume) {
    LOG(INFO) << in_.who << " no checkpoint in " << ckpt_dir << "; starting fresh";
    return absl::OkStatus();
  }
  const std::string path = CheckpointPath(ckpt_dir, *resume);
  ASSIGN_OR_RETURN(CheckpointCommon common, ReadCheckpointCommon(path));
  const std::string model_spec = ModelSpecLine(in_.spec.model);
  if (common.model_spec != model_spec) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", path, " has model '",
                                                      common.model_spec, "' but the job has '",
                                                      model_spec, "'"));
  }
  ASSIGN_OR_RETURN(int64_t step, engine_->checkpoints().Load(path));
  RETURN_IF_ERROR(in_.data->ResumeFrom(common.data_position));
  if (common.eval_step > 0) done_.SetLastEval(common.eval_step, common.eval_loss);
  first_step_ = step + 1;
  return absl::OkStatus();
}

void WorkerRun::ReportReady(int64_t resumed_from, const HandoverStats* handed, double regroup_s) {
  // The generation's shape and why, for TensorBoard (written at its first step).
  reporter_->Generation(absl::StrCat(
      "generation ", ProcessState::Get().regroup.generation(), ": ", in_.topo.topology.ToString(),
      " (", in_.topo.world_size, " ranks, schedule ", in_.spec.parallel.schedule, "); ",
      !done_.generation_why.empty()                   ? done_.generation_why
      : ProcessState::Get().regroup.generation() <= 1 ? std::string("first")
                                                      : std::string("restarted"),
      "; continues after step ", resumed_from,
      handed != nullptr ? absl::StrCat(" (in place: ", handed->reason, ")") : std::string()));
  v1::WorkerEvent ready;
  ready.mutable_ready()->set_resumed_from(static_cast<int32_t>(resumed_from));
  if (handed != nullptr) {
    v1::InPlaceJoin* j = ready.mutable_ready()->mutable_in_place();
    j->set_moved_bytes(handed->moved_bytes);
    j->set_checkpoint_bytes_read(handed->checkpoint_bytes_read);
    if (regroup_s > 0) j->set_regroup_s(regroup_s);
    j->set_transfer_s(handed->transfer_s);
    j->set_agree_s(handed->agree_s);
    j->set_handover(handed->reason);
  }
  ReportToAgent(std::move(ready));
}

absl::StatusOr<bool> WorkerRun::TrainGeneration() {
  ASSIGN_OR_RETURN(bool ended, TrainSteps());
  // A generation's last steps' device times are complete by now or soon (Note [Step timeline]).
  if (timeline_) RETURN_IF_ERROR(timeline_->Finish());
  return ended;
}

absl::StatusOr<bool> WorkerRun::TrainSteps() {
  ProcessState& ps = ProcessState::Get();
  const WorkerTopology& topo = in_.topo;
  const int64_t B = topo.global_batch;
  // Note [Sample log] in common/data/sample_log.h: the rank that feeds its pipeline logs.
  const std::string& log_dir = in_.spec.data.sample_log;
  const bool feeds = !log_dir.empty() && in_.data->corpus() && topo.stage == 0 && topo.tp_rank == 0;
  const int generation = ps.regroup.generation();
  if (feeds && in_.sample_log.generation() != generation) {
    RETURN_IF_ERROR(in_.sample_log.Open(log_dir, topo.rank, generation, first_step_ - 1));
  }
  for (int64_t step = first_step_; step <= topo.steps; ++step) {
    if (ps.regroup.Pending()) return false;
    if (timeline_) RETURN_IF_ERROR(timeline_->BeforeStep(step, first_step_, topo.steps));
    const auto t0 = Clock::now();
    ASSIGN_OR_RETURN(TensorMap batch,
                     in_.data->Batch((step - 1) * B + topo.sample_offset, topo.per_replica_batch));
    // A masked LM's loss is a mean over the global batch's predicted positions.
    const double denominator =
        in_.data->masked_lm() ? static_cast<double>(in_.data->LossTokens((step - 1) * B, B)) : 0;
    absl::StatusOr<StepResult> stepped = engine_->step(batch, denominator);
    if (!stepped.ok() && timeline_) timeline_->StepFailed();
    if (!stepped.ok()) return ParkAfterFailure(step, stepped.status());
    const StepResult r = *stepped;
    if (feeds) {
      RETURN_IF_ERROR(in_.sample_log.Append(
          step, in_.data->Refs((step - 1) * B + topo.sample_offset, topo.per_replica_batch),
          MaskedRecords(*in_.data, batch)));
    }
    const TrainSpec& t = in_.spec.train;
    const double lr = LearningRate(t.schedule, t.lr, t.min_lr, t.warmup, t.steps, step);
    const double step_s = Seconds(t0);
    // A stop (a notice, a morph) saves first, so a deadline finds the state on disk; the
    // step's validation, if due, follows in the same generation (every rank is still here).
    if (r.stop) RETURN_IF_ERROR(CheckpointAfter(step, true));
    absl::StatusOr<std::optional<double>> eval_loss = ValidateAfter(step);
    if (!eval_loss.ok()) return ParkAfterFailure(step, eval_loss.status());
    reporter_->Report(step, r, step_s, lr, engine_->loss_scale(), *eval_loss);
    if (timeline_) RETURN_IF_ERROR(timeline_->AfterStep(step, r.host_syncs, step_s));
    if (!r.stop) RETURN_IF_ERROR(CheckpointAfter(step, false));
    if (r.stop && ps.regroup.in_place() && !ps.stop_requested.load()) {
      // The stop is agreed by every rank as soon as one of them was asked; this rank's own
      // command, which says whether it parks (it stays) or exits (it leaves), may still be on
      // its way from its agent. Wait for it a little, else exit (the relaunch serves).
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      while (!ps.stop_requested.load() && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    if (r.stop && ps.regroup.park_on_stop()) {
      RETURN_IF_ERROR(engine_->checkpoints().Wait());
      LOG(INFO) << in_.who << " checkpointed step " << step << " for a morph in place; parked";
      v1::WorkerEvent e;
      e.set_t(UnixNow());
      e.mutable_parked()->set_step(step);
      e.mutable_parked()->set_reason(
          absl::StrCat("checkpointed step ", step, " at a step boundary for a morph"));
      ReportToAgent(std::move(e));
      return false;
    }
    if (r.stop) {
      const bool saved = !in_.spec.checkpoint.dir.empty();
      RETURN_IF_ERROR(engine_->checkpoints().Wait());
      ReportToAgent(SavedEvent(/*rescued=*/false, saved ? step : 0));
      LOG(INFO) << in_.who << " stop requested: "
                << (saved ? "checkpointed" : "no checkpoint.dir, nothing saved") << " step=" << step
                << "; exiting";
      done_.stopped = true;
      return true;
    }
    if (link_.step_min.count() > 0) std::this_thread::sleep_until(t0 + link_.step_min);
  }
  return true;
}

bool WorkerRun::ParkAfterFailure(int64_t step, const absl::Status& why) {
  LOG(ERROR) << in_.who << " step " << step << " failed: " << why;
  if (!in_.args.in_place) rescuer_->RescueAndExit();
  // Park: wait for the agent's reconfigure.
  v1::WorkerEvent e;
  e.set_t(UnixNow());
  e.mutable_parked()->set_step(engine_->iteration());
  e.mutable_parked()->set_reason(absl::StrCat("step ", step, " failed: ", why.message()));
  ReportToAgent(std::move(e));
  return false;
}

// Note [Validation] in worker/engine/varuna.cc: this pipeline's share of eval.samples, in
// proportion to its share of the global batch, in rounds of at most its training rows. The
// samples are the eval data's first ones, whatever the shape.
absl::StatusOr<std::optional<double>> WorkerRun::ValidateAfter(int64_t step) {
  const EvalSpec& eval = in_.spec.eval;
  const WorkerTopology& t = in_.topo;
  const bool due =
      eval.enabled && ((eval.every_steps > 0 && step % eval.every_steps == 0) || step == t.steps);
  if (!due) return std::nullopt;
  const auto e0 = Clock::now();
  const int64_t samples = eval.samples > 0 ? eval.samples : t.global_batch;
  const int64_t lo = samples * t.sample_offset / t.global_batch;
  const int64_t hi = samples * (t.sample_offset + t.per_replica_batch) / t.global_batch;
  // Each round read when it runs: memory of one training step's rows, whatever eval.samples.
  const int64_t rows = t.per_replica_batch;
  const int64_t rounds = hi > lo ? (hi - lo + rows - 1) / rows : 0;
  ASSIGN_OR_RETURN(double loss, engine_->evaluate(rounds, [&](int64_t r) {
    const int64_t first = lo + r * rows;
    return in_.eval_data->Batch(first, std::min(rows, hi - first));
  }));
  done_.SetLastEval(step, loss);
  LOG(INFO) << in_.who << " validation after step " << step << " took "
            << absl::StrFormat("%.3f", Seconds(e0)) << " s";
  return loss;
}

// What a checkpoint of `step` records besides the state, periodic or rescued alike: the job's
// fields, where a corpus's stream stood after the step (so a resume on other data is refused
// by name) and the newest validation at or before it. A rescue calls this on the rescuer's
// thread, hence the lock around the validation record.
std::map<std::string, std::string> WorkerRun::CheckpointInfo(int64_t step) const {
  std::map<std::string, std::string> info = ckpt_info_;
  // The job's global batch, fixed for its life (every shape a morph picks keeps it), read from
  // the spec because a regroup rewrites in_.topo while a rescue may be reading.
  if (in_.data->corpus())
    info["data_position"] = in_.data->PositionRecord(step * in_.spec.train.global_batch);
  const std::optional<std::pair<int64_t, double>> eval = done_.LastEval();
  if (eval && eval->first <= step) {
    info["eval_step"] = absl::StrCat(eval->first);
    info["eval_loss"] = absl::StrFormat("%.9g", eval->second);
  }
  return info;
}

absl::Status WorkerRun::CheckpointAfter(int64_t step, bool stop) {
  const CheckpointSpec& c = in_.spec.checkpoint;
  const bool periodic = c.every_steps > 0 && step % c.every_steps == 0;
  if (c.dir.empty() || !(periodic || stop)) return absl::OkStatus();
  const auto c0 = Clock::now();
  const double cpu0 = ProcessCpuSeconds();
  RETURN_IF_ERROR(engine_->checkpoints().Save(c.dir, CheckpointInfo(step), c.tempdir, c.shard));
  LOG(INFO) << in_.who << " checkpoint step=" << step << " blocked training for "
            << absl::StrFormat("%.3f", Seconds(c0)) << " s (cpu "
            << absl::StrFormat("%.3f", ProcessCpuSeconds() - cpu0) << " s)"
            << (c.tempdir.empty() ? "" : " (upload continues)");
  if (in_.topo.rank == 0 && in_.topo.tp_rank == 0) {
    for (int64_t old : PruneCheckpoints(c.dir, c.keep)) {
      LOG(INFO) << in_.who << " deleted old checkpoint " << CheckpointPath(c.dir, old);
    }
  }
  return absl::OkStatus();
}

// Note [Morph in place] in worker/engine/regroup.cc: wait for the new topology, keep this
// engine's state, build the new stage, hand layers over.
absl::Status WorkerRun::Regroup() {
  ProcessState& ps = ProcessState::Get();
  std::optional<v1::ReconfigureCommand> cmd =
      ps.regroup.Wait(in_.args.park_timeout_s, ps.rescue_requested);
  if (!cmd) {
    LOG(WARNING) << in_.who << " no reconfigure within " << in_.args.park_timeout_s
                 << " s; saving the last completed step and exiting";
    rescuer_->RescueAndExit();
  }
  const auto r0 = Clock::now();
  RETURN_IF_ERROR(engine_->checkpoints().Wait());
  WorkerArgs next = in_.args;
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
  JobSpec next_spec = in_.spec;
  // Checked by the codec (ValidateCommand).
  const int world = cmd->pipelines().empty()
                        ? StageMap::Parse(cmd->stage_to_rank_map())->world_size()
                        : Topology::Parse(cmd->pipelines())->world_size();
  // Note [Launch contract] in common/launch/launch_contract.h: the torchrun part, as the agent
  // would have set it for this rank of the new generation.
  const std::map<std::string, std::string> overrides = RegroupEnvironment(
      world, cmd->rank(), cmd->master_addr().empty() ? in_.topo.master_addr : cmd->master_addr(),
      cmd->master_port(), cmd->generation());
  for (const auto& [k, v] : overrides) setenv(k.c_str(), v.c_str(), /*overwrite=*/1);
  absl::StatusOr<WorkerTopology> nt = ResolveTopology(next, &next_spec, in_.num_segments, GetEnv);
  if (!nt.ok()) {
    LOG(ERROR) << in_.who << " reconfigure refused: " << nt.status();
    rescuer_->RescueAndExit();
  }
  JobSpec& spec = in_.spec;
  if (next.schedule) spec.parallel.schedule = *next.schedule;
  absl::StatusOr<SchedulePolicy> next_policy = ParseSchedulePolicy(
      spec.parallel.schedule == "auto" ? std::string("varuna") : spec.parallel.schedule);
  absl::StatusOr<std::unique_ptr<Varuna>> built = [&]() -> decltype(built) {
    RETURN_IF_ERROR(next_policy.status());
    ASSIGN_OR_RETURN(FaultInjector f, FaultInjector::FromEnvironment(nt->rank));
    ASSIGN_OR_RETURN(ProcessGroups g, CreateProcessGroups(*nt, in_.has_tied, link_.timeout,
                                                          link_.backend, link_.device));
    ASSIGN_OR_RETURN(Model m, BuildModel(spec.model));
    return BuildEngine(std::move(m), *nt, std::move(g), std::move(f), *next_policy);
  }();
  const auto r1 = Clock::now();
  absl::StatusOr<HandoverStats> handed =
      built.ok() ? HandOver(engine_.get(), **built, (*built)->view().groups(), nt->rank,
                            spec.checkpoint.dir)
                 : absl::StatusOr<HandoverStats>(built.status());
  if (!handed.ok()) {
    // The old engine still holds this rank's state: save it the usual way.
    LOG(ERROR) << in_.who << " morph in place failed: " << handed.status()
               << "; saving the last completed step and exiting";
    rescuer_->RescueAndExit();
  }
  const std::string who = absl::StrCat("job=", spec.name, " rank=", nt->rank);
  Varuna* next_engine = built->get();
  rescuer_->Swap(next_engine, who, [&] {
    RetireGroups(engine_->view().groups());
    engine_ = *std::move(built);
  });
  ps.regroup.SetCurrentAbort(engine_->view().groups().abort);
  // A step the hand-over rolled this rank forward through was applied without TrainSteps: it
  // is logged in the old generation's file, with the old slice (Note [Sample log] in
  // common/data/sample_log.h). Done() moves the generation on.
  SampleLog& log = in_.sample_log;
  if (log.open() && log.generation() == ps.regroup.generation()) {
    for (int64_t step = log.last_step() + 1; step <= handed->step; ++step) {
      const int64_t first = (step - 1) * in_.topo.global_batch + in_.topo.sample_offset;
      std::vector<std::string> extra;
      if (in_.data->masked_lm()) {
        ASSIGN_OR_RETURN(TensorMap b, in_.data->Batch(first, in_.topo.per_replica_batch));
        extra = MaskedRecords(*in_.data, b);
      }
      RETURN_IF_ERROR(log.Append(step, in_.data->Refs(first, in_.topo.per_replica_batch), extra));
    }
  }
  ps.regroup.Done(cmd->generation());
  done_.generation_why = cmd->why();
  ps.stop_requested.store(false);
  if (agent_commands_) agent_commands_->set_generation(cmd->generation());
  in_.topo = *nt;
  in_.who = who;
  first_step_ = handed->step + 1;
  RETURN_IF_ERROR(reporter_->Open(in_.topo, in_.who, /*append=*/true));
  const double regroup_s = std::chrono::duration<double>(r1 - r0).count();
  LOG(INFO) << in_.who << " regrouped in place into generation " << cmd->generation() << " ("
            << in_.topo.topology.ToString() << "): continues after " << handed->reason << "; "
            << handed->moved_bytes << " bytes from live ranks, " << handed->checkpoint_bytes_read
            << " from the checkpoint; regroup " << absl::StrFormat("%.3f", regroup_s)
            << " s, transfer " << absl::StrFormat("%.3f", handed->transfer_s) << " s";
  ReportReady(handed->step, &*handed, regroup_s);
  return absl::OkStatus();
}

absl::Status WorkerRun::Evaluate() {
  RETURN_IF_ERROR(engine_->checkpoints().Wait());
  if (in_.spec.eval.enabled) {
    // The generation's last step validated (ValidateAfter, on every rank); a generation that
    // had no step left to take (a joiner has no validation of its own) does now, every rank.
    if (first_step_ > in_.topo.steps || !done_.LastEval()) {
      ASSIGN_OR_RETURN(std::optional<double> loss, ValidateAfter(in_.topo.steps));
      (void)loss;
    }
    LOG(INFO) << in_.who << " done steps=" << in_.topo.steps
              << " eval_loss=" << absl::StrFormat("%.9g", done_.LastEval()->second);
    return absl::OkStatus();
  }
  // Held-out evaluation: one global batch from far beyond any training index.
  constexpr int64_t kEvalFirstSample = int64_t{1} << 40;
  ASSIGN_OR_RETURN(TensorMap batch, in_.data->Batch(kEvalFirstSample + in_.topo.sample_offset,
                                                    in_.topo.per_replica_batch));
  ASSIGN_OR_RETURN(
      double eval_loss,
      engine_->evaluate(1, [&](int64_t) -> absl::StatusOr<TensorMap> { return batch; }));
  LOG(INFO) << in_.who << " done steps=" << in_.topo.steps
            << " eval_loss=" << absl::StrFormat("%.9g", eval_loss);
  return absl::OkStatus();
}

}  // namespace varuna

#pragma once

// libvaruna: the pipeline + data-parallel engine for one rank (ARCHITECTURE "Step semantics").
//
// Usage (see examples/train_custom.cc):
//   varuna::Model model = ...;                      // layers + CutPoints + Tie()
//   auto v = varuna::Varuna::Create(model, stage_to_rank_map, dummy_inputs,
//                                   global_batch, chunk_size);   // torchrun environment
//   (*v)->set_optimizer(std::make_shared<torch::optim::AdamW>((*v)->view().parameters(), ...));
//   auto r = (*v)->step(per_replica_inputs);        // {loss, overflow, grad_norm}
//   (*v)->checkpoints().Save(dir);                  // worker/engine/checkpoint.h
//
// Unlike Python Varuna, step() also applies the optimizer update (skipped on overflow), with
// the learning rate from set_lr_schedule(), so every rank makes the same decision.
// All methods must be called from one thread, the same on every rank, in the same order.
//
// Varuna is a facade: it holds start-up (agreement, tied weights, dry run) and the step that
// ties the parts together, and owns the engine's state (worker/engine/engine_state.h: the
// RankStage start-up builds, the TrainingState the steps change). Its parts: a PipelineExecutor
// (worker/engine/pipeline_executor.h) runs the stage's schedule, a GradientReducer
// (worker/engine/gradient_reducer.h) all-reduces the gradients, a Checkpointer
// (worker/engine/checkpoint.h, checkpoints()) saves, rescues, loads and hands over the state,
// and an EngineView (view()) answers the read-only questions.

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/pipeline/schedule.h"
#include "common/pipeline/stage_map.h"
#include "common/pipeline/topology.h"
#include "worker/dist/process_group.h"
#include "worker/engine/checkpoint.h"
#include "worker/engine/engine_state.h"
#include "worker/engine/fault.h"
#include "worker/engine/gradient_reducer.h"
#include "worker/engine/pipeline_executor.h"
#include "worker/engine/step_timeline.h"
#include "worker/models/model.h"

namespace varuna {

struct VarunaOptions {
  SchedulePolicy schedule = SchedulePolicy::kVaruna;
  Precision precision = Precision::kFp32;
  uint64_t seed = 1;          // weight init (per layer) and dropout streams
  double clip_grad_norm = 0;  // 0 = off
  double init_loss_scale = 65536;
  int64_t loss_scale_window = 1000;
  int64_t bucket_bytes = 25 << 20;  // data-parallel all-reduce bucket size
  // The first bucket in backward order is smaller, so its all-reduce starts early (as DDP).
  int64_t first_bucket_bytes = 1 << 20;
  // Overlapped all-reduce (Note [Overlapped all-reduce] in gradient_reducer.cc): post each bucket's
  // all-reduce as soon as the last micro-batch's backward has produced all of its gradients,
  // instead of after the pipeline. The result is bit-identical either way.
  bool overlap_allreduce = true;
  double timeout_s = 300;  // rendezvous, p2p and collectives (seed-style Create only)
  // Stage boundaries (stages+1 segment indices) chosen by the planner; empty = balance the
  // model's own layer costs (PartitionByCost).
  std::vector<int> boundaries;
  // Polled once per step; true asks to stop (e.g. set from a SIGUSR1 handler). Optional.
  const std::atomic<bool>* stop_flag = nullptr;
  // Note [Committed step] in varuna.cc: a rescue also writes what a peer behind or ahead of
  // this rank needs to reach the newest step (Note [Rolled rescue]); nothing is copied per
  // step. false: a rescue writes its own step alone (the job spec's checkpoint.commit).
  bool rolled_rescue = true;
  // The generation this engine trains in (the manager's count; 0: not known), stamped on a
  // rescue's update and pending layers (Note [Rolled rescue]).
  int64_t generation = 0;
  // Note [Faults] in fault.cc: VARUNA_FAULT's entries for this rank (none in production).
  FaultInjector faults;
  // Marks each step's phases on it (Note [Step timeline] in step_timeline.cc); the caller
  // owns it, ends its steps and reads them. Optional.
  StepTimeline* timeline = nullptr;
};

struct StepResult {
  double loss = 0;        // mean over the global batch
  bool overflow = false;  // non-finite gradients somewhere: the update was skipped
  double grad_norm = 0;   // global L2 norm before clipping (unscaled)
  // Some rank asked to stop (request_stop(), SIGUSR1 in varuna-worker): every rank sees the
  // same value after the same step, so all checkpoint the same step and stop together.
  bool stop = false;
  // Note [Step timing]: every rank's time in the schedule, computing and waiting on
  // receives, gathered by the step's agreement all-reduce. For pipeline 0's stages, in order.
  std::vector<double> stage_busy_s, stage_wait_s;
  // The same for every rank, index = rank (every pipeline's stages).
  std::vector<double> rank_busy_s, rank_wait_s;
  // 1 - sum(busy) / (stages * max(busy + wait)) over pipeline 0: its measured bubble.
  double bubble_ratio = 0;
  int64_t model_parameters = 0;  // of the whole model, tied weights once
  // This rank: its time in the pipeline schedule and, of that, waiting on receives (s).
  double pipeline_s = 0, wait_s = 0;
  // Data-parallel buckets this rank posted during the backward (Note [Overlapped all-reduce]
  // in gradient_reducer.cc), and how many it has.
  int early_buckets = 0, buckets = 0;
  // Note [Host syncs] in varuna.cc: the reads from the device to the host this step made.
  int host_syncs = 0;
};

class Varuna {
 public:
  // Builds this rank's stage of `model` on `topology` (uniform topologies without boundaries
  // are cut by options.boundaries, else partitioned by cost), ties parameters, and runs the
  // dry run that learns boundary shapes. `dummy_inputs` holds at least 2 samples of every
  // input. The global batch is the topology's; `chunk_size` is the micro-batch size.
  // Collective with every rank of the job.
  static absl::StatusOr<std::unique_ptr<Varuna>> Create(Model model, Topology topology, int rank,
                                                        ProcessGroups groups,
                                                        const TensorMap& dummy_inputs,
                                                        int chunk_size, torch::Device device,
                                                        VarunaOptions options);
  // The uniform case: P x D from a stage map, global_batch / D samples per replica.
  static absl::StatusOr<std::unique_ptr<Varuna>> Create(
      Model model, StageMap map, int rank, ProcessGroups groups, const TensorMap& dummy_inputs,
      int64_t global_batch, int chunk_size, torch::Device device, VarunaOptions options);
  // The seed API's shape: rank, WORLD_SIZE and the rendezvous come from the torchrun
  // environment (RANK, MASTER_ADDR, MASTER_PORT); the process groups are created here.
  // `stage_to_rank_map` may also be heterogeneous pipelines in Topology's text form (the
  // agent's --pipelines / VARUNA_PIPELINES); `chunk_size` is then required.
  // `batch_size` is the global batch, `chunk_size` the micro-batch; `shared_weights` are
  // pairs of parameter names to tie (added to the model's own Tie() pairs).
  static absl::StatusOr<std::unique_ptr<Varuna>> Create(
      Model model, const std::string& stage_to_rank_map, const TensorMap& dummy_inputs,
      int64_t batch_size, int chunk_size, Precision precision = Precision::kFp32,
      int local_rank = -1, torch::Device device = torch::kCPU,
      const std::vector<std::pair<std::string, std::string>>& shared_weights = {},
      VarunaOptions options = {});

  // The optimizer, over view().parameters() (or view().named_parameters()).
  void set_optimizer(std::shared_ptr<torch::optim::Optimizer> optimizer) {
    train_.optimizer = std::move(optimizer);
  }
  // Learning rate for 1-based optimizer step s; applied to every param group before the update.
  void set_lr_schedule(std::function<double(int64_t)> fn) { lr_fn_ = std::move(fn); }

  // One optimizer step on this pipeline's share of the global batch (global_batch / D samples
  // in the uniform case; view().topology().pipeline(view().replica()).samples in general).
  // `loss_denominator`: what the step's loss is a mean over, with a loss_tokens input the
  // global batch's predicted positions (TokenDataset::LossTokens); 0 = the global batch.
  absl::StatusOr<StepResult> step(const TensorMap& inputs, double loss_denominator = 0);
  // Applies step `step`, whose agreement this rank posted but never saw complete (a split, a
  // peer lost mid-collective: Note [Committed step] in varuna.cc), with `vector`, that step's
  // agreed vector as a rank that saw it completes holds it (checkpoints().CommitState()). The
  // reduced gradients are still on the parameters: the update is the one the others applied.
  // FailedPrecondition when this rank is not one step behind with that agreement pending.
  absl::Status RollForward(int64_t step, const std::vector<double>& vector);
  // Mean loss per sample over every pipeline's inputs, each pipeline its own share in rounds
  // (Note [Validation] in varuna.cc; no round is fine: the pipeline adds nothing to the
  // world's sum); no update.
  absl::StatusOr<double> evaluate(int64_t rounds,
                                  const std::function<absl::StatusOr<TensorMap>(int64_t)>& round);
  // Fills this stage's layers with load(layer name, layer) before the first step
  // (model.init_from), agreed by every rank like the start-up, then makes tied copies equal
  // again (a tied second the source lacks takes the first's loaded value).
  absl::Status InitWeights(
      const std::function<absl::Status(const std::string&, torch::nn::Module&)>& load);

  // Asks every rank to stop after the step in progress (or the next one): StepResult::stop.
  // Async-signal-safe; callable from any thread.
  void request_stop() { stop_requested_.store(true); }

  // Steps applied (the step a checkpoint now would save), and the fp16 loss scale.
  int64_t iteration() const { return train_.iteration; }
  double loss_scale() const { return train_.scaler.scale(); }

  // Where this rank sits and what its stage holds (topology, stage, groups, parameters, layer
  // names): fixed once Create() returns.
  EngineView view() const { return EngineView(stage_); }
  // Checkpoints of this stage: save, rescue, load, and the hand-over of a morph in place.
  Checkpointer& checkpoints() { return checkpointer_; }
  const Checkpointer& checkpoints() const { return checkpointer_; }

 private:
  Varuna(Model model, Topology topology, int rank, ProcessGroups groups, int chunk_size,
         torch::Device device, VarunaOptions options);
  absl::Status Build(const TensorMap& dummy_inputs);
  absl::Status BuildLocal();
  absl::Status DryRun(const TensorMap& dummy_inputs, bool ok_so_far, StageConfig* config);
  absl::Status CheckInputs(const TensorMap& inputs, int64_t want) const;
  // Its second half: every input holds the batch (`want` samples if > 0) along dim 0.
  static absl::Status CheckBatch(const TensorMap& inputs, int64_t want);
  // This rank's squared gradient norm, a double on the device (a tied pair's second copy not
  // counted; with tensor parallelism summed over the tp group, which also joins *stop, a
  // device scalar) and its parameter count. Reads nothing back. Throws as LibTorch does:
  // called inside step()'s TorchCall.
  torch::Tensor LocalGradNormSq(torch::Tensor* stop, int64_t* local_params);
  // After the pipeline: gives parameters without a gradient zeros, reduces tied weights and
  // finishes the data-parallel all-reduce (the step's comm phase until the agreement).
  absl::Status ReduceGradients(const std::vector<torch::Tensor>& params, int64_t taking);
  // Everything after step `taking`'s agreement `vector` is known, under train_.mu: the
  // commit's record, the scaler, the update, the gradients released, the step counted.
  absl::Status ApplyAgreed(const std::vector<torch::Tensor>& params, std::vector<double> vector,
                           int64_t taking, StepResult* result);
  // The update of the agreed step train_.iteration + 1 to every parameter with a gradient:
  // clipping to options_.clip_grad_norm by `grad_norm` (the global norm), the scheduled rate,
  // the optimizer's step. Also the loader's, for a rolled rescue (Note [Rolled rescue]).
  void ApplyUpdate(const std::vector<torch::Tensor>& params, double grad_norm);

  RankStage stage_;  // filled by Build(), fixed afterwards
  torch::Device device_;
  VarunaOptions options_;
  std::unique_ptr<GradientReducer> reducer_;    // built by BuildLocal()
  std::unique_ptr<PipelineExecutor> executor_;  // built by Build(), after the dry run
  std::function<double(int64_t)> lr_fn_;
  TrainingState train_;  // Note [Committed step] in varuna.cc, Note [Rescue] in checkpoint.cc
  bool broken_ = false;  // a step failed midway: refuse further steps
  std::atomic<bool> stop_requested_{false};
  // Last, so that it goes first: its destructor waits for a background upload.
  Checkpointer checkpointer_;
};

}  // namespace varuna

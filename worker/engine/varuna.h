#pragma once

// libvaruna: the pipeline + data-parallel engine for one rank (ARCHITECTURE "Step semantics").
//
// Usage (see examples/train_custom.cc):
//   varuna::Model model = ...;                      // layers + CutPoints + Tie()
//   auto v = varuna::Varuna::Create(model, stage_to_rank_map, dummy_inputs,
//                                   global_batch, chunk_size);   // torchrun environment
//   (*v)->set_optimizer(std::make_shared<torch::optim::AdamW>((*v)->parameters(), ...));
//   auto r = (*v)->step(per_replica_inputs);        // {loss, overflow, grad_norm}
//
// Unlike Python Varuna, step() also applies the optimizer update (skipped on overflow), with
// the learning rate from set_lr_schedule(), so every rank makes the same decision.
// All methods must be called from one thread, the same on every rank, in the same order.
//
// Varuna holds start-up (agreement, tied weights, dry run), the step that ties the parts
// together, and checkpoints (checkpoint.cc). Its parts: a PipelineExecutor
// (worker/engine/pipeline_executor.h) runs the stage's schedule, a GradientReducer
// (worker/engine/gradient_reducer.h) all-reduces the gradients.

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/pipeline/schedule.h"
#include "common/pipeline/stage_map.h"
#include "common/pipeline/topology.h"
#include "worker/dist/process_group.h"
#include "worker/engine/fault.h"
#include "worker/engine/gradient_reducer.h"
#include "worker/engine/loss_scaler.h"
#include "worker/engine/pipeline_executor.h"
#include "worker/engine/step_commit.h"
#include "worker/models/model.h"
#include "worker/models/tensor_parallel.h"

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
  // Note [Committed step] in varuna.cc: keep each step's pre-update state until the next
  // step's agreement commits it, so a rescue can save a step every survivor has. Costs a
  // copy of this stage's parameters and optimizer state per step (docs/morphing.md has the
  // measured cost); the worker turns it on for jobs that can morph (checkpoint.dir set, more
  // than one rank).
  bool keep_pre_update = false;
  // Note [Faults] in fault.cc: VARUNA_FAULT's entries for this rank (none in production).
  FaultInjector faults;
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
};

// One layer's state in the checkpoint's per-layer format (parameters, optimizer state,
// buffers), from pickled bytes or a layer file (adding its size to `bytes_read` if given).
absl::StatusOr<c10::Dict<std::string, at::Tensor>> UnpickleLayer(const std::vector<char>& bytes,
                                                                 const std::string& what);
absl::StatusOr<c10::Dict<std::string, at::Tensor>> ReadLayerFile(const std::string& file,
                                                                 int64_t* bytes_read);

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
  ~Varuna();

  // This stage's parameters (for the optimizer), and with their model-wide names.
  std::vector<torch::Tensor> parameters() const;
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const;

  void set_optimizer(std::shared_ptr<torch::optim::Optimizer> optimizer) {
    optimizer_ = std::move(optimizer);
  }
  // Learning rate for 1-based optimizer step s; applied to every param group before the update.
  void set_lr_schedule(std::function<double(int64_t)> fn) { lr_fn_ = std::move(fn); }

  // One optimizer step on this pipeline's share of the global batch (global_batch / D samples
  // in the uniform case; topology().pipeline(replica()).samples in general).
  absl::StatusOr<StepResult> step(const TensorMap& inputs);
  // Mean loss per sample over every pipeline's `inputs` (each its own share); no update.
  absl::StatusOr<double> evaluate(const TensorMap& inputs);

  // Writes this rank's part of DIR/varuna_ckpt_<iteration()> (docs/checkpoints.md): pipeline 0
  // writes every layer's file (each rank its own) and a manifest + marker; rank 0 also writes
  // common.json, with `info` added as string fields (the worker records the job spec there).
  // With `tempdir`, files go to local disk first and a background thread uploads them to
  // `dir` (markers last); training continues. Call WaitForCheckpoint() before exiting.
  // With `shard`, layer files are spread over the ranks holding them (Note [Sharded writes]).
  absl::Status checkpoint(const std::string& dir,
                          const std::map<std::string, std::string>& info = {},
                          const std::string& tempdir = "", bool shard = false);
  // Saves the state of the last completed step after a failed one, with no collective
  // (Note [Rescue] in checkpoint.cc): every layer of this stage plus its rescue record into
  // DIR/varuna_ckpt_<iteration()>. Safe to call from another thread while step() is blocked
  // on a dead peer. Returns the step saved (0: nothing trained yet, nothing written).
  absl::StatusOr<int64_t> rescue(const std::string& dir,
                                 const std::map<std::string, std::string>& info = {});
  // Waits for a background upload; returns its outcome (OK if none was running).
  absl::Status WaitForCheckpoint();
  // Loads a complete checkpoint directory (verify it first: ResolveResumeStep) into this stage,
  // whatever configuration wrote it: parameters, buffers, optimizer state, loss scaler, step.
  // Call after set_optimizer(). Returns the step it resumes after.
  absl::StatusOr<int64_t> load_checkpoint(const std::string& ckpt_path);
  // Names of every layer of the whole model (all stages), as a checkpoint records them.
  std::vector<std::string> model_layer_names() const;
  // Fills this stage's layers with load(layer name, layer) before the first step
  // (model.init_from), agreed by every rank like the start-up, then makes tied copies equal
  // again (a tied second the source lacks takes the first's loaded value).
  absl::Status InitWeights(
      const std::function<absl::Status(const std::string&, torch::nn::Module&)>& load);

  // Morph in place (Note [Morph in place] in worker/engine/regroup.cc). The steps whose state this
  // rank can hand over: the newest it applied and, while that one is not committed, the one
  // before it (Note [Committed step]); newest first, with the loss scaler of each.
  struct RestorableStep {
    int64_t step = 0;
    double loss_scale = 0;
    int64_t clean_steps = 0;
  };
  std::vector<RestorableStep> restorable_steps() const;
  // This stage's layers as they were after `step` (one of restorable_steps()), by layer name,
  // in the checkpoint's per-layer format, with the loss scaler of that step. Thread-safe
  // against step() on another thread (state_mu_).
  struct HeldState {
    int64_t step = 0;
    double loss_scale = 0;
    int64_t clean_steps = 0;
    std::map<std::string, c10::Dict<std::string, at::Tensor>> layers;  // by layer name
  };
  absl::StatusOr<HeldState> HeldAt(int64_t step) const;
  // Takes a state every rank of the new topology agreed on: each layer of this stage from
  // `state.layers` (all must be there), the scaler, and `state.step` as the committed step
  // this generation starts from. Call after set_optimizer().
  absl::Status Adopt(const HeldState& state);
  // This rank's layers, model-wide names, in order.
  const std::vector<std::string>& layer_names() const { return layer_names_; }
  // The groups (to keep alive after this engine is gone: Note [Aborting waits]).
  const ProcessGroups& groups() const { return groups_; }

  // Asks every rank to stop after the step in progress (or the next one): StepResult::stop.
  // Async-signal-safe; callable from any thread.
  void request_stop() { stop_requested_.store(true); }

  int64_t iteration() const { return iteration_; }
  // The newest step this rank knows every rank has or can restore (Note [Committed step]).
  int64_t committed_step() const;
  // What the last rescue() wrote besides the step it returned (0: nothing else).
  int64_t rescued_also() const { return rescued_also_; }
  const Topology& topology() const { return topo_; }
  int stage() const { return topo_.StageOf(rank_); }
  // Depth of this rank's pipeline.
  int stages() const { return topo_.pipeline(replica()).stages(); }
  // This rank's pipeline, and how many there are (the data-parallel width).
  int replica() const { return topo_.PipelineOf(rank_); }
  int replicas() const { return topo_.num_pipelines(); }
  bool is_last_stage() const { return stage() == stages() - 1; }
  double loss_scale() const { return scaler_.scale(); }
  // Tensor parallelism (from groups.tp): this rank's slice of its stage. Checkpoints hold
  // full tensors whatever tp_size wrote them (Note [Tensor parallelism] in tensor_parallel.cc).
  const TensorParallel& tensor_parallel() const { return tp_; }
  // This stage's sharded parameters, model-wide names (empty without tensor parallelism).
  std::map<std::string, ShardSpec> sharded_parameters() const;

 private:
  // The background checkpoint upload (Note [Background upload] in checkpoint.cc).
  struct Upload {
    std::thread thread;
    std::mutex mu;       // guards status
    std::mutex join_mu;  // WaitForCheckpoint may run on the rescue thread too
    absl::Status status;
  };

  Varuna(Model model, Topology topology, int rank, ProcessGroups groups, int chunk_size,
         torch::Device device, VarunaOptions options);
  absl::Status Build(const TensorMap& dummy_inputs);
  absl::Status BuildLocal();
  absl::Status DryRun(const TensorMap& dummy_inputs, bool ok_so_far, StageConfig* config);
  absl::Status CheckInputs(const TensorMap& inputs, int64_t want) const;
  // This rank's squared gradient norm (a tied pair's second copy not counted; with tensor
  // parallelism summed over the tp group, which also joins *stop) and its parameter count.
  // Throws as LibTorch does: called inside step()'s TorchCall.
  double LocalGradNormSq(double* stop, int64_t* local_params);
  // With options_.keep_pre_update, the state before this step's update (Note [Committed step]
  // in varuna.cc).
  absl::Status KeepPreUpdate();
  // The update of an agreed step: clipping to options_.clip_grad_norm, the scheduled rate,
  // the optimizer's step.
  void ApplyUpdate(const std::vector<torch::Tensor>& params, double grad_norm, int64_t taking);
  absl::StatusOr<std::vector<std::pair<std::string, c10::Dict<std::string, at::Tensor>>>>
  SnapshotLayers(const std::vector<bool>& mine) const;
  std::string CommonJson(const std::vector<int>& writers,
                         const std::map<std::string, std::string>& info) const;
  // The same for a step other than the current one (a rescue of the pre-update state).
  std::string CommonJsonAt(int64_t step, double loss_scale, int64_t clean_steps,
                           const std::vector<int>& writers,
                           const std::map<std::string, std::string>& info) const;
  // Writes a rescue of `layers` as step `step` into DIR (Note [Rescue] in checkpoint.cc).
  absl::Status WriteRescue(const std::string& dir, int64_t step, const LayerSnapshot& layers,
                           const std::string& common_json);
  // Copies layer i's parameters, optimizer state and buffers from `in` (the checkpoint's
  // per-layer format); `what` names the source in errors.
  absl::Status LoadLayer(size_t i, const c10::Dict<std::string, at::Tensor>& in,
                         const std::string& what);
  // With tensor parallelism: replaces every sharded tensor of `snapshot` (parameters and their
  // optimizer state) by the full tensor gathered from the group. Collective over the tp group.
  absl::Status GatherShards(
      const std::vector<bool>& mine,
      std::vector<std::pair<std::string, c10::Dict<std::string, at::Tensor>>>* snapshot) const;

  Model model_;
  Topology topo_;
  int rank_;
  ProcessGroups groups_;
  int chunk_size_;
  torch::Device device_;
  VarunaOptions options_;

  // This stage: its layers (model order), their names, and their parameters with model-wide
  // names.
  std::vector<std::shared_ptr<Layer>> layers_;
  std::vector<std::string> layer_names_;
  std::vector<std::pair<std::string, torch::Tensor>> named_params_;
  // Each layer's sharded parameters (ShardsOf), and the group they are split over.
  std::vector<std::map<std::string, ShardSpec>> layer_shards_;
  TensorParallel tp_;
  std::unique_ptr<GradientReducer> reducer_;    // built by BuildLocal()
  std::unique_ptr<PipelineExecutor> executor_;  // built by Build(), after the dry run

  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::function<double(int64_t)> lr_fn_;
  DynamicLossScaler scaler_;
  int64_t iteration_ = 0;
  StepCommit commit_;  // Note [Committed step] in varuna.cc; guarded by state_mu_
  int64_t rescued_also_ = 0;
  bool broken_ = false;  // a step failed midway: refuse further steps
  std::atomic<bool> stop_requested_{false};
  mutable std::mutex state_mu_;  // parameters, optimizer, scaler, iteration_ (Note [Rescue])
  Upload upload_;
};

}  // namespace varuna

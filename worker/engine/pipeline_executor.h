#pragma once

// One stage's part of a step: its schedule (common/pipeline/schedule.h) of forwards,
// recomputes and backwards over the micro-batches, with activations and gradients to and from
// the neighbouring stages (worker/dist/comm.h), timed for Note [Step timing] in varuna.h.
//
//   PipelineExecutor exec(layers, config);  // boundary metas from the dry run (varuna.cc)
//   PipelineRunOptions run;
//   run.weight_denominator = global_batch;
//   absl::StatusOr<PipelineResult> r = exec.Run(pipeline_share_of_the_batch, run);
//
// Every stage of a pipeline runs the same number of micro-batches in the same mode, one Run at
// a time, on one thread.

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/pipeline/schedule.h"
#include "worker/dist/comm.h"
#include "worker/engine/step_timeline.h"
#include "worker/models/model.h"

namespace varuna {

enum class Precision { kFp32, kBf16, kFp16 };
absl::StatusOr<Precision> ParsePrecision(const std::string& name);

// Runs `layers` in order on (x, inputs) with the precision's autocast (the engine's forward).
// With `keep_autocast_cache` the weights' lower-precision casts stay cached for the next
// forward (Note [Autocast cache] in pipeline_executor.cc); the caller must then clear them
// before the weights change (PipelineExecutor::Run does, at its end).
torch::Tensor ForwardLayers(const std::vector<std::shared_ptr<Layer>>& layers,
                            const torch::Tensor& x, const TensorMap& inputs, Precision precision,
                            torch::Device device, bool keep_autocast_cache = false);

// A boundary tensor as the dry run describes it (Note [Dry run] in varuna.cc): [ndim, dtype,
// shape at 1 sample (kMaxBoundaryDims), shape at 2 samples (kMaxBoundaryDims)]. A dimension
// that is 1 then 2 is a batch dimension. ndim -1 marks a stage that failed its dry run.
constexpr int kMaxBoundaryDims = 8;
constexpr int kBoundaryMetaSize = 2 + 2 * kMaxBoundaryDims;
std::vector<int64_t> MakeBoundaryMeta(const torch::Tensor& at1, const torch::Tensor& at2);
// The buffer for that tensor at `batch` samples.
TensorSpec BoundarySpec(const std::vector<int64_t>& meta, int64_t batch);

// Returns `t` as the transport takes it: contiguous, on `to` (the host for gloo). Host copies
// of GPU tensors go through pinned memory.
torch::Tensor ForTransfer(const torch::Tensor& t, const torch::Device& to);

// Where a stage sits and how it runs; fixed for the executor's life.
struct StageConfig {
  // The groups to its neighbours, one per direction (Note [Pipeline links] in
  // worker/dist/process_group.h); unused (null) with a single stage.
  PipelineLinks links;
  int rank = 0;
  int stage = 0, stages = 1;  // this stage and the depth of its pipeline
  int chunk_size = 1;         // micro-batch size (the last one may be smaller)
  // zb-h1 splits each backward into B and W (Note [Deferred weight gradients] in linear.cc).
  SchedulePolicy schedule = SchedulePolicy::kVaruna;
  // Varuna's run-time swap of a waiting recompute and a ready forward (Note [Pipeline
  // execution]). Off with tensor parallelism: the tp ranks of a stage must run their tasks,
  // and so their collectives, in one order.
  bool reorder = true;
  Precision precision = Precision::kFp32;
  torch::Device device = torch::kCPU;       // compute
  torch::Device xfer_device = torch::kCPU;  // where boundary tensors travel
  std::chrono::milliseconds timeout{300000};
  // Boundary metas (MakeBoundaryMeta) of the stage's input (stage > 0) and output (stage <
  // stages - 1), from the dry run.
  std::vector<int64_t> in_meta, out_meta;
};

// What one Run() does.
struct PipelineRunOptions {
  // Forwards, recomputes and backwards per the schedule; false: forwards only, without
  // autograd graphs (evaluation).
  bool train = true;
  // Each micro-batch's loss is weighted by its samples (or, with a loss_tokens input, its
  // predicted positions) / weight_denominator.
  double weight_denominator = 1;
  // The backward starts from loss x loss_scale (fp16's dynamic loss scale; 1 otherwise).
  double loss_scale = 1;
  // Called right before the step's last backward (GradientReducer::Arm). Optional.
  std::function<void()> before_last_backward;
  // With a split schedule (zb-h1): called after the step's last W pass with the weights whose
  // gradients it completed (GradientReducer::DeferredGradientsReady). Optional.
  std::function<void(const std::vector<torch::Tensor>&)> after_last_weight_pass;
  // Called once the step's first forward on this stage is done (fault injection). Optional.
  std::function<void()> after_first_forward;
  // Marks the forwards (recomputes included) and backwards (W passes included) (Note [Step
  // timeline] in step_timeline.cc). Optional.
  StepTimeline* timeline = nullptr;
};

// Note [Step timing] in varuna.h: wall time from the first task to the last transfer joined,
// and the part of it spent waiting for receives.
struct PipelineTiming {
  double pipeline_s = 0;
  double wait_s = 0;
};

struct PipelineResult {
  // On the last stage, the weighted sum of the micro-batches' losses, a double on the stage's
  // device, summed there so the step reads nothing back per micro-batch; undefined elsewhere.
  torch::Tensor loss_sum;
  PipelineTiming timing;
  // loss_sum read on the host (a sync on a GPU); 0 where undefined.
  double loss() const { return loss_sum.defined() ? loss_sum.item<double>() : 0.0; }
};

class PipelineExecutor {
 public:
  // `layers` are the stage's, in order (shared with the engine, which switches their mode).
  PipelineExecutor(std::vector<std::shared_ptr<Layer>> layers, StageConfig config);
  PipelineExecutor(const PipelineExecutor&) = delete;
  PipelineExecutor& operator=(const PipelineExecutor&) = delete;

  // Splits `inputs` (samples along dim 0) into micro-batches and runs the stage's schedule
  // over them. Gradients accumulate into the layers' parameters. After an error the transfers
  // are joined, but messages may be in flight: the pipeline cannot be run again.
  absl::StatusOr<PipelineResult> Run(const TensorMap& inputs, const PipelineRunOptions& options);
  // The timing of the last Run(), failed or not.
  const PipelineTiming& last_timing() const { return last_timing_; }

 private:
  struct RunState;  // one Run's micro-batches, stashes, graphs and counters
  bool is_last_stage() const { return config_.stage == config_.stages - 1; }
  void StartTransfers(const std::vector<int64_t>& sizes, bool train);
  absl::Status RunTasks(RunState& s);
  absl::Status Forward(const Task& t, RunState& s);
  absl::Status Recompute(int m, RunState& s);
  absl::Status Backward(int m, RunState& s);
  absl::Status WeightPass(int m, RunState& s);
  absl::StatusOr<torch::Tensor> Take(Receiver* rx, RunState& s);
  absl::Status JoinTransfers(absl::Status st, bool train);

  std::vector<std::shared_ptr<Layer>> layers_;
  StageConfig config_;
  std::unique_ptr<Receiver> act_rx_, grad_rx_;
  std::unique_ptr<Sender> act_tx_, grad_tx_;
  PipelineTiming last_timing_;
};

}  // namespace varuna

#pragma once

// The engine's state, grouped by who changes it, and its read-only face. Varuna
// (worker/engine/varuna.h) owns a RankStage and a TrainingState; its Checkpointer
// (worker/engine/checkpoint.h) reads the first and reads and restores the second; callers ask
// questions through an EngineView (Varuna::view()).

#include <c10/core/Event.h>
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/pipeline/topology.h"
#include "worker/dist/process_group.h"
#include "worker/engine/loss_scaler.h"
#include "worker/engine/step_commit.h"
#include "worker/models/model.h"
#include "worker/models/tensor_parallel.h"

namespace varuna {

// Where this rank sits in the job and what its stage holds. Start-up (Varuna::Create) fills it
// (the stage boundaries, then the layers); it does not change afterwards.
struct RankStage {
  RankStage(Model model, Topology topology, int rank, ProcessGroups groups, int chunk_size)
      : model(std::move(model)),
        topology(std::move(topology)),
        rank(rank),
        groups(std::move(groups)),
        chunk_size(chunk_size) {}

  Model model;  // the whole model; this rank builds only its stage's layers
  Topology topology;
  int rank = 0;
  ProcessGroups groups;
  int chunk_size = 0;  // the micro-batch size
  TensorParallel tp;   // this rank's slice of its stage (from groups.tp)
  // This stage: its layers (model order), their names, and their parameters with model-wide
  // names.
  std::vector<std::shared_ptr<Layer>> layers;
  std::vector<std::string> layer_names;
  std::vector<std::pair<std::string, torch::Tensor>> named_params;
  // Each layer's sharded parameters (ShardsOf), split over tp.
  std::vector<std::map<std::string, ShardSpec>> layer_shards;
};

// What the steps change: the optimizer's state (and the parameters it updates), the loss
// scaler, the step count and what is known of committed steps. Varuna::step() and
// Checkpointer::Adopt() change it under `mu` (Checkpointer::Load(), before the first step,
// without it); a rescue or a hand-over on another thread reads it under `mu` (Note [Rescue] in
// checkpoint.cc).
struct TrainingState {
  TrainingState(double init_loss_scale, int64_t loss_scale_window)
      : scaler(init_loss_scale, loss_scale_window) {}

  std::shared_ptr<torch::optim::Optimizer> optimizer;
  DynamicLossScaler scaler;
  int64_t iteration = 0;
  StepCommit commit;  // Note [Committed step] in varuna.cc
  // On a device: recorded on the compute stream after every change to the state (an update, a
  // load, an adoption), so snapshots copy behind it alone (Note [Rescue copies] in
  // checkpoint.cc). Empty on the CPU and before the first change.
  std::optional<c10::Event> changed;
  // On a device: recorded on the compute stream when a step's gradients are reduced and
  // unscaled, before its agreement is posted, so a rescue copies them behind it alone (Note
  // [Rolled rescue] in common/checkpoint/checkpoint_store.cc). Empty on the CPU.
  std::optional<c10::Event> grads_ready;
  std::mutex mu;  // parameters, optimizer, scaler, iteration, commit, changed, grads_ready
};

// Read-only answers about one rank's engine that do not change once Varuna::Create() returns:
// the rank's place (topology, pipeline, stage, groups, tensor-parallel slice) and its stage's
// layers and parameters. It owns nothing: it reads the engine's RankStage, so it is valid while
// the engine lives. Any thread.
class EngineView {
 public:
  explicit EngineView(const RankStage& stage) : s_(&stage) {}

  const Topology& topology() const { return s_->topology; }
  // The groups (to keep alive after the engine is gone: Note [Aborting waits]).
  const ProcessGroups& groups() const { return s_->groups; }
  // Tensor parallelism (from groups.tp): this rank's slice of its stage. Checkpoints hold
  // full tensors whatever tp_size wrote them (Note [Tensor parallelism] in tensor_parallel.cc).
  const TensorParallel& tensor_parallel() const { return s_->tp; }
  int stage() const { return s_->topology.StageOf(s_->rank); }
  // Depth of this rank's pipeline.
  int stages() const { return s_->topology.pipeline(replica()).stages(); }
  // This rank's pipeline, and how many there are (the data-parallel width).
  int replica() const { return s_->topology.PipelineOf(s_->rank); }
  int replicas() const { return s_->topology.num_pipelines(); }
  bool is_last_stage() const { return stage() == stages() - 1; }

  // This stage's parameters (for the optimizer), and with their model-wide names.
  std::vector<torch::Tensor> parameters() const;
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const {
    return s_->named_params;
  }
  // This rank's layers, model-wide names, in order.
  const std::vector<std::string>& layer_names() const { return s_->layer_names; }
  // Names of every layer of the whole model (all stages), as a checkpoint records them.
  std::vector<std::string> model_layer_names() const;
  // This stage's sharded parameters, model-wide names (empty without tensor parallelism).
  std::map<std::string, ShardSpec> sharded_parameters() const;

 private:
  const RankStage* s_;
};

}  // namespace varuna

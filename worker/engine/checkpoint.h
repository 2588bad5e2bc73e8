#pragma once

// Checkpoints of one rank's stage: per-layer files keyed by parameter name, so any
// (P', D', micro-batch) can load what any configuration wrote (docs/checkpoints.md; layout:
// common/checkpoint/checkpoint_store.h).

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/checkpoint/checkpoint_store.h"
#include "worker/engine/engine_state.h"
#include "worker/engine/fault.h"
#include "worker/engine/step_commit.h"
#include "worker/models/layer_file.h"

namespace varuna {

// The layers of `stage` marked in `mine` (one flag per layer), each with its optimizer state in
// `optimizer`, on the host in the checkpoint's per-layer format, keyed by layer name: copies,
// or with `borrow` the CPU state's own tensors (for a caller that writes them before the state
// changes again). A device's tensors are copied into pinned memory; with `after`
// (TrainingState::changed) the copies run on a side stream behind that event alone (Note
// [Rescue copies] in checkpoint.cc).
absl::StatusOr<LayerSnapshot> SnapshotLayers(const RankStage& stage,
                                             torch::optim::Optimizer& optimizer,
                                             const std::vector<bool>& mine,
                                             const c10::Event* after = nullptr,
                                             bool borrow = false);
// Records `state.changed` on `device`'s current stream (nothing on the CPU). Under state.mu.
void MarkStateChanged(TrainingState& state, torch::Device device);
// Records `state.grads_ready` the same way.
void MarkGradientsReady(TrainingState& state, torch::Device device);
// `state.changed` for SnapshotLayers' `after`, or null before the first change (or on the CPU).
const c10::Event* ChangedEvent(const TrainingState& state);

// Saves, rescues, loads and hands over one rank's stage: Varuna::checkpoints(). It owns the
// background upload (Note [Background upload] in checkpoint.cc) and what the last rescue wrote;
// it reads the engine's RankStage and reads and restores its TrainingState, under the state's
// lock, so the steps and it see each other whole. Save(), Wait(), Load() and Adopt() are called
// from the training thread like Varuna's methods; Rescue() and the queries of a morph in place
// may also run on another thread.
class Checkpointer {
 public:
  // Morph in place (Note [Morph in place] in worker/engine/regroup.cc): a step whose state this
  // rank can hand over, with the loss scaler of that step.
  struct RestorableStep {
    int64_t step = 0;
    double loss_scale = 0;
    int64_t clean_steps = 0;
  };
  // This stage's layers as they were after `step`, by layer name, in the checkpoint's
  // per-layer format, with the loss scaler of that step.
  struct HeldState {
    int64_t step = 0;
    double loss_scale = 0;
    int64_t clean_steps = 0;
    std::map<std::string, c10::Dict<std::string, at::Tensor>> layers;  // by layer name
  };

  // `stage`, `state` and `faults` belong to the engine and outlive this.
  Checkpointer(const RankStage& stage, TrainingState& state, const FaultInjector& faults)
      : stage_(&stage), state_(&state), faults_(&faults) {}
  // Waits for a background upload still running.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Writes this rank's part of DIR/varuna_ckpt_<iteration> (docs/checkpoints.md): pipeline 0
  // writes every layer's file (each rank its own) and a manifest + marker; rank 0 also writes
  // common.json, with `info` added as string fields (the worker records the job spec there).
  // With `tempdir`, files go to local disk first and a background thread uploads them to
  // `dir` (markers last); training continues. Call Wait() before exiting.
  // With `shard`, layer files are spread over the ranks holding them (Note [Sharded writes]).
  // Collective over the tp group with tensor parallelism. Call after set_optimizer().
  absl::Status Save(const std::string& dir, const std::map<std::string, std::string>& info = {},
                    const std::string& tempdir = "", bool shard = false);
  // What a checkpoint of a given step records besides the state (common.json's further fields:
  // the job's, where the data stream stood after that step, the newest validation by then).
  using InfoAt = std::function<std::map<std::string, std::string>(int64_t step)>;
  // Saves the state of the last completed step after a failed one, with no collective
  // (Note [Rescue] in checkpoint.cc): every layer of this stage plus its rescue record into
  // DIR/varuna_ckpt_<iteration>, written with info(iteration) (none when null) and the step's
  // agreed update; with the next step's agreement pending, also the layers with that step's
  // gradients into its directory (Note [Rolled rescue] in
  // common/checkpoint/checkpoint_store.cc; rescued_pending() says so). Safe to call from another
  // thread while step() is blocked on a dead peer; `info` is called on that thread with the
  // state's lock held. Returns the step saved (0: nothing trained yet, no step written).
  absl::StatusOr<int64_t> Rescue(const std::string& dir, const InfoAt& info = nullptr);
  // Waits for a background upload; returns its outcome (OK if none was running).
  absl::Status Wait();
  // Loads a complete checkpoint directory (verify it first: ResolveResumeStep) into this stage,
  // whatever configuration wrote it: parameters, buffers, optimizer state, loss scaler, step.
  // A layer saved only at the step before, with this step's gradients, is brought to this
  // step with the update its rescuers recorded (Note [Rolled rescue]). Call after
  // set_optimizer(). Returns the step it resumes after.
  absl::StatusOr<int64_t> Load(const std::string& ckpt_path);
  // The engine's update of the step after the state's iteration, to the parameters given (with
  // their gradients) and clipped by a global gradient norm: what Load() applies to a rolled
  // layer. Set by the engine.
  using ApplyUpdateFn = std::function<void(const std::vector<torch::Tensor>&, double)>;
  void set_apply_update(ApplyUpdateFn fn) { apply_update_ = std::move(fn); }
  // false: Rescue() writes its own step alone, no pending layers and no update record
  // (VarunaOptions::rolled_rescue).
  void set_rolled_rescue(bool on) { rolled_rescue_ = on; }
  // The generation this engine trains in (the manager's count; 0: not known), recorded with a
  // rescue's update and pending layers so that those of different generations never combine.
  void set_generation(int64_t generation) { generation_ = generation; }

  // The steps whose state this rank can hand over: the newest it applied (Note [Committed
  // step] in varuna.cc; a peer behind it rolls forward instead of taking an older one).
  std::vector<RestorableStep> RestorableSteps() const;
  // What a morph in place needs of this rank's commit record (Note [Committed step] in
  // varuna.cc): the newest step whose agreement completed here with its agreed vector, and the
  // step whose agreement it posted without seeing the result (0: none).
  struct CommitRecord {
    int64_t agreed = 0;
    std::vector<double> vector;
    int64_t pending = 0;
  };
  CommitRecord CommitState() const;
  // The state after `step` (one of RestorableSteps()). Thread-safe against step() on another
  // thread (the state's lock).
  absl::StatusOr<HeldState> HeldAt(int64_t step) const;
  // Takes a state every rank of the new topology agreed on: each layer of this stage from
  // `state.layers` (all must be there), the scaler, and `state.step` as the committed step
  // this generation starts from. Call after set_optimizer().
  absl::Status Adopt(const HeldState& state);

  // The newest step this rank knows every rank has or can restore (Note [Committed step] in
  // varuna.cc).
  int64_t committed_step() const;
  // The step whose checkpoint the last Rescue() also wrote pending layers into (0: none).
  int64_t rescued_pending() const { return rescued_pending_; }

 private:
  // The background checkpoint upload (Note [Background upload] in checkpoint.cc).
  struct Upload {
    std::thread thread;
    std::mutex mu;       // guards status
    std::mutex join_mu;  // Wait may run on the rescue thread too
    absl::Status status;
  };

  std::string CommonJson(const std::vector<int>& writers,
                         const std::map<std::string, std::string>& info) const;
  // Writes a rescue of `layers` as step `step` into DIR (Note [Rescue] in checkpoint.cc).
  absl::Status WriteRescue(const std::string& dir, int64_t step, const LayerSnapshot& layers,
                           const std::string& common_json);
  // Writes `layers` with the gradients of step `step` (its agreement pending) into DIR's
  // checkpoint of `step` (Note [Rolled rescue]). Under the state's lock.
  absl::Status WritePending(const std::string& dir, int64_t step, LayerSnapshot layers);
  // Load()'s part for rolled layers (`rolled`: layer index and its pending file's tensors).
  absl::Status RollLoadedForward(const std::string& ckpt_path, const CheckpointCommon& common,
                                 const std::vector<std::pair<size_t, LayerDict>>& rolled);
  // Copies layer i's parameters, optimizer state and buffers from `in` (the checkpoint's
  // per-layer format); `what` names the source in errors.
  absl::Status LoadLayer(size_t i, const c10::Dict<std::string, at::Tensor>& in,
                         const std::string& what);
  // With tensor parallelism: replaces every sharded tensor of `snapshot` (parameters and their
  // optimizer state) by the full tensor gathered from the group. Collective over the tp group.
  absl::Status GatherShards(const std::vector<bool>& mine, LayerSnapshot* snapshot) const;

  const RankStage* stage_;
  TrainingState* state_;
  const FaultInjector* faults_;
  int64_t rescued_pending_ = 0;
  ApplyUpdateFn apply_update_;
  bool rolled_rescue_ = true;
  int64_t generation_ = 0;
  Upload upload_;
};

}  // namespace varuna

#pragma once

// What this rank knows of committed steps (Note [Committed step] in varuna.cc): the step its
// generation started from, the newest step whose agreement completed here with its agreed
// vector and update (what a peer that missed it needs to roll forward, in place or from a
// rescue), and the step whose agreement this rank posted without the result (its reduced
// gradients still on its parameters). It is part of the engine's TrainingState
// (worker/engine/engine_state.h): Varuna's step and its Checkpointer update it under the
// state's lock. Nothing here grows with the model: no state is copied per step.

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace varuna {

// A stage's layers in the checkpoint's per-layer format, by layer name.
using LayerSnapshot = std::vector<std::pair<std::string, c10::Dict<std::string, at::Tensor>>>;

class StepCommit {
 public:
  // What an agreed vote decided for the update (Note [Rolled rescue] in
  // common/checkpoint/checkpoint_store.cc).
  struct Update {
    bool skipped = false;  // an overflow: the step applied no update
    double grad_norm = 0;  // the global gradient norm the update clipped by
  };

  // A generation starts from `step`, which every rank loaded or adopted (0: fresh).
  void Start(int64_t step) {
    start_ = step;
    agreed_ = 0;
    agreed_vector_.clear();
    update_ = Update();
    posted_ = 0;
  }
  // This rank posted step `step`'s agreement: its gradients are reduced and unscaled, and stay
  // on its parameters until the update (or a roll-forward) uses them.
  void Posted(int64_t step) { posted_ = step; }
  // Step `step`'s agreement completed on this rank with `vector` (the all-reduced vote), which
  // decided `update`: every rank applied step - 1.
  void Agreed(int64_t step, std::vector<double> vector, Update update) {
    agreed_ = step;
    agreed_vector_ = std::move(vector);
    update_ = update;
    posted_ = 0;
  }

  int64_t start() const { return start_; }
  // The newest step whose agreement completed here (0: none this generation) and its vector.
  int64_t agreed() const { return agreed_; }
  const std::vector<double>& agreed_vector() const { return agreed_vector_; }
  const Update& agreed_update() const { return update_; }
  // The step whose agreement this rank posted and never saw complete (0: none): with a peer's
  // agreed vector of that step it can still apply it (Varuna::RollForward).
  int64_t pending() const { return posted_; }
  // The newest step every rank has applied or can restore, for a rank at `iteration` of a
  // world of `world` ranks (alone, every step it applied).
  int64_t Committed(int64_t iteration, int world) const {
    if (world <= 1) return iteration;
    return std::max(start_, agreed_ - 1);
  }

 private:
  int64_t start_ = 0;   // the step this generation loaded (0: fresh)
  int64_t agreed_ = 0;  // the newest step whose agreement completed on this rank
  std::vector<double> agreed_vector_;
  Update update_;
  int64_t posted_ = 0;  // posted, never completed here
};

}  // namespace varuna

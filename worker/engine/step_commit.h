#pragma once

// What this rank knows of committed steps (Note [Committed step] in varuna.cc): the step its
// generation started from, the newest step whose agreement completed here and its agreed
// vector (what a peer that missed it needs to roll forward), the step whose agreement this
// rank posted without the result (its reduced gradients still on its parameters), and, on the
// relaunch path only, the state before the newest update (so a rescue can still offer the
// committed step). It is part of the engine's TrainingState (worker/engine/engine_state.h):
// Varuna's step and its Checkpointer update it under the state's lock.

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
  // This stage before the update of step `step` + 1.
  struct PreUpdate {
    int64_t step = -1;
    double loss_scale = 0;
    int64_t clean_steps = 0;
    LayerSnapshot layers;
  };

  // A generation starts from `step`, which every rank loaded or adopted (0: fresh).
  void Start(int64_t step) {
    start_ = step;
    agreed_ = 0;
    agreed_vector_.clear();
    posted_ = 0;
    pre_ = PreUpdate();
  }
  // This rank posted step `step`'s agreement: its gradients are reduced and unscaled, and stay
  // on its parameters until the update (or a roll-forward) uses them.
  void Posted(int64_t step) { posted_ = step; }
  // Step `step`'s agreement completed on this rank with `vector` (the all-reduced vote): every
  // rank applied step - 1.
  void Agreed(int64_t step, std::vector<double> vector) {
    agreed_ = step;
    agreed_vector_ = std::move(vector);
    posted_ = 0;
  }
  // Keeps `pre`, the state about to be updated, until the next update replaces it.
  void KeepPreUpdate(PreUpdate pre) { pre_ = std::move(pre); }

  int64_t start() const { return start_; }
  // The newest step whose agreement completed here (0: none this generation) and its vector.
  int64_t agreed() const { return agreed_; }
  const std::vector<double>& agreed_vector() const { return agreed_vector_; }
  // The step whose agreement this rank posted and never saw complete (0: none): with a peer's
  // agreed vector of that step it can still apply it (Varuna::RollForward).
  int64_t pending() const { return posted_; }
  // The newest step every rank has applied or can restore, for a rank at `iteration` of a
  // world of `world` ranks (alone, every step it applied).
  int64_t Committed(int64_t iteration, int world) const {
    if (world <= 1) return iteration;
    return std::max(start_, agreed_ - 1);
  }
  // The kept state before step `step` + 1's update, if that is what is kept; else null.
  const PreUpdate* PreUpdateAt(int64_t step) const {
    return step >= 0 && pre_.step == step && !pre_.layers.empty() ? &pre_ : nullptr;
  }

 private:
  int64_t start_ = 0;   // the step this generation loaded (0: fresh)
  int64_t agreed_ = 0;  // the newest step whose agreement completed on this rank
  std::vector<double> agreed_vector_;
  int64_t posted_ = 0;  // posted, never completed here
  PreUpdate pre_;
};

}  // namespace varuna

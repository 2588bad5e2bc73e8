#pragma once

// What this rank knows of committed steps (Note [Committed step] in varuna.cc): the step its
// generation started from, the newest step whose agreement completed here, and, while the
// newest applied step is not known to be committed, the state before its update (so a rescue
// or a hand-over can still offer the committed step). It is part of the engine's TrainingState
// (worker/engine/engine_state.h): Varuna's step and its Checkpointer update it under the
// state's lock.

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace varuna {

// A stage's layers in the checkpoint's per-layer format, by checkpoint file name.
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
    pre_ = PreUpdate();
  }
  // Step `step`'s agreement completed on this rank: every rank applied step - 1.
  void Agreed(int64_t step) { agreed_ = step; }
  // Keeps `pre`, the state about to be updated, until the next update replaces it.
  void KeepPreUpdate(PreUpdate pre) { pre_ = std::move(pre); }

  int64_t start() const { return start_; }
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
  PreUpdate pre_;
};

}  // namespace varuna

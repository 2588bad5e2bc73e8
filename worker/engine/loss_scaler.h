#pragma once

// Dynamic loss scaling for fp16 (pure; no LibTorch): the last stage multiplies its loss by
// scale(); after the gradient reduction every rank calls Update() with the same global
// overflow flag. On overflow the step is skipped and the scale halves (not below min_scale);
// after `window` consecutive clean steps it doubles.

#include <cstdint>

namespace varuna {

class DynamicLossScaler {
 public:
  DynamicLossScaler(double init_scale, int64_t window, double min_scale = 1.0)
      : scale_(init_scale), window_(window), min_scale_(min_scale) {}

  double scale() const { return scale_; }
  int64_t clean_steps() const { return clean_steps_; }

  // Records the outcome of one step. Returns true if the optimizer step must be skipped.
  bool Update(bool overflow);

  // For checkpoint restore.
  void Restore(double scale, int64_t clean_steps) {
    scale_ = scale;
    clean_steps_ = clean_steps;
  }

 private:
  double scale_;
  int64_t window_;
  double min_scale_;
  int64_t clean_steps_ = 0;
};

}  // namespace varuna

#include "worker/engine/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace varuna {

double LearningRate(const std::string& kind, double lr, double min_lr, int64_t warmup,
                    int64_t total_steps, int64_t step) {
  if (warmup > 0 && step <= warmup) return lr * static_cast<double>(step) / warmup;
  if (kind == "constant" || total_steps <= warmup) return lr;
  const double progress = std::clamp(
      static_cast<double>(step - warmup) / static_cast<double>(total_steps - warmup), 0.0, 1.0);
  if (kind == "linear") return lr + (min_lr - lr) * progress;
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace varuna

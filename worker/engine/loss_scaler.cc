#include "worker/engine/loss_scaler.h"

#include <algorithm>

namespace varuna {

bool DynamicLossScaler::Update(bool overflow) {
  if (overflow) {
    scale_ = std::max(min_scale_, scale_ / 2);
    clean_steps_ = 0;
    return true;
  }
  if (++clean_steps_ >= window_) {
    scale_ *= 2;
    clean_steps_ = 0;
  }
  return false;
}

}  // namespace varuna

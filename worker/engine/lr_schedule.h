#pragma once

#include <cstdint>
#include <string>

namespace varuna {

// Learning rate for optimizer step `step` (1-based: the first step is 1): linear warm-up from
// lr/warmup to lr over `warmup` steps, then `kind` ("cosine" | "linear" | "constant") decay
// from lr to min_lr at `total_steps`. Pure and stateless, so a resumed run needs only the step.
double LearningRate(const std::string& kind, double lr, double min_lr, int64_t warmup,
                    int64_t total_steps, int64_t step);

}  // namespace varuna

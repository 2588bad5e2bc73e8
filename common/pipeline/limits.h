#pragma once

// Bounds on a training shape, checked wherever one is read (a job spec, a stage map, a
// topology): ranks in the world and samples in a step. The job spec's own limits are in
// common/spec/job_spec.h.

#include <cstdint>

namespace varuna {

inline constexpr int kMaxSlots = 1 << 20;
inline constexpr int64_t kMaxGlobalBatch = 1 << 24;

}  // namespace varuna

#pragma once

// Splits an ordered list of segments (the layers between cut points) into P contiguous stages
// balancing cost. Pure; no LibTorch.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace varuna {

// Returns P+1 boundaries b (b[0] = 0, b[P] = costs.size(), strictly increasing): stage s owns
// segments [b[s], b[s+1]). Minimizes the maximum stage cost (ties broken toward the earliest
// boundaries so the result is deterministic). InvalidArgument if stages < 1, stages >
// costs.size() (message names both numbers), or any cost is negative.
absl::StatusOr<std::vector<int>> PartitionByCost(const std::vector<double>& costs, int stages);

}  // namespace varuna

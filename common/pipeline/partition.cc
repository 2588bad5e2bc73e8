#include "common/pipeline/partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace varuna {

absl::StatusOr<std::vector<int>> PartitionByCost(const std::vector<double>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  if (stages < 1) {
    return absl::InvalidArgumentError(absl::StrCat("stages must be >= 1, got ", stages));
  }
  if (stages > n) {
    return absl::InvalidArgumentError(absl::StrCat("cannot split ", n, " segments into ", stages,
                                                   " stages: every stage needs a segment"));
  }
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(costs[i]) || costs[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cost[", i, "] = ", costs[i], " must be finite and non-negative"));
    }
    prefix[i + 1] = prefix[i] + costs[i];
  }
  auto cost = [&](int begin, int end) { return prefix[end] - prefix[begin]; };

  // best[k][j]: the minimal max stage cost of splitting segments [j, n) into k non-empty stages
  // (infinity where impossible).
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, kInf));
  for (int j = 0; j < n; ++j) best[1][j] = cost(j, n);
  for (int k = 2; k <= stages; ++k) {
    for (int j = 0; j + k <= n; ++j) {
      for (int e = j + 1; e + k - 1 <= n; ++e) {
        best[k][j] = std::min(best[k][j], std::max(cost(j, e), best[k - 1][e]));
      }
    }
  }
  const double target = best[stages][0];

  // Among the optimal partitions pick the lexicographically smallest boundaries: each stage ends
  // at the first segment that keeps the rest splittable within `target`.
  std::vector<int> bounds = {0};
  for (int s = 0; s + 1 < stages; ++s) {
    const int begin = bounds.back();
    const int rest = stages - s - 1;
    int end = begin + 1;
    while (end < n - rest && (cost(begin, end) > target || best[rest][end] > target)) ++end;
    bounds.push_back(end);
  }
  bounds.push_back(n);
  return bounds;
}

}  // namespace varuna

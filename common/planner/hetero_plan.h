#pragma once

// The pure parts of heterogeneous planning (docs/autoconfig.md "Heterogeneous plans", after
// Oobleck): pipeline templates (the best cut of the segments for every depth), mixes of
// template depths that use exactly the slots, and the split of a step's micro-batches between
// the pipelines of a mix. The planner (common/planner/autoconfig.cc) simulates what these propose.
// No LibTorch, no protobuf.

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"

namespace varuna {

// Note [Template DP]: a pipeline template for n stages is the cut of the segments into n
// contiguous non-empty stages that minimises the bottleneck (the busiest stage's work per
// micro-batch), ties broken by the lower total work. A stage's work is the sum of its segments'
// `work`, except that the pipeline's last stage sums `last_work` instead (under the Varuna
// schedule the last stage does not recompute). best[k][j], the best cut of segments [0, j)
// into k non-last stages, extends best[k-1][i] by the stage [i, j); template n closes
// best[n-1][i] with the last stage [i, S). O(max_stages x S^2) time, O(max_stages x S) memory.
//
// Returns element n-1 = the n+1 boundaries of the n-stage template, for n = 1 ..
// min(max_stages, S). Preconditions: work and last_work have the same size S >= 1, values
// finite and >= 0.
std::vector<std::vector<int>> PipelineTemplates(const std::vector<double>& work,
                                                const std::vector<double>& last_work,
                                                int max_stages);

// The same bottleneck objective by bisection on the bottleneck (a greedy pass checks one),
// O(S log) per depth instead of the dynamic program's O(S^2): for models too large for
// PipelineTemplates (its last stage costs `costs` like the others). InvalidArgument unless
// 1 <= stages <= costs.size(). The result has exactly stages + 1 increasing boundaries.
absl::StatusOr<std::vector<int>> SplitByBisection(const std::vector<double>& costs, int stages);

// `count` pipelines of `stages` stages.
struct MixPart {
  int stages = 0;
  int count = 0;
  bool operator==(const MixPart& o) const { return stages == o.stages && count == o.count; }
};
// Parts by decreasing depth, each depth once.
using Mix = std::vector<MixPart>;

struct MixLimits {
  // At most this many distinct depths in one mix (Note [Mix caps]).
  int max_distinct = 3;
  // At most this many pipelines (each needs a micro-batch of its own).
  int64_t max_pipelines = 1 << 30;
  // At most this many partial mixes are visited; the enumeration stops there.
  int64_t max_visits = 2'000'000;
};

// Note [Mix caps]: every multiset of `depths` (the template depths allowed, any order) whose
// sizes sum to exactly `slots`, with at least two distinct depths (one depth is the
// homogeneous P x D shape, planned on its own), at most limits.max_distinct distinct depths
// and at most limits.max_pipelines pipelines. There are 13,317 such mixes of 1..64 for 64
// slots with 3 distinct depths (121,079 with 4; 9.9 million with 3 for 1,024 slots), hence the
// caps; `prune`, when set, is asked about every partial mix with the slots still free and
// returns true to skip everything that extends it (the planner prunes by a bound). Depths are
// tried deepest first. `visit` sees each complete mix once; it returns false to stop.
// Returns the number of partial mixes visited.
int64_t EnumerateMixes(const std::vector<int>& depths, int slots, const MixLimits& limits,
                       const std::function<bool(const Mix& partial, int free_slots)>& prune,
                       const std::function<bool(const Mix& mix)>& visit);

// T(b) = fill_s + per_mb_s x b: a pipeline's time for b micro-batches.
struct LinearTime {
  double fill_s = 0;
  double per_mb_s = 0;
  double At(double b) const { return fill_s + per_mb_s * b; }
};

// The real-valued split (b_t may be fractional, >= 1) minimising max_t times[t].At(b_t)
// subject to sum_t mix[t].count x b_t = total: the water level Z at which every pipeline
// finishes together, pipelines that would get less than one micro-batch held at one. Returns Z.
double WaterLevel(const Mix& mix, const std::vector<LinearTime>& times, double total);

// Note [Batch split]: integer micro-batch counts b_t >= 1 per part (identical pipelines get the
// same count) with sum_t mix[t].count x b_t = total, minimising the slowest pipeline
// max_t times[t].At(b_t). Searches the integers around the water level (each part but the last
// within +-(max count + 2), the last taking the remainder); empty if none there adds up.
std::vector<int64_t> SplitBatch(const Mix& mix, const std::vector<LinearTime>& times,
                                int64_t total);

}  // namespace varuna

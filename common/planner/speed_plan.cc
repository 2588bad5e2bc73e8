// Speed-aware plans: the planner's view of nodes that are slower (or faster) than their peers.

#include <algorithm>
#include <cmath>
#include <queue>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/planner/hetero_plan.h"
#include "common/planner/search.h"

namespace varuna {
namespace search {

// Note [Speed-aware plans]: the straggler ladder (manager/stragglers/straggler_controller.cc) tells
// the planner how fast each node is, relative to a normal one. Compute on a node of speed s takes
// 1/s as long; links and all-reduces are not scaled (a slow link is reported, not planned
// around). With speeds a P x D shape is no longer P x D identical pipelines: each replica is
// simulated as its own pipeline (SimulateMix), and the step waits for the slowest. Two ways
// to do better without leaving a node out, both expressible as a heterogeneous topology that
// the engine runs exactly (every step's loss unchanged):
//  - fewer layers on a slow rank: each pipeline's boundaries minimise its bottleneck, the
//    busiest stage's work divided by its node's speed (a bisection on the bottleneck with a
//    greedy fill, as SplitByBisection, each stage's capacity scaled by its speed);
//  - a smaller batch share for a slow pipeline: the step's micro-batches go to the pipelines
//    one at a time, each to the one that would finish it soonest (each pipeline's time is
//    linear in its micro-batches: fill + per micro-batch, from its stages' scaled work).
// Leaving the node out (eviction) is the ladder's third rung: it plans without the node.

double NodeSpeed(const PlanRequest& req, int node) {
  if (node < 0 || node >= static_cast<int>(req.node_speed.size())) return 1;
  const double s = req.node_speed[node];
  return std::isfinite(s) && s > 0 ? s : 1;
}

bool HasSpeeds(const PlanRequest& req) {
  for (size_t n = 0; n < req.node_speed.size(); ++n) {
    if (NodeSpeed(req, static_cast<int>(n)) != 1) return true;
  }
  return false;
}

absl::StatusOr<v1::Plan> SimulateWithSpeeds(const JobSpec& spec, const v1::Profile& profile,
                                            SegmentCache& cache, const std::vector<int>& bounds,
                                            int P, int D, int mb, SchedulePolicy policy,
                                            const PlanRequest& req) {
  const int64_t per_replica = spec.train.global_batch / D;
  MixContext ctx{spec, profile, cache, req, mb, policy};
  ctx.data_parallel = D > 1;
  ASSIGN_OR_RETURN(v1::Plan plan, SimulateMix(ctx, {{bounds, D, (per_replica + mb - 1) / mb}}));
  plan.set_heterogeneous(false);
  plan.clear_topology();
  plan.clear_pipelines();
  plan.clear_boundaries();
  for (int b : bounds) plan.add_boundaries(b);
  plan.set_stages(P);
  plan.set_replicas(D);
  return plan;
}

namespace {

// The cut of segments with per-segment `work` (the last stage's: `last`) into stages with
// relative capacities `speed` that minimises max_i work_i / speed_i. Every stage gets at least
// one segment. Precondition: 1 <= speed.size() <= work.size().
std::vector<int> CutForSpeeds(const std::vector<double>& work, const std::vector<double>& last,
                              const std::vector<double>& speed) {
  const int S = static_cast<int>(work.size());
  const int P = static_cast<int>(speed.size());
  // The greedy fill for bottleneck T: stage i takes segments while its scaled work stays
  // within T and enough segments remain for the stages after it.
  auto fill = [&](double T, std::vector<int>* bounds) {
    bounds->assign(1, 0);
    int g = 0;
    for (int i = 0; i < P; ++i) {
      const bool is_last = i == P - 1;
      double w = 0;
      const int limit = is_last ? S : S - (P - 1 - i);
      const int start = g;
      while (g < limit) {
        const double add = (is_last ? last[g] : work[g]) / speed[i];
        if (g > start && w + add > T) break;
        w += add;
        ++g;
      }
      if (w > T) return false;
      bounds->push_back(g);
    }
    return g == S;
  };
  double hi = 0;
  for (int g = 0; g < S; ++g) hi += std::max(work[g], last[g]);
  double lo = 0;
  hi = hi / *std::min_element(speed.begin(), speed.end()) + 1e-12;
  std::vector<int> best, trial;
  if (!fill(hi, &best)) {  // cannot happen with T = everything on the slowest; be safe
    best.clear();
    for (int i = 0; i <= P; ++i) best.push_back(i < P ? i : S);
    return best;
  }
  for (int it = 0; it < 60 && hi - lo > 1e-12 * hi; ++it) {
    const double mid = (lo + hi) / 2;
    if (fill(mid, &trial)) {
      hi = mid;
      best = trial;
    } else {
      lo = mid;
    }
  }
  return best;
}

}  // namespace

absl::StatusOr<v1::Plan> BalanceForSpeeds(const JobSpec& spec, const v1::Profile& profile,
                                          SegmentCache& cache, const std::vector<int>& bounds,
                                          int P, int D, int mb, SchedulePolicy policy,
                                          const PlanRequest& req) {
  const int64_t G = spec.train.global_batch;
  if (G % mb != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("micro_batch ", mb, " does not divide global_batch ", G));
  }
  const int64_t B = G / mb;
  if (B < D) return absl::FailedPreconditionError("fewer micro-batches than pipelines");
  const std::vector<int> node_of = PackRanks(req.slots_per_node, P * D);
  if (static_cast<int>(node_of.size()) < P * D) {
    return absl::ResourceExhaustedError(absl::StrCat(P * D, " slots needed"));
  }
  const std::vector<SegmentTimes>& t = cache.At(mb);
  const int S = static_cast<int>(t.size());
  const bool recompute = policy == SchedulePolicy::kVaruna;
  std::vector<double> work(S), last(S);
  for (int g = 0; g < S; ++g) {
    last[g] = t[g].forward_s + t[g].backward_s;
    work[g] = recompute ? t[g].forward_nograd_s + t[g].recompute_s + t[g].backward_s : last[g];
  }
  std::vector<std::vector<int>> cuts(D);
  std::vector<LinearTime> lines(D);
  for (int d = 0; d < D; ++d) {
    std::vector<double> speed(P);
    bool slowed = false;
    for (int s = 0; s < P; ++s) {
      speed[s] = NodeSpeed(req, node_of[d * P + s]);
      slowed |= speed[s] != 1;
    }
    cuts[d] = slowed && P > 1 ? CutForSpeeds(work, last, speed) : bounds;
    double sum = 0, busiest = 0;
    for (int s = 0; s < P; ++s) {
      double w = 0;
      for (int g = cuts[d][s]; g < cuts[d][s + 1]; ++g) w += s == P - 1 ? last[g] : work[g];
      w /= speed[s];
      sum += w;
      busiest = std::max(busiest, w);
    }
    lines[d] = {sum - busiest, std::max(busiest, 1e-12)};
  }
  // Each pipeline at least one micro-batch; then each next one to whoever ends it soonest.
  std::vector<int64_t> b(D, 1);
  using Item = std::pair<double, int>;  // (time with one more, pipeline)
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> next;
  for (int d = 0; d < D; ++d) next.push({lines[d].At(2), d});
  for (int64_t left = B - D; left > 0; --left) {
    const int d = next.top().second;
    next.pop();
    ++b[d];
    next.push({lines[d].At(static_cast<double>(b[d] + 1)), d});
  }
  std::vector<PipelineGroup> groups;
  for (int d = 0; d < D; ++d) groups.push_back({cuts[d], 1, b[d]});
  MixContext ctx{spec, profile, cache, req, mb, policy};
  ctx.data_parallel = D > 1;
  ASSIGN_OR_RETURN(v1::Plan plan, SimulateMix(ctx, groups));
  plan.set_stages(P);
  plan.set_replicas(D);
  return plan;
}

}  // namespace search

absl::StatusOr<v1::Plan> SimulateTopology(const JobSpec& spec, const v1::Profile& profile,
                                          const Topology& topo, int micro_batch,
                                          SchedulePolicy policy, const std::vector<int>& node_of,
                                          const PlanRequest& request) {
  RETURN_IF_ERROR(CheckProfileFor(profile, spec));
  if (micro_batch < 1) return absl::InvalidArgumentError("micro_batch must be >= 1");
  if (static_cast<int>(node_of.size()) != topo.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("node_of has ", node_of.size(), " ranks, the topology ", topo.world_size()));
  }
  for (int n : node_of) {
    if (n < 0 || n >= static_cast<int>(request.slots_per_node.size())) {
      return absl::InvalidArgumentError(absl::StrCat("node index ", n, " out of range"));
    }
  }
  for (const PipelineLayout& p : topo.pipelines()) {
    if (p.boundaries.empty() || p.boundaries.back() != profile.segments_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the topology's boundaries do not cover the profile's ",
                       profile.segments_size(), " segments"));
    }
  }
  search::SegmentCache cache(profile);
  std::vector<search::PipelineGroup> groups;
  for (const PipelineLayout& p : topo.pipelines()) {
    const int64_t M = std::max<int64_t>(1, (p.samples + micro_batch - 1) / micro_batch);
    if (M > search::kMaxSimulatedMicroBatches) {
      return absl::InvalidArgumentError(absl::StrCat(M, " micro-batches: over the ",
                                                     search::kMaxSimulatedMicroBatches,
                                                     " the planner simulates"));
    }
    groups.push_back({p.boundaries, 1, M});
  }
  search::MixContext ctx{spec, profile, cache, request, micro_batch, policy};
  ctx.data_parallel = topo.num_pipelines() > 1;
  ctx.placed = &node_of;
  return search::SimulateMix(ctx, groups);
}

}  // namespace varuna

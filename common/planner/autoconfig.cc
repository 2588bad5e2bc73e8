#include "common/planner/autoconfig.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <queue>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/pipeline/partition.h"
#include "common/pipeline/pipeline_template.h"
#include "common/pipeline/topology.h"
#include "common/planner/hetero_plan.h"
#include "common/planner/profile.h"
#include "common/planner/simulator.h"
#include "common/spec/job_topology.h"

namespace varuna {
namespace {

std::string GiB(double bytes) { return absl::StrFormat("%.2f GiB", bytes / (1 << 30)); }

// Node index of each rank: ranks fill the fullest nodes first (manager/placement.cc).
std::vector<int> PlaceRanks(const std::vector<int>& slots_per_node, int world) {
  std::vector<int> order(slots_per_node.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return slots_per_node[a] > slots_per_node[b]; });
  std::vector<int> node_of;
  for (int n : order) {
    for (int k = 0; k < slots_per_node[n] && static_cast<int>(node_of.size()) < world; ++k) {
      node_of.push_back(n);
    }
  }
  return node_of;
}

double OptimizerStates(const std::string& optimizer) { return optimizer == "sgd" ? 1 : 2; }

// Segment costs at each micro-batch size, interpolated once.
class SegmentCache {
 public:
  explicit SegmentCache(const v1::Profile& profile) : profile_(profile) {}
  const std::vector<SegmentTimes>& At(int mb) {
    auto it = cache_.find(mb);
    if (it != cache_.end()) return it->second;
    std::vector<SegmentTimes>& v = cache_[mb];
    for (const auto& seg : profile_.segments()) v.push_back(CostAt(seg, mb));
    return v;
  }

 private:
  const v1::Profile& profile_;
  std::map<int, std::vector<SegmentTimes>> cache_;
};

// The costs of the stages cut by `bounds` (P+1) at one micro-batch size: compute, optimizer
// and memory; no links, no all-reduce. `data_parallel`: a gradient bucket is resident.
// *param_bytes gets each stage's parameter bytes.
std::vector<SimStage> StageCosts(const JobSpec& spec, const v1::Profile& profile,
                                 const std::vector<SegmentTimes>& seg_times,
                                 const std::vector<int>& bounds, bool data_parallel,
                                 std::vector<double>* param_bytes) {
  const int P = static_cast<int>(bounds.size()) - 1;
  std::vector<SimStage> stages(P);
  param_bytes->assign(P, 0);
  for (int s = 0; s < P; ++s) {
    SimStage& c = stages[s];
    double transient = 0;
    for (int g = bounds[s]; g < bounds[s + 1]; ++g) {
      const auto& seg = profile.segments(g);
      const SegmentTimes& t = seg_times[g];
      c.forward_s += t.forward_s;
      c.forward_nograd_s += t.forward_nograd_s;
      c.recompute_s += t.recompute_s;
      c.backward_s += t.backward_s;
      c.graph_bytes += t.graph_bytes;
      transient = std::max(transient, t.peak_bytes - t.graph_bytes);
      (*param_bytes)[s] += seg.param_bytes();
      c.optimizer_s += seg.optimizer_s();
    }
    c.transient_bytes = std::max(0.0, transient);
    c.static_bytes =
        (*param_bytes)[s] * (2 + OptimizerStates(spec.train.optimizer) + (data_parallel ? 1 : 0));
    if (s > 0) {
      c.stash_bytes = seg_times[bounds[s] - 1].activation_bytes;
    }
  }
  return stages;
}

absl::StatusOr<v1::Plan> Simulate(const JobSpec& spec, const v1::Profile& profile,
                                  SegmentCache& cache, const std::vector<int>& bounds, int P, int D,
                                  int mb, SchedulePolicy policy, const PlanRequest& req) {
  const std::vector<SegmentTimes>& seg_times = cache.At(mb);
  const std::vector<int> node_of = PlaceRanks(req.slots_per_node, P * D);
  if (static_cast<int>(node_of.size()) < P * D) {
    return absl::ResourceExhaustedError(
        absl::StrCat(P, "x", D, " needs ", P * D, " slots, ", node_of.size(), " given"));
  }
  const CommModel comm(profile);
  std::vector<double> param_bytes;
  std::vector<SimStage> stages = StageCosts(spec, profile, seg_times, bounds, D > 1, &param_bytes);
  const int64_t per_replica = spec.train.global_batch / D;
  const int M = static_cast<int>((per_replica + mb - 1) / mb);  // the last may be smaller
  for (int s = 0; s < P; ++s) {
    SimStage& c = stages[s];
    // The data-parallel group of stage s spans hosts if its replicas do.
    bool dp_cross = false;
    for (int d = 1; d < D; ++d) dp_cross |= node_of[s + d * P] != node_of[s];
    c.allreduce_s = comm.AllReduce(param_bytes[s] + 16, D, dp_cross);
  }
  // Replicas differ only in which links cross hosts; simulate each distinct pattern.
  std::set<std::vector<bool>> patterns;
  for (int d = 0; d < D; ++d) {
    std::vector<bool> cross(P, false);
    for (int s = 0; s + 1 < P; ++s) cross[s] = node_of[d * P + s] != node_of[d * P + s + 1];
    cross[P - 1] = node_of[d * P] != node_of[d * P + P - 1];  // the tied pair
    patterns.insert(cross);
  }
  // Note [Contention]: compute slows down when other slots of the same host compute at the
  // same time (profile.compute_slowdown, measured with slots_per_host busy). A first pass
  // without it gives each stage's utilization; each stage is then slowed in proportion to
  // the busy time of the other ranks on its host (replica 0's placement), and simulated again.
  const double slowdown = profile.compute_slowdown() > 1 ? profile.compute_slowdown() : 1.0;
  const int measured_slots = std::max(2, profile.slots_per_host());
  std::vector<std::vector<int>> host_peers(P);  // other stages on the same host as stage s
  if (slowdown > 1) {
    for (int s = 0; s < P; ++s) {
      for (int d = 0; d < D; ++d) {
        for (int t = 0; t < P; ++t) {
          if ((d != 0 || t != s) && node_of[d * P + t] == node_of[s]) host_peers[s].push_back(t);
        }
      }
    }
  }
  SimResult worst;
  bool first = true;
  const std::vector<std::vector<Task>> schedules = MakeSchedules(policy, P, M);
  auto scaled = [&](const SimResult& pass1) {
    std::vector<SimStage> out = stages;
    for (int s = 0; s < P; ++s) {
      double others = 0;
      for (int t : host_peers[s]) {
        others += pass1.pipeline_s > 0 ? std::min(1.0, pass1.busy_s[t] / pass1.pipeline_s) : 0;
      }
      const double f = 1 + (slowdown - 1) * std::min(1.0, others / (measured_slots - 1));
      for (double* x : {&out[s].forward_s, &out[s].forward_nograd_s, &out[s].recompute_s,
                        &out[s].backward_s, &out[s].optimizer_s}) {
        *x *= f;
      }
    }
    return out;
  };
  for (const auto& cross : patterns) {
    SimInput in;
    in.schedules = &schedules;
    in.policy = policy;
    in.micro_batches = M;
    in.stages = stages;
    bool any_cross = false;
    for (int s = 0; s + 1 < P; ++s) {
      const double bytes = seg_times[bounds[s + 1] - 1].activation_bytes;
      in.stages[s].send_act_s = comm.P2P(bytes, cross[s]);
      in.stages[s + 1].send_grad_s = comm.P2P(bytes, cross[s]);
      any_cross |= cross[s];
    }
    if (P > 1 && profile.tied_bytes() > 0) {
      in.tied_allreduce_s = comm.AllReduce(profile.tied_bytes(), 2, cross[P - 1]);
    }
    in.sync_s = comm.AllReduce(32, P, any_cross);
    in.step_overhead_s = profile.step_overhead_s();
    SimResult r = SimulateStep(in);
    if (slowdown > 1) {
      const std::vector<SimStage> base = in.stages;
      in.stages = scaled(r);
      for (int s = 0; s < P; ++s) {  // keep the links of this pattern
        in.stages[s].send_act_s = base[s].send_act_s;
        in.stages[s].send_grad_s = base[s].send_grad_s;
      }
      r = SimulateStep(in);
    }
    if (first || r.step_s > worst.step_s) worst = std::move(r);
    first = false;
  }
  v1::Plan plan;
  plan.set_stages(P);
  plan.set_replicas(D);
  plan.set_micro_batch(mb);
  plan.set_schedule(SchedulePolicyName(policy));
  for (int b : bounds) plan.add_boundaries(b);
  plan.set_step_s(worst.step_s);
  plan.set_samples_per_s(worst.step_s > 0 ? spec.train.global_batch / worst.step_s : 0);
  plan.set_bubble(worst.bubble);
  for (double b : worst.peak_bytes) plan.add_peak_bytes(b);
  for (double b : worst.busy_s) plan.add_busy_s(b);
  plan.set_slots(P * D);
  if (req.memory_per_slot > 0) {
    for (int s = 0; s < P; ++s) {
      if (worst.peak_bytes[s] > req.memory_per_slot) {
        plan.set_rejected(absl::StrCat("memory: stage ", s, " needs ", GiB(worst.peak_bytes[s]),
                                       ", a slot has ", GiB(req.memory_per_slot)));
        break;
      }
    }
  }
  return plan;
}

v1::Plan Rejected(int P, int D, int mb, const std::string& schedule, const std::string& why) {
  v1::Plan p;
  p.set_stages(P);
  p.set_replicas(D);
  p.set_micro_batch(mb);
  p.set_schedule(schedule);
  p.set_slots(P * D);
  p.set_rejected(why);
  return p;
}

std::vector<int> Divisors(int64_t n) {  // n <= kMaxGlobalBatch
  std::vector<int> out;
  std::vector<int> high;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    out.push_back(static_cast<int>(d));
    if (d * d != n) high.push_back(static_cast<int>(n / d));
  }
  out.insert(out.end(), high.rbegin(), high.rend());
  return out;
}

constexpr double kPruneFactor = 1.5;
// Larger steps are rejected rather than simulated (memory and time grow with P x M).
constexpr int64_t kMaxSimulatedMicroBatches = 8192;
// Tasks simulated per plan, about 1-2 s here: past it, the remaining shapes (the least
// promising: candidates go in order of their bound) are listed with their bound only.
constexpr int64_t kSimulationBudgetTasks = 20'000'000;

struct Candidate {
  int P, D, mb;
  SchedulePolicy policy;
  std::shared_ptr<const std::vector<int>> bounds;
  double bound;
};

// A lower bound on the step (the busiest stage's compute, plus the per-step overhead), and
// the memory check that needs no simulation: every stage holds at least one graph during a
// backward (GPipe and 1F1B: as many as their schedules keep). Sets *why when the shape
// cannot fit.
double LowerBound(const JobSpec& spec, const v1::Profile& profile, SegmentCache& cache,
                  const Candidate& c, const PlanRequest& req, std::string* why) {
  const std::vector<SegmentTimes>& t = cache.At(c.mb);
  const double M = static_cast<double>((spec.train.global_batch / c.D + c.mb - 1) / c.mb);
  const bool recompute = c.policy == SchedulePolicy::kVaruna;
  double busiest = 0;
  for (int s = 0; s < c.P; ++s) {
    const bool last = s == c.P - 1;
    double work = 0, params = 0, graph = 0, transient = 0;
    for (int g = (*c.bounds)[s]; g < (*c.bounds)[s + 1]; ++g) {
      work += (recompute && !last ? t[g].forward_nograd_s + t[g].recompute_s : t[g].forward_s) +
              t[g].backward_s;
      params += profile.segments(g).param_bytes();
      graph += t[g].graph_bytes;
      transient = std::max(transient, t[g].peak_bytes - t[g].graph_bytes);
    }
    busiest = std::max(busiest, M * work);
    // Graphs alive at a stage's peak: GPipe holds all M, 1F1B its warm-up depth (P - s), the
    // Varuna schedule at least one.
    const double live = c.policy == SchedulePolicy::kGPipe  ? M
                        : c.policy == SchedulePolicy::k1F1B ? std::min<double>(c.P - s, M)
                                                            : 1.0;
    const double floor_bytes =
        params * (2 + OptimizerStates(spec.train.optimizer) + (c.D > 1 ? 1 : 0)) + live * graph +
        std::max(0.0, transient);
    if (req.memory_per_slot > 0 && floor_bytes > req.memory_per_slot && why->empty()) {
      *why = absl::StrCat("memory: stage ", s, " needs at least ", GiB(floor_bytes),
                          ", a slot has ", GiB(req.memory_per_slot));
    }
  }
  return busiest + profile.step_overhead_s();
}

// ---- Heterogeneous plans (docs/autoconfig.md "Heterogeneous plans") ----

// Note [Mix caps] (common/planner/hetero_plan.h): at most kMaxMixDepths distinct depths per mix, at
// most kMaxMixVisits partial mixes per plan, and only the kMaxMixCandidates best mixes by
// estimate are simulated.
constexpr int kMaxMixDepths = 3;
constexpr int64_t kMaxMixVisits = 2'000'000;
constexpr int kMaxMixCandidates = 16;
// Templates come from the exact dynamic program while depths x segments^2 / 2 stays under
// this; past it from bisection, for at most kMaxBisectedDepth depths.
constexpr double kMaxTemplateDpOps = 3e7;
constexpr int kMaxBisectedDepth = 128;

// `count` identical pipelines cut by `bounds`, each running `microbatches` micro-batches.
struct PipelineGroup {
  std::vector<int> bounds;
  int count = 1;
  int64_t microbatches = 1;
  int stages() const { return static_cast<int>(bounds.size()) - 1; }
};

// What the pipelines of one heterogeneous plan share: micro-batch size, schedule, the task
// lists by (stages, micro-batches), and the simulated task count (for the budget).
struct MixContext {
  MixContext(const JobSpec& spec, const v1::Profile& profile, SegmentCache& cache,
             const PlanRequest& req, int mb, SchedulePolicy policy)
      : spec(spec), profile(profile), cache(cache), req(req), mb(mb), policy(policy) {}
  const JobSpec& spec;
  const v1::Profile& profile;
  SegmentCache& cache;
  const PlanRequest& req;
  const int mb;
  const SchedulePolicy policy;
  bool data_parallel = true;  // more than one pipeline: a gradient bucket is resident
  int64_t tasks = 0;
  std::map<std::pair<int, int64_t>, std::vector<std::vector<Task>>> schedules;
};

double EndOf(const SimResult& r) {
  double end = 0;
  for (double e : r.end_s) end = std::max(end, e);
  return end;
}

// One pipeline alone: its schedule, links and tied all-reduce, no data-parallel all-reduce,
// no optimizer. `nodes`: the node of each of its ranks; `factor`: per-stage compute slowdown
// (empty: none).
SimResult SimulatePipeline(MixContext& ctx, const std::vector<int>& bounds, int64_t M,
                           const std::vector<int>& nodes, const std::vector<double>& factor) {
  const std::vector<SegmentTimes>& seg_times = ctx.cache.At(ctx.mb);
  const int P = static_cast<int>(bounds.size()) - 1;
  const CommModel comm(ctx.profile);
  std::vector<double> params;
  SimInput in;
  in.stages = StageCosts(ctx.spec, ctx.profile, seg_times, bounds, ctx.data_parallel, &params);
  for (int s = 0; s < P; ++s) {
    SimStage& c = in.stages[s];
    c.optimizer_s = 0;
    if (!factor.empty()) {
      for (double* x : {&c.forward_s, &c.forward_nograd_s, &c.recompute_s, &c.backward_s}) {
        *x *= factor[s];
      }
    }
  }
  for (int s = 0; s + 1 < P; ++s) {
    const double bytes = seg_times[bounds[s + 1] - 1].activation_bytes;
    const bool cross = nodes[s] != nodes[s + 1];
    in.stages[s].send_act_s = comm.P2P(bytes, cross);
    in.stages[s + 1].send_grad_s = comm.P2P(bytes, cross);
  }
  if (P > 1 && ctx.profile.tied_bytes() > 0) {
    in.tied_allreduce_s = comm.AllReduce(ctx.profile.tied_bytes(), 2, nodes[0] != nodes[P - 1]);
  }
  in.policy = ctx.policy;
  in.micro_batches = static_cast<int>(M);
  auto& lists = ctx.schedules[{P, M}];
  if (lists.empty()) lists = MakeSchedules(ctx.policy, P, static_cast<int>(M));
  in.schedules = &lists;
  ctx.tasks += 3LL * P * M;
  return SimulateStep(in);
}

// Note [Heterogeneous step]: the pipelines of `groups` are laid out in order on consecutive
// ranks, placed as the manager places ranks (PlaceRanks). Each pipeline is simulated alone
// (SimulatePipeline; identical pipelines on identical links once), then again with the
// contention of Note [Contention] (each rank slowed by how busy the other ranks of its host
// are). The data-parallel all-reduce is per segment over its holders (Topology::HolderSets,
// in that order, as the engine walks them): a holder set's all-reduce starts when the last of
// its ranks is free (its pipeline ended, or its previous set's all-reduce did) and takes
// CommModel::AllReduce of the set's parameter bytes over one rank per pipeline. Then, as in
// SimulateStep: the agreement over the deepest pipeline, the slowest rank's optimizer,
// step_overhead_s. With one pipeline this is Simulate's step.
absl::StatusOr<v1::Plan> SimulateMix(MixContext& ctx, const std::vector<PipelineGroup>& groups) {
  const JobSpec& spec = ctx.spec;
  const v1::Profile& profile = ctx.profile;
  std::vector<PipelineLayout> layouts;
  std::vector<int> group_of;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int c = 0; c < groups[g].count; ++c) {
      PipelineLayout p;
      p.boundaries = groups[g].bounds;
      p.samples = groups[g].microbatches * ctx.mb;
      layouts.push_back(std::move(p));
      group_of.push_back(static_cast<int>(g));
    }
  }
  ASSIGN_OR_RETURN(Topology topo, Topology::Make(std::move(layouts)));
  const int world = topo.world_size();
  const int K = topo.num_pipelines();
  const std::vector<int> node_of = PlaceRanks(ctx.req.slots_per_node, world);
  if (static_cast<int>(node_of.size()) < world) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the pipelines need ", world, " slots, ", node_of.size(), " given"));
  }
  const CommModel comm(profile);
  // Identical pipelines on the same link pattern with the same slowdowns are simulated once.
  using Key = std::tuple<int, std::vector<int>, std::vector<double>>;
  std::map<Key, SimResult> memo;
  auto nodes_of = [&](int k) {
    const PipelineLayout& p = topo.pipeline(k);
    std::vector<int> nodes(node_of.begin() + p.first_rank,
                           node_of.begin() + p.first_rank + p.stages());
    return nodes;
  };
  auto simulate = [&](int k, const std::vector<double>& factor) -> const SimResult& {
    std::vector<int> nodes = nodes_of(k);
    std::vector<int> pattern;  // node ids relabelled in order of appearance
    std::map<int, int> label;
    for (int n : nodes) pattern.push_back(label.emplace(n, label.size()).first->second);
    Key key{group_of[k], pattern, factor};
    auto it = memo.find(key);
    if (it != memo.end()) return it->second;
    const PipelineGroup& g = groups[group_of[k]];
    return memo[key] = SimulatePipeline(ctx, g.bounds, g.microbatches, nodes, factor);
  };
  std::vector<SimResult> res(K);
  for (int k = 0; k < K; ++k) res[k] = simulate(k, {});
  // Note [Contention], per rank.
  std::vector<double> factor(world, 1.0);
  const double slowdown = profile.compute_slowdown() > 1 ? profile.compute_slowdown() : 1.0;
  if (slowdown > 1) {
    const int measured_slots = std::max(2, profile.slots_per_host());
    std::vector<double> util(world, 0);
    std::map<int, double> host_util;
    for (int k = 0; k < K; ++k) {
      const PipelineLayout& p = topo.pipeline(k);
      for (int s = 0; s < p.stages(); ++s) {
        const int r = p.first_rank + s;
        util[r] = res[k].pipeline_s > 0 ? std::min(1.0, res[k].busy_s[s] / res[k].pipeline_s) : 0;
        host_util[node_of[r]] += util[r];
      }
    }
    for (int r = 0; r < world; ++r) {
      const double others = host_util[node_of[r]] - util[r];
      factor[r] = 1 + (slowdown - 1) * std::min(1.0, others / (measured_slots - 1));
    }
    for (int k = 0; k < K; ++k) {
      const PipelineLayout& p = topo.pipeline(k);
      res[k] = simulate(k, std::vector<double>(factor.begin() + p.first_rank,
                                               factor.begin() + p.first_rank + p.stages()));
    }
  }
  // The per-segment data-parallel all-reduce, in holder-set order.
  std::vector<double> avail(world, 0), optimizer(world, 0);
  bool any_cross = false;
  int deepest = 0;
  for (int k = 0; k < K; ++k) {
    const PipelineLayout& p = topo.pipeline(k);
    deepest = std::max(deepest, p.stages());
    for (int s = 0; s < p.stages(); ++s) {
      const int r = p.first_rank + s;
      avail[r] = res[k].end_s[s];
      for (int g = p.boundaries[s]; g < p.boundaries[s + 1]; ++g) {
        optimizer[r] += profile.segments(g).optimizer_s();
      }
      optimizer[r] *= factor[r];
      if (s + 1 < p.stages()) any_cross |= node_of[r] != node_of[r + 1];
    }
  }
  std::map<std::vector<int>, double> set_bytes;
  for (int g = 0; g < profile.segments_size(); ++g) {
    set_bytes[topo.Holders(g)] += profile.segments(g).param_bytes();
  }
  for (const std::vector<int>& set : topo.HolderSets()) {
    double start = 0;
    bool cross = false;
    for (int r : set) {
      start = std::max(start, avail[r]);
      cross |= node_of[r] != node_of[set[0]];
    }
    const double end =
        start + comm.AllReduce(set_bytes[set] + 16, static_cast<int>(set.size()), cross);
    for (int r : set) avail[r] = end;
  }
  double ready = 0, opt = 0, longest = 0, busy = 0;
  for (int r = 0; r < world; ++r) {
    ready = std::max(ready, avail[r]);
    opt = std::max(opt, optimizer[r]);
  }
  const double sync = deepest > 1 ? comm.AllReduce(32, deepest, any_cross) : 0;
  const double step = ready + sync + opt + profile.step_overhead_s();

  v1::Plan plan;
  plan.set_stages(deepest);
  plan.set_replicas(K);
  plan.set_micro_batch(ctx.mb);
  plan.set_schedule(SchedulePolicyName(ctx.policy));
  plan.set_step_s(step);
  plan.set_samples_per_s(step > 0 ? spec.train.global_batch / step : 0);
  plan.set_slots(world);
  plan.set_heterogeneous(true);
  plan.set_topology(topo.ToString());
  for (int b : groups[0].bounds) plan.add_boundaries(b);
  for (double b : res[0].peak_bytes) plan.add_peak_bytes(b);
  for (double b : res[0].busy_s) plan.add_busy_s(b);
  int k = 0;
  for (const PipelineGroup& g : groups) {
    v1::PipelinePlan* pp = plan.add_pipelines();
    pp->set_stages(g.stages());
    for (int b : g.bounds) pp->add_boundaries(b);
    pp->set_microbatches(static_cast<int>(g.microbatches));
    pp->set_samples(static_cast<int>(g.microbatches * ctx.mb));
    pp->set_count(g.count);
    std::vector<double> peak(g.stages(), 0);
    double end = 0;
    for (int c = 0; c < g.count; ++c, ++k) {
      end = std::max(end, EndOf(res[k]));
      for (int s = 0; s < g.stages(); ++s) peak[s] = std::max(peak[s], res[k].peak_bytes[s]);
      longest = std::max(longest, res[k].pipeline_s);
      for (double b : res[k].busy_s) busy += b;
      if (ctx.req.memory_per_slot > 0 && plan.rejected().empty()) {
        for (int s = 0; s < g.stages(); ++s) {
          if (res[k].peak_bytes[s] > ctx.req.memory_per_slot) {
            plan.set_rejected(absl::StrCat("memory: pipeline ", k, " stage ", s, " needs ",
                                           GiB(res[k].peak_bytes[s]), ", a slot has ",
                                           GiB(ctx.req.memory_per_slot)));
            break;
          }
        }
      }
    }
    pp->set_step_s(end);
    for (double b : peak) pp->add_peak_bytes(b);
    for (double b : res[k - 1].busy_s) pp->add_busy_s(b);
  }
  plan.set_bubble(longest > 0 ? 1.0 - busy / world / longest : 0.0);
  return plan;
}

// The templates of one micro-batch size and schedule kind (recompute or not), every depth.
struct Template {
  std::vector<int> bounds;
  LinearTime line;  // analytic: per_mb = the busiest stage, fill = the other stages
  double max_params = 0, max_optimizer = 0;
  bool fits = true;  // the memory floor (one live graph) fits a slot
};
using TemplateSet = std::vector<Template>;  // element n-1: n stages

TemplateSet MakeTemplates(const JobSpec& spec, const v1::Profile& profile, SegmentCache& cache,
                          int mb, bool recompute, int max_depth, const PlanRequest& req) {
  const std::vector<SegmentTimes>& t = cache.At(mb);
  const int S = static_cast<int>(t.size());
  std::vector<double> work(S), last(S);
  for (int g = 0; g < S; ++g) {
    last[g] = t[g].forward_s + t[g].backward_s;
    work[g] = recompute ? t[g].forward_nograd_s + t[g].recompute_s + t[g].backward_s : last[g];
  }
  std::vector<std::vector<int>> cuts;
  if (static_cast<double>(max_depth) * S * S / 2 <= kMaxTemplateDpOps) {
    cuts = PipelineTemplates(work, last, max_depth);
  } else {
    for (int n = 1; n <= std::min({max_depth, S, kMaxBisectedDepth}); ++n) {
      auto b = SplitByBisection(work, n);
      if (!b.ok()) break;
      cuts.push_back(*std::move(b));
    }
  }
  TemplateSet out;
  for (std::vector<int>& bounds : cuts) {
    Template tp;
    const int P = static_cast<int>(bounds.size()) - 1;
    double sum = 0, busiest = 0;
    for (int s = 0; s < P; ++s) {
      double w = 0, params = 0, graph = 0, transient = 0, opt = 0;
      for (int g = bounds[s]; g < bounds[s + 1]; ++g) {
        w += s == P - 1 ? last[g] : work[g];
        params += profile.segments(g).param_bytes();
        opt += profile.segments(g).optimizer_s();
        graph += t[g].graph_bytes;
        transient = std::max(transient, t[g].peak_bytes - t[g].graph_bytes);
      }
      sum += w;
      busiest = std::max(busiest, w);
      tp.max_params = std::max(tp.max_params, params);
      tp.max_optimizer = std::max(tp.max_optimizer, opt);
      const double floor_bytes =
          params * (3 + OptimizerStates(spec.train.optimizer)) + graph + std::max(0.0, transient);
      if (req.memory_per_slot > 0 && floor_bytes > req.memory_per_slot) tp.fits = false;
    }
    tp.line = {sum - busiest, busiest};
    tp.bounds = std::move(bounds);
    out.push_back(std::move(tp));
  }
  return out;
}

struct MixCandidate {
  double estimate = 0;
  int mb = 0;
  SchedulePolicy policy = SchedulePolicy::kVaruna;
  std::shared_ptr<const TemplateSet> templates;
  Mix mix;
};

// Splits the step's micro-batches over `mix` (Note [Batch split]): first with the templates'
// analytic lines, then with lines fitted to two simulations per depth (at that split and at
// half of it, or two more), then simulates the plan.
absl::StatusOr<v1::Plan> PlanMix(MixContext& ctx, const TemplateSet& templates, const Mix& mix,
                                 int64_t B) {
  std::vector<LinearTime> lines;
  for (const MixPart& p : mix) lines.push_back(templates[p.stages - 1].line);
  std::vector<int64_t> b = SplitBatch(mix, lines, B);
  if (b.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(B, " micro-batches do not split over these pipelines"));
  }
  int world = 0;
  for (const MixPart& p : mix) world += p.stages * p.count;
  const std::vector<int> node_of = PlaceRanks(ctx.req.slots_per_node, world);
  if (static_cast<int>(node_of.size()) < world) {
    return absl::ResourceExhaustedError(absl::StrCat(world, " slots needed"));
  }
  int first = 0;
  for (size_t t = 0; t < mix.size(); ++t) {
    const std::vector<int>& bounds = templates[mix[t].stages - 1].bounds;
    const std::vector<int> nodes(node_of.begin() + first, node_of.begin() + first + mix[t].stages);
    const int64_t b1 = b[t], b2 = b1 > 2 ? b1 / 2 : b1 + 2;
    const double t1 = EndOf(SimulatePipeline(ctx, bounds, b1, nodes, {}));
    const double t2 = EndOf(SimulatePipeline(ctx, bounds, b2, nodes, {}));
    const double slope = std::max(1e-12, (t1 - t2) / static_cast<double>(b1 - b2));
    lines[t] = {std::max(0.0, t1 - slope * b1), slope};
    first += mix[t].stages * mix[t].count;
  }
  std::vector<int64_t> fitted = SplitBatch(mix, lines, B);
  if (!fitted.empty()) b = std::move(fitted);
  std::vector<PipelineGroup> groups;
  for (size_t t = 0; t < mix.size(); ++t) {
    groups.push_back({templates[mix[t].stages - 1].bounds, mix[t].count, b[t]});
  }
  return SimulateMix(ctx, groups);
}

// The model's module names (from the profile's segments) and the segment of each.
void ProfileModules(const v1::Profile& profile, std::vector<std::string>* modules,
                    std::vector<int>* segment_of) {
  for (int g = 0; g < profile.segments_size(); ++g) {
    for (absl::string_view m : absl::StrSplit(profile.segments(g).layers(), ',')) {
      modules->push_back(std::string(absl::StripAsciiWhitespace(m)));
      segment_of->push_back(g);
    }
  }
}

// "4+3*2": depths, with a count when there is more than one.
std::string MixName(const Mix& mix) {
  std::vector<std::string> parts;
  for (const MixPart& p : mix) {
    parts.push_back(p.count > 1 ? absl::StrCat(p.stages, "*", p.count) : absl::StrCat(p.stages));
  }
  return absl::StrJoin(parts, "+");
}

// spec.parallel.pipelines as given (TopologyFromSpec on the profile's modules), simulated with
// each allowed schedule. Errors: the pipelines do not fit the model or the batch.
absl::Status PlanFixedPipelines(const JobSpec& spec, const v1::Profile& profile,
                                SegmentCache& cache, const std::vector<SchedulePolicy>& policies,
                                int cap, const PlanRequest& req, v1::PlanSet* out) {
  std::vector<std::string> modules;
  std::vector<int> segment_of;
  ProfileModules(profile, &modules, &segment_of);
  ASSIGN_OR_RETURN(Topology topo, TopologyFromSpec(spec, modules, 0, segment_of));
  RETURN_IF_ERROR(topo.Validate(profile.segments_size(), spec.train.global_batch));
  const int mb = spec.parallel.micro_batch;
  std::vector<PipelineGroup> groups;
  for (const PipelineLayout& p : topo.pipelines()) {
    const int64_t M = p.samples / mb;
    if (!groups.empty() && groups.back().bounds == p.boundaries &&
        groups.back().microbatches == M) {
      ++groups.back().count;
    } else {
      groups.push_back({p.boundaries, 1, M});
    }
  }
  int deepest = 0;
  for (const PipelineGroup& g : groups) deepest = std::max(deepest, g.stages());
  const int ranks = topo.world_size();
  auto reject = [&](const std::string& schedule, const std::string& why) {
    v1::Plan p = Rejected(deepest, topo.num_pipelines(), mb, schedule, why);
    p.set_slots(ranks);
    p.set_heterogeneous(true);
    p.set_topology(topo.ToString());
    *out->add_rejected() = std::move(p);
  };
  if (ranks > cap) {
    reject(spec.parallel.schedule,
           absl::StrCat("parallel.pipelines need ", ranks, " slots, ", cap, " available"));
    return absl::OkStatus();
  }
  if (ranks < spec.resources.min_slots) {
    reject(spec.parallel.schedule,
           absl::StrCat("parallel.pipelines use ", ranks, " slots; resources.min_slots is ",
                        spec.resources.min_slots));
    return absl::OkStatus();
  }
  for (const PipelineGroup& g : groups) {
    if (g.microbatches > kMaxSimulatedMicroBatches) {
      reject(spec.parallel.schedule,
             absl::StrCat(g.microbatches, " micro-batches per step: over the ",
                          kMaxSimulatedMicroBatches, " the planner simulates"));
      return absl::OkStatus();
    }
  }
  for (SchedulePolicy policy : policies) {
    if (deepest == 1 && policies.size() > 1 && policy != policies.front()) continue;
    MixContext ctx{spec, profile, cache, req, mb, policy};
    ctx.data_parallel = topo.num_pipelines() > 1;
    ASSIGN_OR_RETURN(v1::Plan plan, SimulateMix(ctx, groups));
    *(plan.rejected().empty() ? out->add_plans() : out->add_rejected()) = std::move(plan);
  }
  return absl::OkStatus();
}

// The heterogeneous mixes on exactly `cap` slots (Note [Mix caps], Note [Batch split], Note
// [Heterogeneous step]): templates for the micro-batch sizes of the P x D shapes simulated
// within kPruneFactor of the best (every size when none was), mixes enumerated with a bound,
// the kMaxMixCandidates best by estimate simulated while the estimate is within kPruneFactor
// of the best step and the simulation budget lasts. Adds plans (and rejected ones) to *out,
// lowers *best; returns the tasks simulated.
int64_t PlanMixes(const JobSpec& spec, const v1::Profile& profile, SegmentCache& cache,
                  const std::vector<SchedulePolicy>& policies, int cap, const PlanRequest& req,
                  int64_t simulated_before, double* best, v1::PlanSet* out) {
  const int nseg = profile.segments_size();
  const int64_t G = spec.train.global_batch;
  if (cap < 3 || nseg < 2 || cap < spec.resources.min_slots) return 0;
  std::set<int> mbs;
  for (const v1::Plan& p : out->plans()) {
    if (!p.lower_bound() && p.step_s() <= kPruneFactor * *best) mbs.insert(p.micro_batch());
  }
  if (mbs.empty()) {
    if (spec.parallel.micro_batch > 0) {
      mbs.insert(spec.parallel.micro_batch);
    } else {
      for (int d : Divisors(G)) mbs.insert(d);
    }
  }
  const std::vector<int> node_of = PlaceRanks(req.slots_per_node, cap);
  bool multi_node = false;
  for (int n : node_of) multi_node |= n != node_of[0];
  const CommModel comm(profile);
  const int max_depth = std::min(nseg, cap - 1);
  auto worse = [](const MixCandidate& a, const MixCandidate& b) { return a.estimate < b.estimate; };
  std::priority_queue<MixCandidate, std::vector<MixCandidate>, decltype(worse)> top(worse);
  std::map<std::pair<int, bool>, std::shared_ptr<const TemplateSet>> sets;
  int64_t visits_left = kMaxMixVisits;
  for (int mb : mbs) {
    if (G % mb != 0) continue;
    const int64_t B = G / mb;
    if (B < 2 || B > kMaxSimulatedMicroBatches) continue;
    for (SchedulePolicy policy : policies) {
      const bool recompute = policy == SchedulePolicy::kVaruna;
      std::shared_ptr<const TemplateSet>& ts = sets[{mb, recompute}];
      if (ts == nullptr) {
        ts = std::make_shared<const TemplateSet>(
            MakeTemplates(spec, profile, cache, mb, recompute, max_depth, req));
      }
      const TemplateSet& tpl = *ts;
      std::vector<int> depths;
      // rate[r]: the most micro-batches per second per slot of a template of depth <= r.
      std::vector<double> rate(cap + 1, 0);
      for (int n = 1; n <= cap; ++n) {
        rate[n] = rate[n - 1];
        if (n > static_cast<int>(tpl.size()) || !tpl[n - 1].fits) continue;
        depths.push_back(n);
        rate[n] = std::max(rate[n], 1 / (n * std::max(tpl[n - 1].line.per_mb_s, 1e-300)));
      }
      const double floor_s = profile.step_overhead_s();
      auto prune = [&](const Mix& partial, int free) {
        if (rate[free] == 0) return true;  // nothing fits the rest
        if (static_cast<int>(top.size()) < kMaxMixCandidates) return false;
        double num = B, den = free * rate[free];
        for (const MixPart& p : partial) {
          const LinearTime& l = tpl[p.stages - 1].line;
          num += p.count * l.fill_s / std::max(l.per_mb_s, 1e-300);
          den += p.count / std::max(l.per_mb_s, 1e-300);
        }
        return num / den + floor_s >= top.top().estimate;
      };
      auto visit = [&](const Mix& mix) {
        std::vector<LinearTime> lines;
        double params = 0, opt = 0;
        int pipes = 0;
        for (const MixPart& p : mix) {
          const Template& t = tpl[p.stages - 1];
          lines.push_back(t.line);
          params = std::max(params, t.max_params);
          opt = std::max(opt, t.max_optimizer);
          pipes += p.count;
        }
        const double estimate = WaterLevel(mix, lines, static_cast<double>(B)) +
                                comm.AllReduce(params + 16, pipes, multi_node) + opt + floor_s;
        if (static_cast<int>(top.size()) < kMaxMixCandidates || estimate < top.top().estimate) {
          top.push({estimate, mb, policy, ts, mix});
          if (static_cast<int>(top.size()) > kMaxMixCandidates) top.pop();
        }
        return true;
      };
      MixLimits limits;
      limits.max_distinct = kMaxMixDepths;
      limits.max_pipelines = B;
      limits.max_visits = visits_left;
      visits_left -= EnumerateMixes(depths, cap, limits, prune, visit);
      if (visits_left <= 0) break;
    }
    if (visits_left <= 0) break;
  }
  std::vector<MixCandidate> candidates;
  for (; !top.empty(); top.pop()) candidates.push_back(top.top());
  std::reverse(candidates.begin(), candidates.end());  // best estimate first
  int64_t tasks = 0;
  for (const MixCandidate& c : candidates) {
    if (c.estimate > kPruneFactor * *best) break;
    if (simulated_before + tasks >= kSimulationBudgetTasks) break;
    MixContext ctx{spec, profile, cache, req, c.mb, c.policy};
    absl::StatusOr<v1::Plan> plan = PlanMix(ctx, *c.templates, c.mix, G / c.mb);
    tasks += ctx.tasks;
    if (!plan.ok()) {
      int deepest = 0, pipes = 0;
      for (const MixPart& p : c.mix) {
        deepest = std::max(deepest, p.stages);
        pipes += p.count;
      }
      v1::Plan r =
          Rejected(deepest, pipes, c.mb, SchedulePolicyName(c.policy),
                   absl::StrCat("pipelines ", MixName(c.mix), ": ", plan.status().message()));
      r.set_slots(cap);
      r.set_heterogeneous(true);
      *out->add_rejected() = std::move(r);
    } else if (!plan->rejected().empty()) {
      *out->add_rejected() = *std::move(plan);
    } else {
      *best = std::min(*best, plan->step_s());
      *out->add_plans() = *std::move(plan);
    }
  }
  return tasks;
}
}  // namespace

// Note [Fast partition]: the smallest bottleneck B such that the segments split into at
// most P contiguous stages of cost <= B is found by bisection (a greedy pass checks a B), then
// a greedy pass cuts exactly P non-empty stages under it. O(n log) per call, where
// PartitionByCost's exact dynamic program is O(P n^2): a 4096-layer model on hundreds of slots
// would stall the manager.
absl::StatusOr<std::vector<int>> StageBoundaries(const v1::Profile& profile, int stages) {
  // Balance forward + backward at the largest profiled micro-batch (the most accurate ratios).
  const int mb = profile.micro_batches().empty()
                     ? 1
                     : profile.micro_batches().Get(profile.micro_batches_size() - 1);
  std::vector<double> costs;
  for (const auto& seg : profile.segments()) {
    const SegmentTimes t = CostAt(seg, mb);
    costs.push_back(t.forward_s + t.backward_s);
  }
  return SplitByBisection(costs, stages);
}

absl::StatusOr<v1::Plan> SimulateShape(const JobSpec& spec, const v1::Profile& profile, int stages,
                                       int replicas, int micro_batch, SchedulePolicy policy,
                                       const PlanRequest& request) {
  RETURN_IF_ERROR(ValidateProfile(profile));
  if (stages < 1 || replicas < 1 || micro_batch < 1) {
    return absl::InvalidArgumentError("stages, replicas and micro_batch must be >= 1");
  }
  if (spec.train.global_batch % replicas != 0 ||
      spec.train.global_batch / replicas % micro_batch != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("global_batch ", spec.train.global_batch, " is not ", replicas,
                     " replicas x a whole number of micro-batches of ", micro_batch));
  }
  ASSIGN_OR_RETURN(std::vector<int> bounds, StageBoundaries(profile, stages));
  SegmentCache cache(profile);
  return Simulate(spec, profile, cache, bounds, stages, replicas, micro_batch, policy, request);
}

absl::StatusOr<v1::PlanSet> PlanShapes(const JobSpec& spec, const v1::Profile& profile,
                                       const PlanRequest& req) {
  const absl::Time t0 = absl::Now();
  RETURN_IF_ERROR(CheckProfileFor(profile, spec));
  int64_t total = 0;
  for (int n : req.slots_per_node) {
    if (n < 0) return absl::InvalidArgumentError("a node cannot have negative slots");
    total += n;
  }
  if (total == 0) return absl::ResourceExhaustedError("no free slots to plan for");
  if (total > kMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat(total, " slots; the limit is ", kMaxSlots));
  }
  const int cap = static_cast<int>(
      spec.resources.max_slots > 0 ? std::min<int64_t>(total, spec.resources.max_slots) : total);
  if (cap < spec.resources.min_slots) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "only ", cap, " slots; the job needs resources.min_slots = ", spec.resources.min_slots));
  }
  const int nseg = profile.segments_size();
  const int64_t G = spec.train.global_batch;
  // Shapes no number of slots could run are errors, not a wait.
  if (spec.parallel.stages > nseg) {
    return absl::InvalidArgumentError(absl::StrCat("parallel.stages = ", spec.parallel.stages,
                                                   " but the model has ", nseg, " segments"));
  }
  if (spec.parallel.micro_batch > G) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.micro_batch = ", spec.parallel.micro_batch,
                     " is larger than train.global_batch = ", G));
  }
  std::vector<int> Ps;  // none with parallel.pipelines: that plan only
  if (!spec.parallel.pipelines.empty()) {
  } else if (spec.parallel.stages > 0) {
    Ps.push_back(spec.parallel.stages);
  } else {
    for (int p = 1; p <= std::min(nseg, cap); ++p) Ps.push_back(p);
  }
  std::vector<SchedulePolicy> policies;
  if (spec.parallel.schedule == "auto") {
    policies = {SchedulePolicy::kVaruna, SchedulePolicy::k1F1B, SchedulePolicy::kGPipe};
  } else {
    ASSIGN_OR_RETURN(SchedulePolicy fixed, ParseSchedulePolicy(spec.parallel.schedule));
    policies = {fixed};
  }
  v1::PlanSet out;
  SegmentCache cache(profile);
  std::vector<Candidate> candidates;
  auto reject = [&](int P, int D, int mb, const std::string& sched, const std::string& why) {
    *out.add_rejected() = Rejected(P, D, mb, sched, why);
  };
  const std::string any_sched = spec.parallel.schedule;
  for (int P : Ps) {
    if (P > nseg) {
      reject(P, 0, 0, any_sched, absl::StrCat("the model has ", nseg, " segments"));
      continue;
    }
    const int dmax = cap / P;
    if (dmax < 1) {
      reject(P, 1, 0, any_sched, absl::StrCat("needs ", P, " slots, ", cap, " available"));
      continue;
    }
    // Widths that divide the global batch, widest first; the widest that does not fit the
    // batch is listed once as rejected.
    std::vector<int> Ds;
    if (spec.parallel.replicas > 0) {
      if (spec.parallel.replicas > dmax) {
        reject(P, spec.parallel.replicas, 0, any_sched,
               absl::StrCat("needs ", P * spec.parallel.replicas, " slots, ", cap, " available"));
        continue;
      }
      Ds.push_back(spec.parallel.replicas);
    } else {
      for (int d : Divisors(G)) {
        if (d <= dmax) Ds.push_back(d);
      }
      std::reverse(Ds.begin(), Ds.end());
      if (Ds.empty() || Ds.front() != dmax) {
        reject(P, dmax, 0, any_sched,
               absl::StrCat("global_batch ", G, " is not divisible by ", dmax, " replicas"));
      }
    }
    auto bounds = std::make_shared<const std::vector<int>>();
    bool took_one = false;
    for (int D : Ds) {
      if (took_one && !req.all) break;
      if (G % D != 0) {
        reject(P, D, 0, any_sched,
               absl::StrCat("global_batch ", G, " is not divisible by ", D, " replicas"));
        continue;
      }
      if (P * D < spec.resources.min_slots) {
        reject(P, D, 0, any_sched,
               absl::StrCat("uses ", P * D, " slots; resources.min_slots is ",
                            spec.resources.min_slots));
        continue;
      }
      if (bounds->empty()) {
        ASSIGN_OR_RETURN(*std::const_pointer_cast<std::vector<int>>(bounds),
                         StageBoundaries(profile, P));
      }
      const int64_t B = G / D;
      std::vector<int> mbs;
      if (spec.parallel.micro_batch > 0) {
        // As the engine does, the last micro-batch may be smaller.
        if (spec.parallel.micro_batch > B) {
          reject(P, D, spec.parallel.micro_batch, any_sched,
                 absl::StrCat("micro_batch ", spec.parallel.micro_batch,
                              " is larger than the per-replica batch ", B));
          continue;
        }
        mbs.push_back(spec.parallel.micro_batch);
      } else {
        mbs = Divisors(B);
      }
      bool any = false;
      for (int mb : mbs) {
        for (SchedulePolicy policy : policies) {
          // With one stage every schedule is the same task list.
          if (P == 1 && policies.size() > 1 && policy != policies.front()) continue;
          Candidate c{P, D, mb, policy, bounds, 0};
          std::string why;
          if ((B + mb - 1) / mb > kMaxSimulatedMicroBatches) {
            why = absl::StrCat((B + mb - 1) / mb, " micro-batches per step: over the ",
                               kMaxSimulatedMicroBatches, " the planner simulates");
          } else {
            c.bound = LowerBound(spec, profile, cache, c, req, &why);
          }
          if (!why.empty()) {
            reject(P, D, mb, SchedulePolicyName(policy), why);
          } else {
            candidates.push_back(std::move(c));
            any = true;
          }
        }
      }
      took_one = any;
    }
  }
  // Note [Pruning]: simulate in order of the lower bound; once the bound of the next shape is
  // over kPruneFactor x the best simulated step, no later shape can compete: list them with
  // their bound instead of simulating (each simulation costs O(stages x micro-batches)). A
  // budget of simulated tasks bounds the worst case (thousands of layers on hundreds of slots).
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.bound < b.bound; });
  double best = std::numeric_limits<double>::infinity();
  int64_t simulated_tasks = 0;
  for (const Candidate& c : candidates) {
    const int64_t tasks = 3LL * c.P * ((G / c.D + c.mb - 1) / c.mb);
    const bool over_budget =
        simulated_tasks > 0 && simulated_tasks + tasks > kSimulationBudgetTasks;
    if (c.bound > kPruneFactor * best || over_budget) {
      v1::Plan plan = Rejected(c.P, c.D, c.mb, SchedulePolicyName(c.policy), "");
      for (int b : *c.bounds) plan.add_boundaries(b);
      plan.set_step_s(c.bound);
      plan.set_samples_per_s(G / c.bound);
      plan.set_lower_bound(true);
      *out.add_plans() = std::move(plan);
      continue;
    }
    simulated_tasks += tasks;
    ASSIGN_OR_RETURN(v1::Plan plan,
                     Simulate(spec, profile, cache, *c.bounds, c.P, c.D, c.mb, c.policy, req));
    if (plan.rejected().empty()) {
      best = std::min(best, plan.step_s());
      *out.add_plans() = std::move(plan);
    } else {
      *out.add_rejected() = std::move(plan);
    }
  }
  if (!spec.parallel.pipelines.empty()) {
    RETURN_IF_ERROR(PlanFixedPipelines(spec, profile, cache, policies, cap, req, &out));
  } else if (req.heterogeneous && spec.parallel.stages == 0 && spec.parallel.replicas == 0) {
    simulated_tasks +=
        PlanMixes(spec, profile, cache, policies, cap, req, simulated_tasks, &best, &out);
  }
  auto& plans = *out.mutable_plans();
  std::stable_sort(plans.begin(), plans.end(), [](const v1::Plan& a, const v1::Plan& b) {
    if (a.lower_bound() != b.lower_bound()) return b.lower_bound();  // simulated first
    if (a.step_s() != b.step_s()) return a.step_s() < b.step_s();
    if (a.heterogeneous() != b.heterogeneous()) return b.heterogeneous();  // P x D first
    return a.stages() < b.stages();
  });
  if (plans.empty()) {
    std::vector<std::string> why;
    for (const auto& r : out.rejected()) {
      if (std::find(why.begin(), why.end(), r.rejected()) == why.end()) why.push_back(r.rejected());
      if (why.size() == 4) break;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("no shape fits ", cap, " slots: ", absl::StrJoin(why, "; ")));
  }
  out.set_cost_source(profile.device() == "builtin"
                          ? "built-in cost model (no profile for this model)"
                          : absl::StrCat("profile of ", profile.model_key(), " on ",
                                         profile.device(), " (", profile.host(), ", ",
                                         profile.created_at(), ")"));
  for (const std::string& n : CommModel(profile).Notes()) out.add_notes(n);
  out.set_planner_s(absl::ToDoubleSeconds(absl::Now() - t0));
  return out;
}

AutoConfig::AutoConfig(int slots, int slots_per_node, int64_t global_batch, v1::Profile profile,
                       double memory_per_slot)
    : slots_(slots),
      slots_per_node_(slots_per_node),
      global_batch_(global_batch),
      profile_(std::move(profile)),
      memory_per_slot_(memory_per_slot) {}

absl::StatusOr<v1::PlanSet> AutoConfig::Plans() const {
  if (slots_ < 1 || slots_per_node_ < 1 || slots_ > kMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("AutoConfig needs 1 <= slots <= ", kMaxSlots, " and slots_per_node >= 1"));
  }
  if (global_batch_ < 1 || global_batch_ > kMaxGlobalBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("AutoConfig needs 1 <= global_batch <= ", kMaxGlobalBatch));
  }
  JobSpec spec;
  spec.train.global_batch = global_batch_;
  spec.train.precision = profile_.precision();
  spec.train.optimizer = profile_.optimizer().empty() ? "adamw" : profile_.optimizer();
  spec.parallel.schedule = "auto";
  spec.resources.min_slots = 1;
  PlanRequest req;
  for (int left = slots_; left > 0; left -= slots_per_node_) {
    req.slots_per_node.push_back(std::min(left, slots_per_node_));
  }
  req.memory_per_slot = memory_per_slot_;
  RETURN_IF_ERROR(ValidateProfile(profile_));
  // The caller's profile defines the model (its segments), whatever its key says.
  spec.model.kind = "torchscript";
  v1::Profile keyed = profile_;
  keyed.set_model_key(ModelKey(spec.model));
  return PlanShapes(spec, keyed, req);
}

absl::StatusOr<AutoConfig::Choice> AutoConfig::GetMin() const {
  ASSIGN_OR_RETURN(v1::PlanSet set, Plans());
  const v1::Plan& best = set.plans(0);
  Choice c;
  c.stages = best.stages();
  c.replicas = best.replicas();
  c.micro_batch = best.micro_batch();
  c.schedule = best.schedule();
  c.step_s = best.step_s();
  c.boundaries.assign(best.boundaries().begin(), best.boundaries().end());
  return c;
}

}  // namespace varuna

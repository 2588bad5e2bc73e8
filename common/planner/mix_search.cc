#include "common/planner/search.h"

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

namespace varuna::search {

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
      for (double* x :
           {&c.forward_s, &c.forward_nograd_s, &c.recompute_s, &c.backward_s, &c.weight_s}) {
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
namespace {

// The pipelines of `groups` laid out on consecutive ranks, and each rank's node.
struct MixLayout {
  Topology topo;
  std::vector<int> group_of;  // per pipeline
  std::vector<int> node_of;   // per rank
};

absl::StatusOr<MixLayout> LayOutMix(const MixContext& ctx,
                                    const std::vector<PipelineGroup>& groups) {
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
  std::vector<int> node_of =
      ctx.placed != nullptr ? *ctx.placed : PackRanks(ctx.req.slots_per_node, world);
  if (static_cast<int>(node_of.size()) < world) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the pipelines need ", world, " slots, ", node_of.size(), " given"));
  }
  return MixLayout{std::move(topo), std::move(group_of), std::move(node_of)};
}

// Each pipeline simulated alone, then again under Note [Contention] when the profile measured
// a slowdown. *factor: each rank's compute factor (node speed, then contention).
std::vector<SimResult> SimulateMixPipelines(MixContext& ctx,
                                            const std::vector<PipelineGroup>& groups,
                                            const MixLayout& mix, std::vector<double>* factor) {
  const Topology& topo = mix.topo;
  const std::vector<int>& node_of = mix.node_of;
  const int world = topo.world_size();
  const int K = topo.num_pipelines();
  // A rank on a node of speed s computes 1/s as long (Note [Speed-aware plans] in
  // speed_plan.cc).
  factor->assign(world, 1.0);
  bool slowed = false;
  for (int r = 0; r < world; ++r) {
    (*factor)[r] = 1 / NodeSpeed(ctx.req, node_of[r]);
    slowed |= (*factor)[r] != 1;
  }
  auto factors_of = [&](int k) {
    const PipelineLayout& p = topo.pipeline(k);
    return slowed ? std::vector<double>(factor->begin() + p.first_rank,
                                        factor->begin() + p.first_rank + p.stages())
                  : std::vector<double>();
  };
  // Identical pipelines on the same link pattern with the same slowdowns are simulated once.
  using Key = std::tuple<int, std::vector<int>, std::vector<double>>;
  std::map<Key, SimResult> memo;
  auto simulate = [&](int k, const std::vector<double>& f) -> const SimResult& {
    const PipelineLayout& p = topo.pipeline(k);
    std::vector<int> nodes(node_of.begin() + p.first_rank,
                           node_of.begin() + p.first_rank + p.stages());
    std::vector<int> pattern;  // node ids relabelled in order of appearance
    std::map<int, int> label;
    for (int n : nodes) pattern.push_back(label.emplace(n, label.size()).first->second);
    Key key{mix.group_of[k], pattern, f};
    auto it = memo.find(key);
    if (it != memo.end()) return it->second;
    const PipelineGroup& g = groups[mix.group_of[k]];
    return memo[key] = SimulatePipeline(ctx, g.bounds, g.microbatches, nodes, f);
  };
  std::vector<SimResult> res(K);
  for (int k = 0; k < K; ++k) res[k] = simulate(k, factors_of(k));
  // Note [Contention], per rank.
  const v1::Profile& profile = ctx.profile;
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
      (*factor)[r] *= 1 + (slowdown - 1) * std::min(1.0, others / (measured_slots - 1));
    }
    slowed = true;
    for (int k = 0; k < K; ++k) res[k] = simulate(k, factors_of(k));
  }
  return res;
}

// The step from the pipelines' ends: the per-segment data-parallel all-reduce in holder-set
// order, the agreement over the deepest pipeline, the slowest rank's optimizer, the overhead.
double MixStepSeconds(const MixContext& ctx, const MixLayout& mix,
                      const std::vector<SimResult>& res, const std::vector<double>& factor,
                      int* deepest_out) {
  const v1::Profile& profile = ctx.profile;
  const Topology& topo = mix.topo;
  const std::vector<int>& node_of = mix.node_of;
  const int world = topo.world_size();
  const CommModel comm(profile);
  std::vector<double> avail(world, 0), optimizer(world, 0);
  bool any_cross = false;
  int deepest = 0;
  for (int k = 0; k < topo.num_pipelines(); ++k) {
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
  double ready = 0, opt = 0;
  for (int r = 0; r < world; ++r) {
    ready = std::max(ready, avail[r]);
    opt = std::max(opt, optimizer[r]);
  }
  const double sync = deepest > 1 ? comm.AllReduce(32, deepest, any_cross) : 0;
  *deepest_out = deepest;
  return ready + sync + opt + profile.step_overhead_s();
}

// The plan of a simulated mix: its shape, step, each group's pipelines, and the first
// stage that does not fit a slot's memory (rejected).
v1::Plan MixPlan(const MixContext& ctx, const std::vector<PipelineGroup>& groups,
                 const Topology& topo, const std::vector<SimResult>& res, double step,
                 int deepest) {
  const int world = topo.world_size();
  v1::Plan plan;
  plan.set_stages(deepest);
  plan.set_replicas(topo.num_pipelines());
  plan.set_micro_batch(ctx.mb);
  plan.set_schedule(SchedulePolicyName(ctx.policy));
  plan.set_step_s(step);
  plan.set_samples_per_s(step > 0 ? ctx.spec.train.global_batch / step : 0);
  plan.set_slots(world);
  plan.set_heterogeneous(true);
  plan.set_topology(topo.ToString());
  for (int b : groups[0].bounds) plan.add_boundaries(b);
  for (double b : res[0].peak_bytes) plan.add_peak_bytes(b);
  for (double b : res[0].busy_s) plan.add_busy_s(b);
  double longest = 0, busy = 0;
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

}  // namespace

absl::StatusOr<v1::Plan> SimulateMix(MixContext& ctx, const std::vector<PipelineGroup>& groups) {
  ASSIGN_OR_RETURN(const MixLayout mix, LayOutMix(ctx, groups));
  std::vector<double> factor;
  const std::vector<SimResult> res = SimulateMixPipelines(ctx, groups, mix, &factor);
  int deepest = 0;
  const double step = MixStepSeconds(ctx, mix, res, factor, &deepest);
  return MixPlan(ctx, groups, mix.topo, res, step, deepest);
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
  const std::vector<int> node_of = PackRanks(ctx.req.slots_per_node, world);
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
// (or request.simulate_within, if larger: an estimate is no bound, so exact pruning keeps this
// slack) of the best step and the budgets (tasks, request.budget_s since t0) last. Adds plans (and
// rejected ones) to *out, lowers *best; returns the tasks simulated.
int64_t PlanMixes(const JobSpec& spec, const v1::Profile& profile, SegmentCache& cache,
                  const std::vector<SchedulePolicy>& policies, int cap, const PlanRequest& req,
                  absl::Time t0, int64_t simulated_before, double* best, v1::PlanSet* out) {
  const int nseg = profile.segments_size();
  const int64_t G = spec.train.global_batch;
  if (cap < 3 || nseg < 2 || cap < spec.resources.min_slots) return 0;
  std::set<int> mbs;
  for (const v1::Plan& p : out->plans()) {
    // Bounded shapes count by their bound: exact pruning simulates fewer P x D shapes.
    if (p.step_s() <= kPruneFactor * *best) mbs.insert(p.micro_batch());
  }
  if (mbs.empty()) {
    if (spec.parallel.micro_batch > 0) {
      mbs.insert(spec.parallel.micro_batch);
    } else {
      for (int d : Divisors(G)) mbs.insert(d);
    }
  }
  const std::vector<int> node_of = PackRanks(req.slots_per_node, cap);
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
    if (c.estimate > std::max(kPruneFactor, req.simulate_within) * *best) break;
    if (simulated_before + tasks >= req.max_simulated_tasks) break;
    if (req.budget_s > 0 && absl::Now() - t0 > absl::Seconds(req.budget_s)) break;
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

}  // namespace varuna::search

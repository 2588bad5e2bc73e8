#include "common/planner/autoconfig.h"

#include <algorithm>
#include <cmath>
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
#include "common/planner/search.h"
#include "common/planner/simulator.h"
#include "common/planner/tp_plan.h"
#include "common/spec/job_topology.h"

namespace varuna {
namespace {

using search::BalanceForSpeeds;
using search::Divisors;
using search::GiB;
using search::HasSpeeds;
using search::kMaxSimulatedMicroBatches;
using search::OptimizerStates;
using search::PlanFixedPipelines;
using search::PlanMixes;
using search::Rejected;
using search::SegmentCache;
using search::Simulate;
using search::SimulateWithSpeeds;
using search::StageCosts;

struct Candidate {
  int P, D, mb;
  SchedulePolicy policy;
  std::shared_ptr<const std::vector<int>> bounds;
  double bound;
};

// Note [Lower bound]: a bound on the step every simulation of the shape reaches, so a shape
// whose bound is over the best simulated step cannot be the best. For each stage b: its first
// task needs micro-batch 0's forward through stages 0..b-1 (the fill), then it computes all
// M micro-batches serially; after its last backward (B, with a split schedule) the gradient
// still goes back through stages b-1..0 (the drain), each running one B. Then the data-parallel
// all-reduce of the stage that ends last (the cheaper of the two link kinds), the slowest
// optimizer, the per-step overhead. Compute is divided by the fastest node's speed. Links,
// contention and the tied and pipeline-wide reductions only add (a test checks the bound
// against the simulator). The memory check that needs no simulation rides along: every stage
// holds at least one graph during a backward (GPipe and 1F1B: as many as their schedules
// keep); *why is set when the shape cannot fit.
double LowerBound(const JobSpec& spec, const v1::Profile& profile, SegmentCache& cache,
                  const Candidate& c, const PlanRequest& req, std::string* why) {
  const std::vector<SegmentTimes>& t = cache.At(c.mb);
  const double M = static_cast<double>((spec.train.global_batch / c.D + c.mb - 1) / c.mb);
  const bool recompute = c.policy == SchedulePolicy::kVaruna;
  const bool split = SplitsBackward(c.policy);
  double fastest = 1;
  for (size_t n = 0; n < req.node_speed.size(); ++n) {
    fastest = std::max(fastest, search::NodeSpeed(req, static_cast<int>(n)));
  }
  const CommModel comm(profile);
  double step = 0, fill = 0, drain = 0, optimizer = 0, allreduce0 = 0;
  double cheapest = 0, optimizer_sum = 0;  // whatever the cut: each segment's least work
  for (int s = 0; s < c.P; ++s) {
    const bool last = s == c.P - 1;
    double work = 0, first_forward = 0, b_part = 0, w_part = 0, opt = 0;
    double params = 0, graph = 0, transient = 0;
    for (int g = (*c.bounds)[s]; g < (*c.bounds)[s + 1]; ++g) {
      work += (recompute && !last ? t[g].forward_nograd_s + t[g].recompute_s : t[g].forward_s) +
              t[g].backward_s;
      first_forward += std::min(t[g].forward_s, t[g].forward_nograd_s);
      b_part += split ? std::max(0.0, t[g].backward_s - t[g].weight_s) : t[g].backward_s;
      w_part += split ? std::min(t[g].weight_s, t[g].backward_s) : 0;
      opt += profile.segments(g).optimizer_s();
      cheapest += std::min(t[g].forward_nograd_s + t[g].recompute_s, t[g].forward_s) +
                  (split ? std::max(0.0, t[g].backward_s - t[g].weight_s) +
                               std::min(t[g].weight_s, t[g].backward_s)
                         : t[g].backward_s);
      params += profile.segments(g).param_bytes();
      graph += t[g].graph_bytes;
      transient = std::max(transient, t[g].peak_bytes - t[g].graph_bytes);
    }
    work /= fastest;
    const double allreduce = c.D > 1 ? std::min(comm.AllReduce(params + 16, c.D, false),
                                                comm.AllReduce(params + 16, c.D, true))
                                     : 0;
    if (s == 0) allreduce0 = allreduce;
    // Stage s ends its last B at fill + M x (work - W) at the earliest; stages s-1..0 follow.
    step = std::max({step, fill + M * work + allreduce,
                     fill + M * (work - w_part / fastest) + drain + allreduce0});
    fill += first_forward / fastest;
    drain += b_part / fastest;
    optimizer = std::max(optimizer, opt / fastest);
    optimizer_sum += opt / fastest;
    // Graphs alive at a stage's peak: GPipe holds all M, 1F1B its warm-up depth (P - s),
    // ZB-H1 min(P, M) on every stage (Note [Schedules]), the Varuna schedule at least one.
    const double live = c.policy == SchedulePolicy::kGPipe  ? M
                        : c.policy == SchedulePolicy::k1F1B ? std::min<double>(c.P - s, M)
                        : c.policy == SchedulePolicy::kZbH1 ? std::min<double>(c.P, M)
                                                            : 1.0;
    const double floor_bytes =
        params * (2 + OptimizerStates(spec.train.optimizer) + (c.D > 1 ? 1 : 0)) + live * graph +
        std::max(0.0, transient);
    if (req.memory_per_slot > 0 && floor_bytes > req.memory_per_slot && why->empty()) {
      *why = absl::StrCat("memory: stage ", s, " needs at least ", GiB(floor_bytes),
                          ", a slot has ", GiB(req.memory_per_slot));
    }
  }
  const double uniform = step + optimizer + profile.step_overhead_s();
  if (!search::HasSpeeds(req) || !req.heterogeneous) return uniform;
  // A kept shape also gets a variant balanced for the speeds (Note [Speed-aware plans]): other
  // cuts, and the micro-batches split unevenly over the pipelines. What no cut or split escapes:
  // the least work of every micro-batch, spread evenly over the P x D ranks at the fastest
  // speed, and the optimizer spread the same way.
  return std::min(uniform,
                  (M * cheapest + optimizer_sum) / c.P / fastest + profile.step_overhead_s());
}

}  // namespace

std::vector<int> PackRanks(const std::vector<int>& slots_per_node, int world) {
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

namespace {

// The slots the plan may use (resources.max_slots caps the free ones), or why the request or
// the job's fixed shape cannot be planned at all.
absl::StatusOr<int> UsableSlots(const JobSpec& spec, int nseg, const PlanRequest& req) {
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
  return cap;
}

// The schedules to try: all four for "auto", else the one the job names.
absl::StatusOr<std::vector<SchedulePolicy>> PoliciesToTry(const JobSpec& spec) {
  if (spec.parallel.schedule == "auto") {
    return std::vector<SchedulePolicy>{SchedulePolicy::kVaruna, SchedulePolicy::k1F1B,
                                       SchedulePolicy::kGPipe, SchedulePolicy::kZbH1};
  }
  ASSIGN_OR_RETURN(SchedulePolicy fixed, ParseSchedulePolicy(spec.parallel.schedule));
  return std::vector<SchedulePolicy>{fixed};
}

// The shapes of P x D x micro-batch x schedule worth simulating, each with its lower bound;
// what cannot run is listed in out->rejected with why.
class CandidateSearch {
 public:
  CandidateSearch(const JobSpec& spec, const v1::Profile& profile, SegmentCache& cache,
                  const PlanRequest& req, const std::vector<SchedulePolicy>& policies, int cap,
                  v1::PlanSet* out)
      : spec_(spec),
        profile_(profile),
        cache_(cache),
        req_(req),
        policies_(policies),
        cap_(cap),
        out_(out),
        G_(spec.train.global_batch) {}

  absl::StatusOr<std::vector<Candidate>> Run() {
    const int nseg = profile_.segments_size();
    std::vector<int> Ps;  // none with parallel.pipelines: that plan only
    if (!spec_.parallel.pipelines.empty()) {
    } else if (spec_.parallel.stages > 0) {
      Ps.push_back(spec_.parallel.stages);
    } else {
      for (int p = 1; p <= std::min(nseg, cap_); ++p) Ps.push_back(p);
    }
    std::vector<Candidate> candidates;
    for (int P : Ps) {
      if (P > nseg) {
        Reject(P, 0, 0, absl::StrCat("the model has ", nseg, " segments"));
        continue;
      }
      RETURN_IF_ERROR(AddDepth(P, &candidates));
    }
    return candidates;
  }

 private:
  void Reject(int P, int D, int mb, const std::string& why, const std::string* sched = nullptr) {
    *out_->add_rejected() = Rejected(P, D, mb, sched ? *sched : spec_.parallel.schedule, why);
  }

  // Widths for depth P that divide the global batch, widest first (or the job's fixed one);
  // the widest that does not fit the batch is listed once as rejected. Empty: none.
  std::vector<int> Widths(int P) {
    const int dmax = cap_ / P;
    std::vector<int> Ds;
    if (dmax < 1) {
      Reject(P, 1, 0, absl::StrCat("needs ", P, " slots, ", cap_, " available"));
      return Ds;
    }
    if (spec_.parallel.replicas > 0) {
      if (spec_.parallel.replicas > dmax) {
        Reject(P, spec_.parallel.replicas, 0,
               absl::StrCat("needs ", P * spec_.parallel.replicas, " slots, ", cap_, " available"));
        return Ds;
      }
      Ds.push_back(spec_.parallel.replicas);
      return Ds;
    }
    for (int d : Divisors(G_)) {
      if (d <= dmax) Ds.push_back(d);
    }
    std::reverse(Ds.begin(), Ds.end());
    if (Ds.empty() || Ds.front() != dmax) {
      Reject(P, dmax, 0,
             absl::StrCat("global_batch ", G_, " is not divisible by ", dmax, " replicas"));
    }
    return Ds;
  }

  // The candidates of depth P: the widest width that yields any (every width with req.all).
  absl::Status AddDepth(int P, std::vector<Candidate>* candidates) {
    auto bounds = std::make_shared<const std::vector<int>>();
    bool took_one = false;
    for (int D : Widths(P)) {
      if (took_one && !req_.all) break;
      if (G_ % D != 0) {
        Reject(P, D, 0, absl::StrCat("global_batch ", G_, " is not divisible by ", D, " replicas"));
        continue;
      }
      if (P * D < spec_.resources.min_slots) {
        Reject(P, D, 0,
               absl::StrCat("uses ", P * D, " slots; resources.min_slots is ",
                            spec_.resources.min_slots));
        continue;
      }
      if (bounds->empty()) {
        ASSIGN_OR_RETURN(*std::const_pointer_cast<std::vector<int>>(bounds),
                         StageBoundaries(profile_, P));
      }
      took_one = AddWidth(P, D, bounds, candidates);
    }
    return absl::OkStatus();
  }

  // The candidates of P x D, one per micro-batch and schedule; false when none could run.
  bool AddWidth(int P, int D, const std::shared_ptr<const std::vector<int>>& bounds,
                std::vector<Candidate>* candidates) {
    const int64_t B = G_ / D;
    std::vector<int> mbs;
    if (spec_.parallel.micro_batch > 0) {
      // As the engine does, the last micro-batch may be smaller.
      if (spec_.parallel.micro_batch > B) {
        Reject(P, D, spec_.parallel.micro_batch,
               absl::StrCat("micro_batch ", spec_.parallel.micro_batch,
                            " is larger than the per-replica batch ", B));
        return false;
      }
      mbs.push_back(spec_.parallel.micro_batch);
    } else {
      mbs = Divisors(B);
    }
    bool any = false;
    for (int mb : mbs) {
      for (SchedulePolicy policy : policies_) {
        // With one stage every schedule is the same task list.
        if (P == 1 && policies_.size() > 1 && policy != policies_.front()) continue;
        Candidate c{P, D, mb, policy, bounds, 0};
        std::string why;
        if ((B + mb - 1) / mb > kMaxSimulatedMicroBatches) {
          why = absl::StrCat((B + mb - 1) / mb, " micro-batches per step: over the ",
                             kMaxSimulatedMicroBatches, " the planner simulates");
        } else {
          c.bound = LowerBound(spec_, profile_, cache_, c, req_, &why);
        }
        if (!why.empty()) {
          const std::string sched = SchedulePolicyName(policy);
          Reject(P, D, mb, why, &sched);
        } else {
          candidates->push_back(std::move(c));
          any = true;
        }
      }
    }
    return any;
  }

  const JobSpec& spec_;
  const v1::Profile& profile_;
  SegmentCache& cache_;
  const PlanRequest& req_;
  const std::vector<SchedulePolicy>& policies_;
  const int cap_;
  v1::PlanSet* out_;
  const int64_t G_;
};

// Note [Pruning]: simulate in order of the lower bound (Note [Lower bound]); once the bound
// of the next shape is over request.simulate_within x the best simulated step (of its width,
// with best_per_width), it is listed with its bound instead of simulated (each simulation
// costs O(stages x micro-batches)). With simulate_within = 1 that is exact: a shape whose bound
// is over the best cannot beat it. Two budgets bound the worst case (thousands of layers on
// hundreds of slots): simulated tasks, and request.budget_s of wall-clock time, after which
// the best so far leads. *best: the best simulated step; *simulated_tasks: the tasks simulated.
absl::Status SimulateCandidates(const JobSpec& spec, const v1::Profile& profile,
                                SegmentCache& cache, const PlanRequest& req, absl::Time t0,
                                std::vector<Candidate> candidates, double* best,
                                int64_t* simulated_tasks, v1::PlanSet* out) {
  const int64_t G = spec.train.global_batch;
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.bound < b.bound; });
  std::map<int, double> best_of_width;
  int64_t unsimulated = 0;
  for (const Candidate& c : candidates) {
    const int64_t tasks = 3LL * c.P * ((G / c.D + c.mb - 1) / c.mb);
    // The budgets apply once a shape that fits was simulated: a plan always leads with one.
    const bool over_budget = std::isfinite(*best) &&
                             (*simulated_tasks + tasks > req.max_simulated_tasks ||
                              (req.budget_s > 0 && absl::Now() - t0 > absl::Seconds(req.budget_s)));
    auto width_best = best_of_width.find(c.P * c.D);
    const double reference = !req.best_per_width ? *best
                             : width_best == best_of_width.end()
                                 ? std::numeric_limits<double>::infinity()
                                 : width_best->second;
    const bool promising = c.bound <= std::max(1.0, req.simulate_within) * reference;
    if (!promising || over_budget) {
      if (promising) ++unsimulated;
      v1::Plan plan = Rejected(c.P, c.D, c.mb, SchedulePolicyName(c.policy), "");
      for (int b : *c.bounds) plan.add_boundaries(b);
      plan.set_step_s(c.bound);
      plan.set_samples_per_s(G / c.bound);
      plan.set_lower_bound(true);
      *out->add_plans() = std::move(plan);
      continue;
    }
    *simulated_tasks += tasks;
    const bool speeds = HasSpeeds(req);
    ASSIGN_OR_RETURN(
        v1::Plan plan,
        speeds ? SimulateWithSpeeds(spec, profile, cache, *c.bounds, c.P, c.D, c.mb, c.policy, req)
               : Simulate(spec, profile, cache, *c.bounds, c.P, c.D, c.mb, c.policy, req));
    std::vector<v1::Plan> simulated{std::move(plan)};
    if (speeds && req.heterogeneous) {  // Note [Speed-aware plans]
      *simulated_tasks += tasks;
      auto balanced =
          BalanceForSpeeds(spec, profile, cache, *c.bounds, c.P, c.D, c.mb, c.policy, req);
      if (balanced.ok()) simulated.push_back(*std::move(balanced));
    }
    for (v1::Plan& p : simulated) {
      if (p.rejected().empty()) {
        *best = std::min(*best, p.step_s());
        auto [it, fresh] = best_of_width.emplace(p.slots(), p.step_s());
        if (!fresh) it->second = std::min(it->second, p.step_s());
        *out->add_plans() = std::move(p);
      } else {
        *out->add_rejected() = std::move(p);
      }
    }
  }
  if (unsimulated > 0) {
    out->add_notes(absl::StrCat("the planner's budget ran out (", req.max_simulated_tasks, " tasks",
                                req.budget_s > 0 ? absl::StrCat(" or ", req.budget_s, " s") : "",
                                "): ", unsimulated,
                                " shapes that might compete are listed with their lower bound"));
  }
  return absl::OkStatus();
}

// Orders the plans (simulated first, fastest first), or says why no shape fits; then what
// the costs came from and the planner's own time.
absl::Status FinishPlanSet(const v1::Profile& profile, int cap, absl::Time t0, v1::PlanSet* out) {
  auto& plans = *out->mutable_plans();
  std::stable_sort(plans.begin(), plans.end(), [](const v1::Plan& a, const v1::Plan& b) {
    if (a.lower_bound() != b.lower_bound()) return b.lower_bound();  // simulated first
    if (a.step_s() != b.step_s()) return a.step_s() < b.step_s();
    if (a.heterogeneous() != b.heterogeneous()) return b.heterogeneous();  // P x D first
    return a.stages() < b.stages();
  });
  if (plans.empty()) {
    std::vector<std::string> why;
    for (const auto& r : out->rejected()) {
      if (std::find(why.begin(), why.end(), r.rejected()) == why.end()) why.push_back(r.rejected());
      if (why.size() == 4) break;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("no shape fits ", cap, " slots: ", absl::StrJoin(why, "; ")));
  }
  out->set_cost_source(profile.device() == "builtin"
                           ? "built-in cost model (no profile for this model)"
                           : absl::StrCat("profile of ", profile.model_key(), " on ",
                                          profile.device(), " (", profile.host(), ", ",
                                          profile.created_at(), ")"));
  for (const std::string& n : CommModel(profile).Notes()) out->add_notes(n);
  out->set_planner_s(absl::ToDoubleSeconds(absl::Now() - t0));
  return absl::OkStatus();
}

}  // namespace

PlanRequest ManagerPlanRequest() {
  PlanRequest req;
  req.heterogeneous = true;  // mixes of pipeline depths compete with P x D (issue 13)
  req.simulate_within = 1;
  req.max_simulated_tasks = 750'000;
  req.budget_s = 1;
  return req;
}

absl::StatusOr<v1::PlanSet> PlanShapes(const JobSpec& spec, const v1::Profile& profile,
                                       const PlanRequest& req) {
  const absl::Time t0 = absl::Now();
  RETURN_IF_ERROR(CheckProfileFor(profile, spec));
  // Note [Tensor-parallel plans] in tp_plan.cc: planned as a job of tp groups.
  if (spec.parallel.tp_size > 1) return PlanTensorParallel(spec, profile, req);
  if (spec.parallel.tp_size == 0) return PlanTensorParallelSizes(spec, profile, req);
  ASSIGN_OR_RETURN(const int cap, UsableSlots(spec, profile.segments_size(), req));
  ASSIGN_OR_RETURN(const std::vector<SchedulePolicy> policies, PoliciesToTry(spec));
  v1::PlanSet out;
  SegmentCache cache(profile);
  ASSIGN_OR_RETURN(std::vector<Candidate> candidates,
                   CandidateSearch(spec, profile, cache, req, policies, cap, &out).Run());
  double best = std::numeric_limits<double>::infinity();
  int64_t simulated_tasks = 0;
  RETURN_IF_ERROR(SimulateCandidates(spec, profile, cache, req, t0, std::move(candidates), &best,
                                     &simulated_tasks, &out));
  if (!spec.parallel.pipelines.empty()) {
    RETURN_IF_ERROR(PlanFixedPipelines(spec, profile, cache, policies, cap, req, &out));
  } else if (req.heterogeneous && spec.parallel.stages == 0 && spec.parallel.replicas == 0) {
    simulated_tasks +=
        PlanMixes(spec, profile, cache, policies, cap, req, t0, simulated_tasks, &best, &out);
  }
  RETURN_IF_ERROR(FinishPlanSet(profile, cap, t0, &out));
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

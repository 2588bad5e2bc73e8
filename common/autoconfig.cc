#include "common/autoconfig.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/partition.h"
#include "common/profile.h"
#include "common/simulator.h"
#include "common/status_macros.h"

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
  std::vector<SimStage> stages(P);
  std::vector<double> param_bytes(P, 0);
  const int64_t per_replica = spec.train.global_batch / D;
  const int M = static_cast<int>((per_replica + mb - 1) / mb);  // the last may be smaller
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
      param_bytes[s] += seg.param_bytes();
      c.optimizer_s += seg.optimizer_s();
    }
    c.transient_bytes = std::max(0.0, transient);
    c.static_bytes = param_bytes[s] * (2 + OptimizerStates(spec.train.optimizer) + (D > 1 ? 1 : 0));
    if (s > 0) {
      c.stash_bytes = seg_times[bounds[s] - 1].activation_bytes;
    }
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
  const int n = static_cast<int>(costs.size());
  if (stages < 1 || stages > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot split ", n, " segments into ", stages, " stages"));
  }
  double lo = 0, hi = 0;
  for (double c : costs) {
    lo = std::max(lo, c);
    hi += c;
  }
  auto needed = [&](double cap) {
    int count = 1;
    double cur = 0;
    for (double c : costs) {
      if (cur + c > cap && cur > 0) {
        ++count;
        cur = 0;
      }
      cur += c;
    }
    return count;
  };
  for (int i = 0; i < 100 && hi - lo > 1e-12 * std::max(1.0, hi); ++i) {
    const double mid = (lo + hi) / 2;
    (needed(mid) <= stages ? hi : lo) = mid;
  }
  std::vector<int> bounds = {0};
  double cur = 0;
  for (int i = 0; i < n; ++i) {
    const int open = static_cast<int>(bounds.size());  // stages started, the current included
    const bool nonempty = i > bounds.back();
    if (nonempty && (cur + costs[i] > hi || n - i == stages - open)) {
      bounds.push_back(i);
      cur = 0;
    }
    cur += costs[i];
  }
  bounds.push_back(n);
  if (static_cast<int>(bounds.size()) != stages + 1) {
    // Cannot happen (needed(hi) <= stages); the exact split as a fallback.
    return PartitionByCost(costs, stages);
  }
  return bounds;
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
  std::vector<int> Ps;
  if (spec.parallel.stages > 0) {
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
  auto& plans = *out.mutable_plans();
  std::stable_sort(plans.begin(), plans.end(), [](const v1::Plan& a, const v1::Plan& b) {
    if (a.lower_bound() != b.lower_bound()) return b.lower_bound();  // simulated first
    if (a.step_s() != b.step_s()) return a.step_s() < b.step_s();
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

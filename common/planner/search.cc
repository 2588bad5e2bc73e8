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

std::string GiB(double bytes) { return absl::StrFormat("%.2f GiB", bytes / (1 << 30)); }

double OptimizerStates(const std::string& optimizer) { return optimizer == "sgd" ? 1 : 2; }

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
      c.weight_s += t.weight_s;
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
  const std::vector<int> node_of = PackRanks(req.slots_per_node, P * D);
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
                        &out[s].backward_s, &out[s].weight_s, &out[s].optimizer_s}) {
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

}  // namespace varuna::search

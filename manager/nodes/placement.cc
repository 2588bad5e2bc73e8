#include "manager/nodes/placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/launch/launch_args.h"
#include "common/pipeline/pipeline_template.h"
#include "common/pipeline/stage_map.h"
#include "common/planner/autoconfig.h"
#include "common/planner/profile.h"
#include "common/planner/tp_plan.h"
#include "common/spec/job_topology.h"

namespace varuna {

namespace {

void SortFullestFirst(std::vector<FreeSlots>* nodes) {
  std::sort(nodes->begin(), nodes->end(), [](const FreeSlots& a, const FreeSlots& b) {
    return a.free != b.free ? a.free > b.free : a.node < b.node;
  });
}

// Ranks onto the nodes (sorted fullest first) by the planner's packing rule.
std::vector<v1::RankPlacement> Place(const std::vector<FreeSlots>& nodes, int world) {
  std::vector<int> slots;
  for (const auto& n : nodes) slots.push_back(std::max(0, n.free));
  std::vector<v1::RankPlacement> ranks;
  std::vector<int> used(nodes.size(), 0);
  const std::vector<int> node_of = PackRanks(slots, world);
  for (size_t r = 0; r < node_of.size(); ++r) {
    v1::RankPlacement p;
    p.set_rank(static_cast<int>(r));
    p.set_node(nodes[node_of[r]].node);
    p.set_local_rank(used[node_of[r]]++);
    ranks.push_back(p);
  }
  return ranks;
}

// Note [Tensor-parallel placement]: a tp job's unit is a tp group of T = parallel.tp_size
// processes on one node (Note [Tensor-parallel plans] in common/planner/tp_plan.cc). Its plan
// places units, as a job of tp_size 1 on each node's floor(free / T) slots would be placed;
// then unit u (rank u of the stage map) on a node with local index k becomes the processes
// u*T .. u*T+T-1 with local ranks k*T .. k*T+T-1, which is what the workers read (RANK mod T
// is the tp rank; WorkerTopology in common/launch/launch_args.h).
std::vector<FreeSlots> Groups(std::vector<FreeSlots> nodes, int tp) {
  for (auto& n : nodes) n.free = std::max(0, n.free) / tp;
  return nodes;
}

std::vector<v1::RankPlacement> ExpandGroups(const std::vector<v1::RankPlacement>& units, int tp) {
  std::vector<v1::RankPlacement> out;
  for (const v1::RankPlacement& u : units) {
    for (int i = 0; i < tp; ++i) {
      v1::RankPlacement p = u;
      p.set_rank(u.rank() * tp + i);
      p.set_local_rank(u.local_rank() * tp + i);
      out.push_back(p);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<JobPlan> PlanJob(const JobSpec& spec, std::vector<FreeSlots> nodes) {
  if (spec.parallel.tp_size == 0) {  // auto: only AutoConfig chooses a split; the rule does not
    JobSpec one = spec;
    one.parallel.tp_size = 1;
    return PlanJob(one, std::move(nodes));
  }
  if (const int tp = spec.parallel.tp_size; tp > 1) {  // Note [Tensor-parallel placement]
    absl::StatusOr<JobPlan> plan =
        PlanJob(TensorParallelGroupSpec(spec), Groups(std::move(nodes), tp));
    if (!plan.ok()) return InTensorParallelGroups(plan.status(), tp);
    plan->ranks = ExpandGroups(plan->ranks, tp);
    plan->tp_size = tp;
    return plan;
  }
  SortFullestFirst(&nodes);
  int total = 0, most_on_one = 0;
  for (const auto& n : nodes) {
    total += std::max(0, n.free);
    most_on_one = std::max(most_on_one, n.free);
  }
  if (!spec.parallel.pipelines.empty()) {
    const int world = PipelineRanks(spec.parallel);
    if (world > total) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "needs ", world, " slots (parallel.pipelines), ", total, " free on schedulable nodes"));
    }
    JobPlan plan;
    for (const PipelineEntrySpec& e : spec.parallel.pipelines) {
      plan.stages = std::max(plan.stages, static_cast<int>(e.stages.size()));
      plan.replicas += e.count;
    }
    plan.micro_batch = spec.parallel.micro_batch;
    // TorchScript modules are known only to the workers, which then read the spec themselves.
    if (auto modules = BuiltinModules(spec.model); modules.ok()) {
      ASSIGN_OR_RETURN(Topology t, TopologyFromSpec(spec, *modules, world));
      plan.pipelines = t.ToString();
    }
    plan.ranks = Place(nodes, world);
    plan.schedule = spec.parallel.schedule == "auto" ? "varuna" : spec.parallel.schedule;
    plan.source = "fixed by the job spec: parallel.pipelines";
    return plan;
  }
  int cap = total;
  if (spec.resources.max_slots > 0) cap = std::min(cap, spec.resources.max_slots);
  auto short_of = [&](int need) {
    return absl::ResourceExhaustedError(
        absl::StrCat("needs ", need, " slots, ", total, " free on schedulable nodes"));
  };

  int P = spec.parallel.stages;
  if (P == 0) {
    P = std::max(1, std::min({most_on_one, spec.model.layers, cap}));
    while (P > 1 && cap % P != 0) --P;
  }
  if (P > cap) return short_of(std::max(P, spec.resources.min_slots));
  int D = spec.parallel.replicas;
  if (D == 0) {
    D = cap / P;
    const int64_t mb = spec.parallel.micro_batch;
    while (D > 1 && (spec.train.global_batch % D != 0 || spec.train.global_batch / D < mb)) --D;
  }
  const int world = P * D;
  if (D < 1 || world > cap || world < spec.resources.min_slots) {
    return short_of(std::max({world, P, spec.resources.min_slots}));
  }
  if (spec.train.global_batch % D != 0) {
    return absl::InvalidArgumentError(absl::StrCat("train.global_batch=", spec.train.global_batch,
                                                   " is not divisible by parallel.replicas=", D));
  }

  JobPlan plan;
  plan.stages = P;
  plan.replicas = D;
  plan.per_replica_batch = spec.train.global_batch / D;
  auto micro_batch = MicroBatchFor(spec.parallel.micro_batch, plan.per_replica_batch, P);
  if (!micro_batch.ok()) return micro_batch.status();
  plan.micro_batch = *micro_batch;
  plan.stage_to_rank_map = StageMap::Make(P, D).ToString();
  plan.ranks = Place(nodes, world);
  plan.schedule = spec.parallel.schedule == "auto" ? "varuna" : spec.parallel.schedule;
  return plan;
}

absl::StatusOr<JobPlan> PlanWithProfile(const JobSpec& spec, std::vector<FreeSlots> nodes,
                                        const v1::Profile* profile,
                                        const std::map<std::string, double>& speeds) {
  const bool any_auto = spec.parallel.stages == 0 || spec.parallel.replicas == 0 ||
                        spec.parallel.micro_batch == 0 || spec.parallel.schedule == "auto";
  if (!spec.parallel.pipelines.empty()) return PlanJob(spec, std::move(nodes));
  bool slow_here = false;
  for (const auto& n : nodes) slow_here |= speeds.count(n.node) > 0;
  std::string why_not;
  if (profile == nullptr) {
    why_not = absl::StrCat("no profile of '", ModelKey(spec.model), "' (", spec.train.precision,
                           "): varunactl profile JOB.yaml");
  } else if (absl::Status st = CheckProfileFor(*profile, spec); !st.ok()) {
    why_not = std::string(st.message());
  }
  if (!why_not.empty()) {
    ASSIGN_OR_RETURN(JobPlan plan, PlanJob(spec, std::move(nodes)));
    plan.source =
        any_auto ? absl::StrCat("placement rule (", why_not, ")") : "fixed by the job spec";
    return plan;
  }
  SortFullestFirst(&nodes);
  PlanRequest req = ManagerPlanRequest();  // the best shape, within the manager's budget
  for (const auto& n : nodes) {
    req.slots_per_node.push_back(std::max(0, n.free));
    auto it = speeds.find(n.node);
    req.node_speed.push_back(it == speeds.end() ? 1.0 : it->second);
  }
  absl::StatusOr<v1::PlanSet> set = PlanShapes(spec, *profile, req);
  if (!set.ok()) {
    // Slots may still come: the job waits (the reason is shown), as under the placement rule.
    if (set.status().code() == absl::StatusCode::kInvalidArgument) return set.status();
    return absl::ResourceExhaustedError(set.status().message());
  }
  const v1::Plan& best = set->plans(0);
  JobPlan plan;
  plan.stages = best.stages();
  plan.replicas = best.replicas();
  plan.micro_batch = best.micro_batch();
  // The plan counts tp groups; each becomes tp processes (Note [Tensor-parallel placement]).
  const int tp = std::max(1, best.tp_size());
  const std::vector<FreeSlots> units = tp > 1 ? Groups(nodes, tp) : nodes;
  if (best.pipelines_size() > 0) {
    plan.pipelines = best.topology();
    plan.ranks = Place(units, best.slots() / tp);
  } else {
    plan.per_replica_batch = spec.train.global_batch / best.replicas();
    plan.stage_to_rank_map = StageMap::Make(plan.stages, plan.replicas).ToString();
    plan.ranks = Place(units, plan.stages * plan.replicas);
  }
  if (tp > 1) plan.ranks = ExpandGroups(plan.ranks, tp);
  plan.tp_size = tp;
  plan.schedule = best.schedule();
  // A mix's boundaries travel in its topology text; the top-level ones are pipeline 0's.
  if (best.pipelines_size() == 0) {
    plan.boundaries.assign(best.boundaries().begin(), best.boundaries().end());
  }
  plan.predicted_step_s = best.step_s();
  plan.source = set->cost_source();
  if (slow_here) absl::StrAppend(&plan.source, ", with measured node speeds");
  return plan;
}

}  // namespace varuna

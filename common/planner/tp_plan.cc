#include "common/planner/tp_plan.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/planner/profile.h"
#include "common/spec/model_spec.h"

namespace varuna {

// Note [Tensor-parallel plans]: a tensor-parallel job's unit is a tp group, tp_size = T
// processes of one stage on one node (Note [Tensor parallelism] in
// worker/models/tensor_parallel.cc). AutoConfig plans it as a job of such units with tp_size 1:
//  - Slots. Each node offers floor(free / T) units (a group never spans nodes: its all-reduces
//    run twice per layer and direction). resources.min_slots and max_slots count processes, so
//    they become ceil(min / T) and floor(max / T) units.
//  - Costs. TensorParallelProfile derives a unit's costs from the profile measured at tp_size 1
//    (profiles are always measured so; the profiler refuses tp):
//     * the blocks (every segment but the first, the embedding, and the last, the head: both are
//       computed whole on every tp rank) split their matmuls: forward, recompute, backward and
//       W times / T, and so their parameters, gradients, optimizer state and optimizer time;
//     * each forward (with graph, without, recompute) and backward of a block adds k all-reduces
//       of its output activation (the profile's activation_bytes) over T ranks of one host,
//       priced by CommModel from the profile's same-host all-reduce samples: k = 2 for gpt and
//       llama (attention and MLP), 1 for mlp; W adds none;
//     * activation memory is kept whole, an over-estimate (the attention scores and the MLP's
//       inner activations are split too);
//     * contention (Note [Contention] in search.cc): the T ranks of a unit always compute at
//       once, so with a measured compute_slowdown a block's compute is slowed as by T - 1 busy
//       peers, and a host is counted in units (slots_per_host / T).
//  - The result. Every plan and rejected shape gets tp_size = T and `slots` in processes;
//    stages, replicas and the topology text count units, which is what the workers' stage map
//    places (positions).
//  - tp_size auto (PlanTensorParallelSizes): every T the model splits into, up to the most free
//    slots of one node, is planned so and the plans ranked together, so a morph onto other
//    nodes may change T (checkpoints load at any T).
// The model of compute / T is the ideal; bench (m) in docs/benchmarks.md measured 1.92x on
// two ranks of one host for tp 2 against 2 for the ideal, and the predicted tp 2 step was
// 0.98x of the measured one.
namespace {

int AllReducesPerBlock(const std::string& kind) { return kind == "mlp" ? 1 : 2; }

}  // namespace

JobSpec TensorParallelGroupSpec(const JobSpec& spec) {
  const int t = std::max(1, spec.parallel.tp_size);
  JobSpec groups = spec;
  groups.parallel.tp_size = 1;
  if (spec.resources.min_slots > 0)
    groups.resources.min_slots = (spec.resources.min_slots + t - 1) / t;
  if (spec.resources.max_slots > 0)
    groups.resources.max_slots = std::max(1, spec.resources.max_slots / t);
  return groups;
}

absl::Status InTensorParallelGroups(const absl::Status& status, int tp_size) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("parallel.tp_size = ", tp_size, ", slots counted in groups of ",
                                   tp_size, " on one node: ", status.message()));
}

std::vector<int> TensorParallelUnits(const std::vector<int>& slots_per_node, int tp_size) {
  std::vector<int> out;
  for (int n : slots_per_node) out.push_back(tp_size > 0 ? std::max(0, n) / tp_size : 0);
  return out;
}

absl::StatusOr<v1::Profile> TensorParallelProfile(const v1::Profile& profile,
                                                  const ModelSpec& model, int tp_size) {
  if (tp_size <= 1) return profile;
  RETURN_IF_ERROR(CheckTensorParallel(model, tp_size));
  if (profile.segments_size() < 3) {
    return absl::FailedPreconditionError(
        absl::StrCat("a tensor-parallel plan needs the embedding, blocks and head as segments; the "
                     "profile has ",
                     profile.segments_size()));
  }
  const double t = tp_size;
  const CommModel comm(profile);
  const int k = AllReducesPerBlock(model.kind);
  const double slowdown = profile.compute_slowdown() > 1 ? profile.compute_slowdown() : 1.0;
  const int measured_slots = std::max(2, profile.slots_per_host());
  // T - 1 busy peers of the same host, as Note [Contention] scales them.
  const double own = 1 + (slowdown - 1) * std::min(1.0, (t - 1) / (measured_slots - 1));
  v1::Profile out = profile;
  out.set_slots_per_host(std::max(1, profile.slots_per_host() / tp_size));
  const int last = out.segments_size() - 1;
  for (int i = 1; i < last; ++i) {
    v1::SegmentProfile* seg = out.mutable_segments(i);
    seg->set_param_bytes(seg->param_bytes() / t);
    seg->set_optimizer_s(seg->optimizer_s() / t);
    for (v1::SegmentCost& c : *seg->mutable_costs()) {
      const double ar = k * comm.AllReduce(c.activation_bytes(), tp_size, /*cross_host=*/false);
      c.set_forward_s(c.forward_s() * own / t + ar);
      c.set_forward_nograd_s(c.forward_nograd_s() * own / t + ar);
      c.set_recompute_s(c.recompute_s() * own / t + ar);
      c.set_backward_s(c.backward_s() * own / t + ar);
      c.set_weight_s(c.weight_s() * own / t);
    }
  }
  return out;
}

absl::StatusOr<v1::PlanSet> PlanTensorParallel(const JobSpec& spec, const v1::Profile& profile,
                                               const PlanRequest& request) {
  const int t = spec.parallel.tp_size;
  if (t <= 1) return PlanShapes(spec, profile, request);
  ASSIGN_OR_RETURN(v1::Profile unit_profile, TensorParallelProfile(profile, spec.model, t));
  PlanRequest req = request;
  req.slots_per_node = TensorParallelUnits(request.slots_per_node, t);
  int total = 0;
  for (int n : req.slots_per_node) total += n;
  if (total == 0) {
    int most = 0;
    for (int n : request.slots_per_node) most = std::max(most, n);
    return absl::ResourceExhaustedError(absl::StrCat("parallel.tp_size = ", t, " needs ", t,
                                                     " free slots on one node; the most "
                                                     "free on one node is ",
                                                     most));
  }
  absl::StatusOr<v1::PlanSet> planned =
      PlanShapes(TensorParallelGroupSpec(spec), unit_profile, req);
  if (!planned.ok()) return InTensorParallelGroups(planned.status(), t);
  v1::PlanSet set = *std::move(planned);
  for (auto* plans : {set.mutable_plans(), set.mutable_rejected()}) {
    for (v1::Plan& p : *plans) {
      p.set_tp_size(t);
      p.set_slots(p.slots() * t);
    }
  }
  set.add_notes(absl::StrCat("tensor parallel: ", t,
                             " ranks of one node per stage; stages and "
                             "replicas count tp groups (Note [Tensor-parallel plans])"));
  return set;
}

absl::StatusOr<v1::PlanSet> PlanTensorParallelSizes(const JobSpec& spec, const v1::Profile& profile,
                                                    const PlanRequest& request) {
  int most = 0;
  for (int n : request.slots_per_node) most = std::max(most, n);
  v1::PlanSet out;
  absl::Status last = absl::ResourceExhaustedError("no free slots to plan for");
  // model.init_from loads unsplit tensors (tp 1 only); resources.max_slots caps a group.
  int top = spec.model.init_from.empty() ? std::min(most, kMaxTensorParallel) : 1;
  if (spec.resources.max_slots > 0) top = std::min(top, spec.resources.max_slots);
  for (int t = 1; t <= top || t == 1; ++t) {
    if (t > 1 && !CheckTensorParallel(spec.model, t).ok()) continue;
    JobSpec fixed = spec;
    fixed.parallel.tp_size = t;
    // One time budget for all the sizes: each plan gets what the earlier ones left (at least
    // a little, so every size is tried).
    PlanRequest sized = request;
    if (request.budget_s > 0) {
      sized.budget_s = std::max(request.budget_s / 20, request.budget_s - out.planner_s());
    }
    absl::StatusOr<v1::PlanSet> set = PlanShapes(fixed, profile, sized);
    if (!set.ok()) {
      if (t == 1 && set.status().code() == absl::StatusCode::kInvalidArgument) return set.status();
      last = set.status();
      continue;
    }
    for (v1::Plan& p : *set->mutable_plans()) {
      p.set_tp_size(t);
      *out.add_plans() = std::move(p);
    }
    for (v1::Plan& p : *set->mutable_rejected()) {
      p.set_tp_size(t);
      *out.add_rejected() = std::move(p);
    }
    for (const std::string& n : set->notes()) {
      if (std::find(out.notes().begin(), out.notes().end(), n) == out.notes().end()) {
        out.add_notes(n);
      }
    }
    if (out.cost_source().empty()) out.set_cost_source(set->cost_source());
    out.set_planner_s(out.planner_s() + set->planner_s());
  }
  if (out.plans_size() == 0) return last;
  auto& plans = *out.mutable_plans();
  std::stable_sort(plans.begin(), plans.end(), [](const v1::Plan& a, const v1::Plan& b) {
    if (a.lower_bound() != b.lower_bound()) return b.lower_bound();  // simulated first
    if (a.step_s() != b.step_s()) return a.step_s() < b.step_s();
    if (a.heterogeneous() != b.heterogeneous()) return b.heterogeneous();
    if (a.tp_size() != b.tp_size()) return a.tp_size() < b.tp_size();
    return a.stages() < b.stages();
  });
  out.add_notes(
      "tp_size auto: each tensor-parallel size the model splits into, up to the most "
      "free slots on one node, ranked together");
  return out;
}

}  // namespace varuna

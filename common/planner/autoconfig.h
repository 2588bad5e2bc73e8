#pragma once

// AutoConfig (docs/autoconfig.md): every shape (stages P, replicas D, micro-batch, schedule)
// a job could run with on the given slots, simulated with a profile and ranked by step time.
// The manager plans `auto` jobs with it at launch and at every morph, varunactl plan prints
// it, and libvaruna programs call AutoConfig::GetMin(). No LibTorch.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/pipeline/schedule.h"
#include "common/pipeline/topology.h"
#include "common/spec/job_spec.h"
#include "varuna/v1/plan.pb.h"

namespace varuna {

struct PlanRequest {
  std::vector<int> slots_per_node;  // free slots of each node
  double memory_per_slot = 0;       // bytes; 0 = no limit
  // Also list the shapes that use fewer slots than the most a stage count can use.
  bool all = false;
  // Also plan heterogeneous mixes (pipelines of different depths on exactly the slots,
  // docs/autoconfig.md "Heterogeneous plans") when parallel.stages and parallel.replicas are
  // both auto. Off by default: a caller must run the plan's `topology` to use one.
  bool heterogeneous = false;
  // Each node's speed relative to a normal one, parallel to slots_per_node (1 = normal, 0.25 =
  // a straggler at a quarter; empty or 0 = 1). Compute on a node of speed s takes 1/s as long
  // (Note [Speed-aware plans] in common/planner/speed_plan.cc): P x D shapes are simulated
  // with it, and with `heterogeneous` each also gets a variant balanced for the speeds.
  std::vector<double> node_speed;
  // Note [Pruning] in common/planner/autoconfig.cc: shapes whose lower bound is within this
  // factor of the best simulated step are simulated, the rest listed with their bound. 1.5
  // ranks the near-best alternatives (varunactl plan); 1 simulates only shapes that could be
  // the best (the manager, which runs the best).
  double simulate_within = 1.5;
  // The simulation budgets: tasks simulated (deterministic; about 25-50 M a second on one
  // core) and seconds (0 = none). Past either, the shapes left are listed with their bound and
  // the best simulated so far leads (a note says so); shapes go in order of their bound, so
  // what is left is the least promising. They apply once a shape that fits was simulated.
  int64_t max_simulated_tasks = 20'000'000;
  double budget_s = 0;
  // Prune per width (slots used) instead of against the overall best: the best shape of every
  // width is simulated (a throughput curve, with `all`).
  bool best_per_width = false;
};

// What the manager asks when it launches or morphs a job (manager/nodes/placement.cc): the P x
// D shapes that could be the best, heterogeneous mixes whose estimate is within 1.5x, within
// 750 k simulated tasks (tens of ms here) and 1 s. Fill in the slots (and speeds).
PlanRequest ManagerPlanRequest();

// Ranks the shapes `spec` allows on the slots: fixed parallel.* values are kept, `auto` ones
// (0, schedule "auto") searched. Stage boundaries balance profiled compute. With
// request.heterogeneous, mixes of pipeline depths are ranked with them (Plan.heterogeneous,
// Plan.topology). With spec.parallel.pipelines, that plan only (one per schedule searched),
// simulated; rejected when it needs more slots than there are; InvalidArgument when its
// templates do not fit the model's modules (the profile's segment layers) or its samples do
// not add up to train.global_batch. Errors: no slots, fewer slots than resources.min_slots, or
// no feasible shape (the message lists why, e.g. "global_batch 30 is not divisible by any
// width that fits"). Ranking ties keep P x D shapes, then fewer stages.
absl::StatusOr<v1::PlanSet> PlanShapes(const JobSpec& spec, const v1::Profile& profile,
                                       const PlanRequest& request);

// The one rank-packing rule (the planner simulates it, the manager places by it): ranks in
// order fill the nodes with the most slots first, ties in the given order. Returns the node
// index of each of the first `world` ranks (fewer when the slots run out).
std::vector<int> PackRanks(const std::vector<int>& slots_per_node, int world);

// Simulates one shape on the slots (rank r = stage r mod P of replica r div P, packed onto
// the fullest nodes first, as the manager places them). `rejected` is set when it does not
// fit in memory.
absl::StatusOr<v1::Plan> SimulateShape(const JobSpec& spec, const v1::Profile& profile, int stages,
                                       int replicas, int micro_batch, SchedulePolicy policy,
                                       const PlanRequest& request);

// The step time of `topo` as it is placed: rank r on node node_of[r] (an index into
// request.slots_per_node and request.node_speed), each pipeline's micro-batches of
// `micro_batch` samples. The straggler ladder (manager/stragglers/straggler_controller.cc) compares
// the plan a job runs with the plans it could run.
absl::StatusOr<v1::Plan> SimulateTopology(const JobSpec& spec, const v1::Profile& profile,
                                          const Topology& topo, int micro_batch,
                                          SchedulePolicy policy, const std::vector<int>& node_of,
                                          const PlanRequest& request);

// Stage boundaries (P+1 segment indices) balancing the profiled per-micro-batch compute.
absl::StatusOr<std::vector<int>> StageBoundaries(const v1::Profile& profile, int stages);

// The Python Varuna API's AutoConfig, for programs using libvaruna directly.
class AutoConfig {
 public:
  struct Choice {
    int stages = 0;
    int replicas = 0;
    int micro_batch = 0;
    std::string schedule;
    double step_s = 0;
    std::vector<int> boundaries;
  };
  // `slots` in all, `slots_per_node` each (the last node may have fewer), `global_batch`
  // samples per step, `memory_per_slot` in bytes (0 = no limit).
  AutoConfig(int slots, int slots_per_node, int64_t global_batch, v1::Profile profile,
             double memory_per_slot = 0);
  // The fastest shape; error if none fits.
  absl::StatusOr<Choice> GetMin() const;
  // Every feasible shape, best first.
  absl::StatusOr<v1::PlanSet> Plans() const;

 private:
  int slots_, slots_per_node_;
  int64_t global_batch_;
  v1::Profile profile_;
  double memory_per_slot_;
};

}  // namespace varuna

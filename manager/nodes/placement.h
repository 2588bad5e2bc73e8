#pragma once

// Placement: how many stages and replicas a job gets from the free slots, and which node
// runs which rank. Pure functions; no RPC, no clock.

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "varuna/v1/control.pb.h"
#include "varuna/v1/plan.pb.h"

namespace varuna {

struct FreeSlots {
  std::string node;
  int free = 0;
};

struct JobPlan {
  int stages = 0;
  int replicas = 0;
  int micro_batch = 0;
  int64_t per_replica_batch = 0;
  std::string stage_to_rank_map;
  // Heterogeneous pipelines (Topology text), instead of the map; stages = the deepest,
  // replicas = how many. Empty for stages x replicas.
  std::string pipelines;
  std::vector<v1::RankPlacement> ranks;  // index = rank (a process: tp_size per position)
  // Tensor-parallel ranks per position (Note [Tensor-parallel placement] in placement.cc):
  // stages, replicas, the map and the pipelines count positions, `ranks` processes.
  int tp_size = 1;
  // AutoConfig's part (docs/autoconfig.md); empty/0 under the placement rule.
  std::string schedule;         // the job spec's, or AutoConfig's pick for "auto"
  std::vector<int> boundaries;  // stage boundaries (segment indices), P+1 of them
  double predicted_step_s = 0;
  std::string source;  // where the shape came from, for `varunactl status`
};

// Chooses (P, D) and places ranks. Rank r runs stage r mod P of replica r div P (Varuna's
// map), and ranks are packed onto nodes in order, fullest-free node first, so the stages of
// one pipeline share a node where they fit. parallel.stages: auto takes P = the most free
// slots on one node, capped at model.layers and at a divisor of the usable slots (a
// stand-in until AutoConfig). Replicas: parallel.replicas, or as many as the slots allow
// (at most resources.max_slots in all), reduced until they divide train.global_batch.
// ResourceExhausted (naming what is missing) when the job does not fit now. A job with
// parallel.pipelines gets exactly those (they need sum(stages x count) slots).
absl::StatusOr<JobPlan> PlanJob(const JobSpec& spec, std::vector<FreeSlots> nodes);

// The manager's planner. With a profile of the job's model: AutoConfig (PlanShapes) picks
// every `auto` field (stages, replicas, micro_batch, schedule) and the stage boundaries, and
// predicts the step time; fixed fields are kept. Its pick may be heterogeneous pipelines
// (docs/heterogeneous.md) when they beat every stages x replicas shape. Without one (or with one
// that does not fit the job: the source says why): PlanJob's placement rule. Same error codes as
// PlanJob (ResourceExhausted: not enough slots now).
// `speeds`: nodes measured slower than their peers (Note [Speed-aware plans] in
// common/planner/speed_plan.cc); the plan works around them.
absl::StatusOr<JobPlan> PlanWithProfile(const JobSpec& spec, std::vector<FreeSlots> nodes,
                                        const v1::Profile* profile,
                                        const std::map<std::string, double>& speeds = {});

}  // namespace varuna

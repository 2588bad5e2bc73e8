#pragma once

// How the manager asks the planner (common/planner, manager/placement.h) for a job's shape.

#include <vector>

#include "absl/status/statusor.h"
#include "manager/job.h"
#include "manager/node_table.h"
#include "manager/placement.h"
#include "manager/profile_store.h"

namespace varuna {

// The plan for `job` on `free` slots: a profile job gets one stage per slot (it measures
// links between all of them); any other job AutoConfig with its model's stored profile, or
// the placement rule without one. ResourceExhausted: not enough slots yet.
absl::StatusOr<JobPlan> PlanForJob(const Job& job, std::vector<FreeSlots> free,
                                   const ProfileStore& profiles);

// varunactl plan: the ranked shapes a job spec would get on every schedulable slot of the
// cluster, busy or not.
absl::StatusOr<v1::PlanJobResponse> PlanOnCluster(const v1::PlanJobRequest& req,
                                                  const NodeTable& nodes,
                                                  const ProfileStore& profiles);

}  // namespace varuna

#pragma once

// How the manager asks the planner (common/planner, manager/nodes/placement.h) for a job's shape.

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "manager/jobs/job.h"
#include "manager/jobs/profile_store.h"
#include "manager/nodes/node_table.h"
#include "manager/nodes/placement.h"

namespace varuna {

// The plan for `job` on `free` slots: a profile job gets one stage per slot (it measures
// links between all of them); any other job AutoConfig with its model's stored profile, or
// the placement rule without one. A job with stragglers (JobRecord.stragglers) is planned
// with their speeds, and with the built-in cost model when no profile is stored.
// ResourceExhausted: not enough slots yet.
absl::StatusOr<JobPlan> PlanForJob(const Job& job, std::vector<FreeSlots> free,
                                   const ProfileStore& profiles);

// The profile a job with stragglers is planned with: the stored one, else (once the ladder
// acted: JobRecord.stragglers is not empty) the built-in cost model. NotFound: the placement
// rule plans the job.
absl::StatusOr<v1::Profile> ProfileForStragglers(const Job& job, const ProfileStore& profiles);

// What varunactl plan needs of the manager's state, copied on the loop: every alive,
// schedulable node's slots (busy or not) and the stored profile of the spec's model.
struct PlanInputs {
  std::vector<int> slots_per_node;
  std::optional<v1::Profile> stored;
};
PlanInputs PlanInputsFor(const JobSpec& spec, const NodeTable& nodes, const ProfileStore& profiles);

// varunactl plan: the ranked shapes `spec` would get on those slots. Runs the planner (within
// its simulation budget), so the server calls it off the loop; any thread may call it.
absl::StatusOr<v1::PlanJobResponse> PlanOnCluster(const v1::PlanJobRequest& req,
                                                  const JobSpec& spec, const PlanInputs& in);

}  // namespace varuna

#pragma once

// The sharing controller: feeds the allocator (allocator.h) the cluster's jobs and slots,
// keeps its decision, and applies it (docs/operations.md "Sharing a cluster"): each job's
// JobInfo.allocated_slots (which caps every plan of it), the reason a pending job waits, and
// the resizes and evictions of running jobs as graceful morphs in place (kinds resize and
// evict), shrinks before grows. JobController::Schedule asks it (JobSharing) which pending
// jobs may start. Loop thread only.

#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/base/clock.h"
#include "manager/jobs/event_log.h"
#include "manager/jobs/job.h"
#include "manager/jobs/job_controller.h"
#include "manager/jobs/job_table.h"
#include "manager/jobs/profile_store.h"
#include "manager/nodes/node_table.h"
#include "manager/sharing/allocator.h"
#include "manager/sharing/sharing_options.h"

namespace varuna {

class SharingController final : public JobSharing {
 public:
  SharingController(SharingOptions options, Clock* clock, JobTable* jobs, NodeTable* nodes,
                    EventLog* events, ProfileStore* profiles, JobMorphing* morph);

  // JobSharing: decides again when a job or the slots changed or period_s passed, applies it,
  // and returns the pending jobs that may start now, in order.
  std::vector<std::string> StartOrder() override;

  // The newest decision and what it was made on (varunactl queue and list, /metrics).
  const AllocDecision& decision() const { return decision_; }
  int capacity() const { return capacity_; }
  const SharingOptions& options() const { return options_; }

  // Whether the allocator may resize `job` while it runs: it morphs (checkpoint.dir, morphing
  // on), its shape is not fixed (stages x replicas or pipelines), it is not a profile job.
  bool Bendable(const Job& job) const;

 private:
  std::vector<AllocJob> Inputs(const std::vector<int>& slots_per_node);
  void Apply();
  void Resize(Job& job, int target, const std::string& why, const std::string& for_whom);
  // Samples per second at each width up to the cluster's slots, from the planner's
  // simulation of the job (its stored profile, else the built-in cost model); cached by what
  // the simulation depends on (Note [Curves] in sharing_controller.cc), within a time budget
  // per decision. Empty: not simulated (yet), or the planner could not (linear is assumed).
  const std::vector<double>& CurveOf(const Job& job, const std::vector<int>& slots_per_node);
  static void SimulateCurve(const JobSpec& spec, const v1::Profile* stored,
                            const std::vector<int>& slots_per_node, std::vector<double>* out);

  const SharingOptions options_;
  const AllocPolicy policy_;
  Clock* const clock_;
  JobTable* const jobs_;
  NodeTable* const nodes_;
  EventLog* const events_;
  ProfileStore* const profiles_;
  JobMorphing* const morph_;

  AllocDecision decision_;
  int capacity_ = 0;
  std::string fingerprint_;  // what decision_ was made on
  absl::Time decided_at_ = absl::InfinitePast();
  std::map<std::string, std::vector<double>> curves_;  // by what they depend on
  absl::Duration curve_time_;                          // spent simulating curves in this decision
  bool curves_pending_ = false;                        // a curve was left for the next decision
};

}  // namespace varuna

#pragma once

// Each job's step series (varunactl metrics, the dashboard): every step once per
// generation, bounded in the state database (Note [Step series]), plus the newest record of
// each job for its stage map. Loop thread only.

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "manager/jobs/job.h"
#include "manager/state/manager_metrics.h"
#include "manager/state/state_store.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

class StepSeries {
 public:
  static constexpr int kMaxStepPoints = 4000;        // Note [Step series]
  static constexpr size_t kMaxReplyBytes = 1 << 20;  // one page of Get()

  explicit StepSeries(StateStore* store) : store_(store) {}
  void set_metrics(ManagerMetrics* m) { metrics_ = m; }

  // The steps one worker reported in a heartbeat: stored (under the worker's generation),
  // counted into the metrics once per generation, and job.gen.newest_step advanced.
  void Record(Job& job, const v1::WorkerStatus& w);
  // The stored series of job `req.job_id` after `req.after_step`: one page of at most
  // kMaxReplyBytes (and at least one record), oldest first; ask again after its last step.
  absl::StatusOr<v1::GetMetricsResponse> Get(const v1::GetMetricsRequest& req) const;
  // The newest step record of a job this manager has seen, or nullptr.
  const v1::StepRecord* Newest(const std::string& job_id) const;
  // A pruned job: its newest record goes (the store's rows go with the job).
  void Forget(const std::string& job_id) { newest_.erase(job_id); }

 private:
  StateStore* const store_;
  ManagerMetrics* metrics_ = nullptr;
  std::map<std::string, v1::StepRecord> newest_;  // by job
};

// The stage map of a job's current generation (varunactl stages, the dashboard): which rank
// holds which layers on which node, each stage's share of its pipeline's compute (from
// `profile`, else the built-in cost model), and pipeline 0's newest busy/wait times.
absl::StatusOr<v1::GetStagesResponse> DescribeStages(const Job& job, const v1::Profile* profile,
                                                     const v1::StepRecord* newest);

}  // namespace varuna

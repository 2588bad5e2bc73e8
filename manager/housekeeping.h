#pragma once

// The manager's periodic chores, which Manager::Tick runs once the components have moved: the
// state store synced every second (Note [High-rate state] in etcd_store.h), the metrics' counts
// by state refreshed every second (Note [Metrics] in housekeeping.cc), and finished jobs past
// retention pruned every 10 s (Note [Retention] in job_table.cc) with their step series,
// straggler state and metric series. Owns when each chore last ran and the metrics (optional).
// The manager's loop thread only.

#include "absl/time/time.h"
#include "common/base/clock.h"
#include "manager/jobs/job_table.h"
#include "manager/jobs/step_series.h"
#include "manager/manager_config.h"
#include "manager/nodes/node_table.h"
#include "manager/state/manager_metrics.h"
#include "manager/state/state_store.h"
#include "manager/stragglers/straggler_controller.h"

namespace varuna {

class Housekeeping {
 public:
  // Retention from `config` (max_finished_jobs, finished_job_ttl).
  Housekeeping(const ManagerConfig& config, Clock* clock, StateStore* store, const NodeTable* nodes,
               JobTable* jobs, StepSeries* steps, StragglerController* stragglers);

  // Metrics (docs/observability.md); null (the default): none.
  void set_metrics(ManagerMetrics* m) { metrics_ = m; }
  ManagerMetrics* metrics() const { return metrics_; }
  // Runs the chores that are due.
  void Tick();

 private:
  void RefreshMetrics();

  const int max_finished_jobs_;
  const absl::Duration finished_job_ttl_;
  Clock* const clock_;
  StateStore* const store_;
  const NodeTable* const nodes_;
  JobTable* const jobs_;
  StepSeries* const steps_;
  StragglerController* const stragglers_;
  ManagerMetrics* metrics_ = nullptr;
  absl::Time metrics_refreshed_ = absl::InfinitePast();
  absl::Time pruned_at_ = absl::InfinitePast();
  absl::Time synced_at_ = absl::InfinitePast();
};

}  // namespace varuna

#pragma once

// Heartbeat reconciliation: what agents say (registration, liveness, the workers they run)
// against what the manager wants. Stale or unknown workers are told to stop or are released;
// workers of current generations go to the JobController; ranks an agent stopped reporting
// are charged to their job (CheckUnreported). Loop thread only.

#include <functional>
#include <set>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "manager/jobs/job_controller.h"
#include "manager/jobs/job_table.h"
#include "manager/manager_config.h"
#include "manager/morph/morph_controller.h"
#include "manager/nodes/node_table.h"
#include "manager/state/manager_metrics.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

class HeartbeatReconciler {
 public:
  using Post = std::function<void(std::function<void()>)>;
  HeartbeatReconciler(const ManagerConfig& config, Clock* clock, JobTable* jobs, NodeTable* nodes,
                      JobController* jobs_ctl, MorphController* morph, Post post);
  void set_metrics(ManagerMetrics* m) { metrics_ = m; }

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& req);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req);

 private:
  void CheckUnreported(const NodeTable::Node& node,
                       const std::set<std::pair<std::string, int>>& reported);

  const ManagerConfig& config_;
  Clock* const clock_;
  JobTable* const jobs_;
  NodeTable* const nodes_;
  JobController* const jobs_ctl_;
  MorphController* const morph_;
  const Post post_;
  ManagerMetrics* metrics_ = nullptr;
};

}  // namespace varuna

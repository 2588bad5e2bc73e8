#include "manager/housekeeping.h"

#include <map>
#include <string>
#include <vector>

#include "glog/logging.h"

namespace varuna {

Housekeeping::Housekeeping(const ManagerConfig& config, Clock* clock, StateStore* store,
                           const NodeTable* nodes, JobTable* jobs, StepSeries* steps,
                           StragglerController* stragglers)
    : max_finished_jobs_(config.max_finished_jobs),
      finished_job_ttl_(config.finished_job_ttl),
      clock_(clock),
      store_(store),
      nodes_(nodes),
      jobs_(jobs),
      steps_(steps),
      stragglers_(stragglers) {}

void Housekeeping::Tick() {
  if (clock_->Now() - synced_at_ >= absl::Seconds(1)) {  // Note [High-rate state] (etcd_store.h)
    synced_at_ = clock_->Now();
    if (absl::Status s = store_->Sync(); !s.ok()) LOG(WARNING) << "state store: " << s;
  }
  if (metrics_ && clock_->Now() - metrics_refreshed_ >= absl::Seconds(1)) RefreshMetrics();
  if (clock_->Now() - pruned_at_ >= absl::Seconds(10)) {  // Note [Retention] in job_table.cc
    pruned_at_ = clock_->Now();
    for (const std::string& id :
         jobs_->Prune(clock_->Now(), max_finished_jobs_, finished_job_ttl_)) {
      LOG(INFO) << "job=" << id << " pruned (retention: max_finished_jobs=" << max_finished_jobs_
                << ", finished_job_ttl_s=" << absl::ToInt64Seconds(finished_job_ttl_) << ")";
      steps_->Forget(id);
      stragglers_->Forget(id);
      if (metrics_) metrics_->ForgetJob(id);
    }
  }
}

// Note [Metrics]: counts by state (nodes, jobs) are refreshed at most once a second from the
// tables, whatever changed them; everything event-like (steps, morphs, heartbeat round trips)
// is recorded where it happens.
void Housekeeping::RefreshMetrics() {
  metrics_refreshed_ = clock_->Now();
  std::vector<v1::NodeInfo> nodes;  // state and slots only: no used-slot accounting
  nodes.reserve(nodes_->all().size());
  for (const auto& [name, n] : nodes_->all()) nodes.push_back(nodes_->Describe(n, 0));
  metrics_->SetNodes(nodes);
  std::map<std::string, double> jobs;
  std::map<std::string, int> job_slots, user_slots;
  for (const auto& [id, job] : jobs_->all()) {
    const v1::JobInfo& info = job.info();
    jobs[v1::JobState_Name(info.state())] += 1;
    metrics_->AddJob(id);  // also the jobs of a recovery (Note [Series from the start])
    const int slots = Terminal(info.state())        ? 0
                      : info.allocated_slots() > 0  ? info.allocated_slots()
                      : info.state() == v1::PENDING ? 0
                                                    : info.slots();
    job_slots[id] = slots;
    if (slots > 0) user_slots[info.submitted_by()] += slots;
  }
  metrics_->SetJobs(jobs);
  metrics_->SetAllocations(job_slots, user_slots);
}

}  // namespace varuna

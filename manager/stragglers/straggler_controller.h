#pragma once

// The straggler ladder (Note [Straggler ladder] in straggler_controller.cc): what the manager
// does about a node slower than its peers. Detection is StragglerDetector's; the decision is
// the simulator's; the action is a morph (MorphController) with kind "straggler" or
// "recovered". Loop thread only.

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/base/clock.h"
#include "manager/jobs/event_log.h"
#include "manager/jobs/job.h"
#include "manager/jobs/job_controller.h"
#include "manager/jobs/job_table.h"
#include "manager/jobs/profile_store.h"
#include "manager/nodes/agent_client.h"
#include "manager/nodes/node_table.h"
#include "manager/state/manager_metrics.h"
#include "manager/stragglers/straggler_detector.h"
#include "manager/stragglers/straggler_options.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

class StragglerController {
 public:
  using Post = std::function<void(std::function<void()>)>;
  StragglerController(StragglerOptions options, Clock* clock, JobTable* jobs, NodeTable* nodes,
                      AgentClientPool* agents, Post post, EventLog* events, ProfileStore* profiles,
                      JobMorphing* morph);
  void set_metrics(ManagerMetrics* m) { metrics_ = m; }

  // The step records a worker of `job` reported (each carries every rank's busy and wait).
  void OnSteps(Job& job, const v1::WorkerStatus& w);
  // Each running job's ladder, and the probes of the nodes jobs evicted.
  void Tick();
  // varunactl nodes: each node's speed in the jobs it runs (the slowest view) and its state.
  void Annotate(std::vector<v1::NodeInfo>* nodes) const;
  // The stage map: every rank's newest busy and wait, its node's speed, whether it is slow.
  void Annotate(const std::string& job_id, v1::GetStagesResponse* stages) const;
  // A job that ended or was pruned.
  void Forget(const std::string& job_id);

  // The job's straggler settings: its spec's, the manager's defaults where unset.
  StragglerSpec Settings(const Job& job) const;

 private:
  struct JobState {
    int generation = -1;
    std::unique_ptr<StragglerDetector> detector;
    std::map<std::string, double> speeds;  // the detector's, when its window was full
    int64_t decided_at_step = 0;           // the ladder ran at this step
    std::set<std::string> reported;        // slow nodes an event named (once per episode)
    std::set<std::string> links;           // slow links reported this generation
    std::vector<double> step_times;        // recent steps' wall time, seconds
    std::set<std::string> probing;         // evicted nodes with a probe in flight
    // Nodes the job plans around, measured at recovered_above since (Recover waits
    // probation_s: with less work a node can look fast while its cause persists).
    std::map<std::string, absl::Time> fast_since;
    std::string no_plan;  // why the ladder cannot plan (reported once)
  };

  JobState& StateFor(const Job& job);
  // The costs the job is (or would be) planned with: ProfileForStragglers, else built-in.
  absl::StatusOr<v1::Profile> CostsOf(const Job& job) const;
  void Decide(Job& job, JobState& st);
  // Once a window: compare tolerating, rebalancing and evicting; act on the best.
  void Ladder(Job& job, JobState& st, const std::set<std::string>& slow);
  absl::StatusOr<double> PredictRunning(const Job& job, const v1::Profile& profile,
                                        const std::map<std::string, double>& speeds) const;
  // A node the job planned around (speeds) that is fast again.
  void Recover(Job& job, JobState& st, std::string node, double speed);
  void ProbeEvicted(Job& job, JobState& st);
  void OnProbe(const std::string& job_id, const std::string& node,
               absl::StatusOr<v1::ProbeResponse> r);
  double Baseline(const std::string& node) const;
  // The job's typical morph cost, seconds (its records' total, else a default).
  double MorphCost(const Job& job) const;
  void Trigger(Job& job, const std::string& kind, const std::string& reason,
               std::set<std::string> leaving, const std::map<std::string, double>& speeds);

  const StragglerOptions config_;
  Clock* const clock_;
  JobTable* const jobs_;
  NodeTable* const nodes_;
  AgentClientPool* const agents_;
  const Post post_;
  EventLog* const events_;
  ProfileStore* const profiles_;
  JobMorphing* const morph_;
  ManagerMetrics* metrics_ = nullptr;
  std::map<std::string, JobState> jobs_state_;
};

}  // namespace varuna

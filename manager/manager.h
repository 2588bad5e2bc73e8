#pragma once

// The manager: its components wired in one place. Each owns one thing and is tested on its
// own (tests/manager/):
//   NodeTable            agents and their liveness (ALIVE -> SUSPECT -> DEAD, draining)
//   JobTable             jobs, their persistence, slot accounting
//   JobController        a job's life: submit, admission, launch, stop, exits, terminal states
//   MorphController      the morph state machine and growth
//   HeartbeatReconciler  what agents report against what the manager wants
//   EventLog, StepSeries, ProfileStore   events, step series + stage map, stored profiles
// Every reaction of one component to another is wired here (the constructor, and NodeEvents
// in manager.cc), so this is where to look for "what happens when". The public methods
// are what the gRPC and HTTP services call; all run on the manager's loop thread.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "manager/jobs/event_log.h"
#include "manager/jobs/job_controller.h"
#include "manager/jobs/job_table.h"
#include "manager/jobs/planning.h"
#include "manager/jobs/profile_store.h"
#include "manager/jobs/step_series.h"
#include "manager/manager_config.h"
#include "manager/morph/morph_controller.h"
#include "manager/nodes/agent_client.h"
#include "manager/nodes/node_table.h"
#include "manager/reconciler.h"
#include "manager/sources/slurm_source.h"
#include "manager/state/manager_metrics.h"
#include "manager/state/state_store.h"
#include "manager/stragglers/straggler_controller.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

class Manager {
 public:
  using Post = std::function<void(std::function<void()>)>;
  Manager(ManagerConfig config, Clock* clock, StateStore* store, AgentClientPool* agents,
          Post post);
  ~Manager();

  // Loads nodes, jobs, profiles and events from the store; resumes what was in flight.
  absl::Status Recover();
  // Node timeouts, job and morph timers, machine_list reload, scheduling, growth, metrics.
  void Tick();
  // Metrics (docs/observability.md): updated in the transitions from here on. Optional.
  void set_metrics(ManagerMetrics* m);
  // With config.slurm set: Slurm as a source of machines (manager/sources/slurm_source.h), its
  // commands run through `commands` on `off_loop` (a thread that may block). Before Recover.
  void StartSlurm(SlurmCommands* commands, Post off_loop);
  const ManagerConfig& config() const { return config_; }

  // AgentRegistry.
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& req);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req);

  // JobApi.
  // `spec` from JobController::Admit(req), which the server runs off the loop.
  absl::StatusOr<v1::JobInfo> Submit(const v1::SubmitRequest& req, JobSpec spec,
                                     const std::string& user = "", const std::string& run_as = "");
  std::vector<v1::JobInfo> ListJobs() const;
  // One page (Note [Pages] in manager.cc); InvalidArgument for a token that is no job's seq.
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& req) const;
  absl::StatusOr<v1::JobInfo> GetJob(const std::string& id) const;
  absl::StatusOr<v1::JobInfo> Cancel(const std::string& id, const std::string& user = "");
  // The log proxy: fetches a rank's log from its node's agent.
  void GetLogs(const v1::GetLogsRequest& req,
               std::function<void(absl::StatusOr<v1::GetLogsResponse>)> done);
  std::vector<v1::NodeInfo> ListNodes() const;
  // The machine sources' state (Slurm's counts and last error), for varunactl nodes.
  std::vector<v1::MachineSource> ListSources() const;
  absl::StatusOr<v1::NodeInfo> Drain(const std::string& node, bool undo);
  // A preemption notice for `node` (varunactl preempt, or the node's own agent).
  absl::StatusOr<v1::NodeInfo> Preempt(const std::string& node, const v1::PreemptionNotice& n);
  v1::ListEventsResponse ListEvents(const v1::ListEventsRequest& req) const;
  absl::StatusOr<v1::GetMetricsResponse> GetMetrics(const v1::GetMetricsRequest& req) const;
  // What varunactl plan needs (slots, stored profile); the planning runs off the loop
  // (PlanOnCluster in planning.h).
  PlanInputs PlanInputsFor(const JobSpec& spec) const;
  v1::GetProfileResponse GetProfile(const v1::GetProfileRequest& req) const;
  // The stage map of a job's current generation (varunactl stages).
  absl::StatusOr<v1::GetStagesResponse> GetStages(const std::string& id) const;

 private:
  // What a node's change means for jobs: the NodeTable's listener (manager.cc).
  class NodeEvents;
  // The Slurm source's view of the tables and its hands on them (manager.cc).
  class SlurmHost;
  v1::NodeInfo Describe(const NodeTable::Node& n) const;
  void RefreshMetrics();

  const ManagerConfig config_;
  Clock* const clock_;
  StateStore* const store_;
  AgentClientPool* const agents_;
  const Post post_;
  std::unique_ptr<NodeEvents> node_events_;
  NodeTable nodes_;
  JobTable jobs_;
  EventLog events_;
  StepSeries steps_;
  ProfileStore profiles_;
  JobController job_controller_;
  MorphController morph_controller_;
  StragglerController straggler_controller_;
  HeartbeatReconciler reconciler_;
  std::unique_ptr<SlurmHost> slurm_host_;
  std::unique_ptr<SlurmSource> slurm_;
  ManagerMetrics* metrics_ = nullptr;
  absl::Time metrics_refreshed_ = absl::InfinitePast();
  absl::Time pruned_at_ = absl::InfinitePast();
  absl::Time synced_at_ = absl::InfinitePast();
};

}  // namespace varuna

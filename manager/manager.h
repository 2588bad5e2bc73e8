#pragma once

// The manager: its components wired in one place. Each owns one thing and is tested on its
// own (tests/manager/):
//   NodeTable            agents and their liveness (ALIVE -> SUSPECT -> DEAD, draining)
//   JobTable             jobs, their persistence, slot accounting
//   JobController        a job's life: submit, launch, stop, exits, terminal states
//   MorphController      the morph state machine and growth
//   HeartbeatReconciler  what agents report against what the manager wants
//   EventLog, StepSeries, ProfileStore   events, step series + stage map, stored profiles
//   Housekeeping         the periodic chores: store sync, metrics, retention
// Every reaction of one component to another is wired here (the constructor, and NodeEvents
// in manager.cc), so this is where to look for "what happens when". The agents' registry
// calls come here; what the JobApi and the HTTP API call is ManagerApi's
// (manager/api/manager_api.h), over parts(). All run on the manager's loop thread.

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "manager/housekeeping.h"
#include "manager/jobs/event_log.h"
#include "manager/jobs/job_controller.h"
#include "manager/jobs/job_table.h"
#include "manager/jobs/profile_store.h"
#include "manager/jobs/step_series.h"
#include "manager/manager_config.h"
#include "manager/morph/morph_controller.h"
#include "manager/nodes/agent_client.h"
#include "manager/nodes/node_table.h"
#include "manager/reconciler.h"
#include "manager/sharing/sharing_controller.h"
#include "manager/sources/slurm_source.h"
#include "manager/state/manager_metrics.h"
#include "manager/state/state_store.h"
#include "manager/stragglers/straggler_controller.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

class Manager {
 public:
  using Post = std::function<void(std::function<void()>)>;
  // The components the services' facade (ManagerApi) reads and asks, on the loop thread; each
  // lives as long as the Manager. `slurm` is null without a Slurm source (StartSlurm),
  // `metrics` without metrics (set_metrics).
  struct Parts {
    NodeTable* nodes;
    JobTable* jobs;
    EventLog* events;
    StepSeries* steps;
    ProfileStore* profiles;
    JobController* job_controller;
    const StragglerController* stragglers;
    const SlurmSource* slurm;
    ManagerMetrics* metrics;
    const SharingController* sharing;  // null without a `sharing:` block
  };

  Manager(ManagerConfig config, Clock* clock, StateStore* store, AgentClientPool* agents,
          Post post);
  ~Manager();

  // Loads nodes, jobs, profiles and events from the store; resumes what was in flight.
  absl::Status Recover();
  // Node timeouts, job and morph timers, machine_list reload, scheduling, growth, then the
  // housekeeping (store sync, metrics, retention).
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

  Parts parts();

 private:
  // What a node's change means for jobs: the NodeTable's listener (manager.cc).
  class NodeEvents;
  // The Slurm source, with its view of the tables and its hands on them (manager.cc).
  class Slurm;

  const ManagerConfig config_;
  Clock* const clock_;
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
  Housekeeping housekeeping_;
  // What the config may leave out: a Slurm source (StartSlurm), the allocator (`sharing:`).
  struct Optional {
    std::unique_ptr<Slurm> slurm;
    std::unique_ptr<SharingController> sharing;
  } optional_;
};

}  // namespace varuna

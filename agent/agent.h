#pragma once

// The agent's state machine: the workers of this machine. Runs on the agent's event loop
// thread (every method), which the gRPC glue and the heartbeat thread post to.

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/agent_metrics.h"
#include "agent/heartbeat_report.h"
#include "agent/process_launcher.h"
#include "agent/standby_pool.h"
#include "common/base/clock.h"
#include "common/launch/tenant_uid.h"
#include "common/net/rpc.h"
#include "varuna/v1/control.pb.h"
#include "varuna/v1/worker.pb.h"

namespace varuna {

struct AgentConfig {
  std::string name;     // node name; defaults to the hostname
  std::string manager;  // host:port of varuna-manager
  std::string listen = "0.0.0.0:0";
  // Prometheus /metrics and /healthz (docs/observability.md); "" = off.
  std::string http_listen;
  bool http_allow_remote = false;  // serve it beyond loopback (plain HTTP)
  std::string advertise_host;      // host the manager and peers reach us at (wildcard listen)
  int slots = 1;
  std::string work_dir = "/var/lib/varuna-agent";
  std::string worker_binary;  // default: varuna-worker next to varuna-agent
  // Note [Worker user] in agent/launch_request.h: who the workers run as when the agent is root.
  std::string worker_user = "varuna";
  std::vector<std::string> allowed_worker_users;  // a token's USER must be listed here
  // A tenant's uid (Note [Tenant uids] in common/launch/tenant_uid.cc) must be in this range
  // ("none": no tenant uids); it matches the manager's tenant_uids default.
  std::string allowed_worker_uids = kDefaultTenantUids;
  bool allow_root_workers = false;  // also: workers without a token user or uid run as the agent
  // A finished job's directory under work_dir/jobs (its specs, logs, progress files) is removed
  // this long after its last worker exited (Note [Job directories] in agent.cc); 0 = never.
  absl::Duration job_dir_retention = absl::Hours(24 * 7);
  std::map<std::string, std::string> labels;
  absl::Duration heartbeat_period = absl::Seconds(1);
  absl::Duration stop_grace = absl::Seconds(10);  // SIGTERM -> SIGKILL
  absl::Duration rpc_timeout = absl::Seconds(5);
  // Security (docs/operations.md "Security"): with TLS, only a peer whose certificate (from
  // the cluster CA) has this common name may call the agent.
  TlsFiles tls;
  std::string tls_manager_name = "varuna-manager";
  bool allow_insecure = false;
  // Preemption notices (docs/morphing.md "Notices"): a file whose appearance means this
  // machine is going away (its first line may hold the seconds left), and/or a cloud
  // metadata endpoint polled every notice_poll_period (Azure Scheduled Events, GCE
  // instance/preempted, AWS spot/instance-action).
  std::string preemption_notice_file;
  std::string preemption_notice_url;
  // This VM's name in Azure's Scheduled Events (Resources); the node name and the hostname
  // are also tried (Note [Whose notice] in preemption.cc).
  std::string cloud_vm_name;
  absl::Duration notice_poll_period = absl::Seconds(1);
  // Warm standby workers (Note [Standby workers] in worker/runtime/standby.cc): processes started
  // ahead, LibTorch loaded, that a launch takes instead of starting one. -1: one per free
  // slot; 0: none (a machine short of memory, tests that do not test them).
  int standby_workers = -1;
  // The speed probe at start (Note [Speed probe] in probe.cc): its duration; 0 = none.
  absl::Duration startup_probe = absl::Milliseconds(500);

  absl::Status Validate() const;
};

// Reads an agent config file (YAML; keys as the fields above, durations in seconds as
// *_s). Unknown keys are errors.
absl::Status LoadAgentConfigFile(const std::string& path, AgentConfig* config);

// The environment every worker starts from: the agent's own, minus what a launch sets.
std::map<std::string, std::string> AgentEnvironment();
// Whether the process is stopped (Note [Frozen workers] in agent/in_place.cc).
bool ProcessStopped(int pid);

// Removes each directory under `jobs_dir` not named in `keep` (jobs with a running worker) whose
// newest change (the directory, the files directly in it) is `retention` or more before `now`
// (Note [Job directories] in agent.cc); returns the ids of those that went. 0 retention: none.
std::vector<std::string> SweepJobDirs(const std::string& jobs_dir, absl::Duration retention,
                                      absl::Time now, const std::set<std::string>& keep);

class Agent {
 public:
  Agent(AgentConfig config, Clock* clock, ProcessLauncher* launcher);

  absl::StatusOr<v1::LaunchResponse> Launch(const v1::LaunchRequest& req);
  v1::StopResponse Stop(const v1::StopRequest& req);
  v1::CheckpointResponse Checkpoint(const v1::CheckpointRequest& req);
  absl::StatusOr<v1::FetchLogsResponse> FetchLogs(const v1::FetchLogsRequest& req) const;

  // Reaps, then describes every worker (running and exited-but-unreleased), with what the
  // report adds (the notice, the probe score, profiles and step records within the budget).
  v1::HeartbeatRequest BuildHeartbeat();
  // Called only when the manager answered: the step records that heartbeat carried are
  // acknowledged (and not sent again), then the stops and releases it asks for are done.
  void OnHeartbeatResponse(const v1::HeartbeatResponse& resp);
  // What heartbeats carry besides the workers' rows: the preemption notice (SetNotice), the
  // probe score, and whether one is due at once (TakeUrgent: after a worker exited, parked or
  // froze, or a first notice).
  HeartbeatReport& report() { return report_; }
  // Metrics (docs/observability.md), updated in the transitions from here on. Optional.
  void set_metrics(AgentMetrics* m) { metrics_ = m; }
  // Reaps exited workers and escalates overdue stops to SIGKILL.
  void Tick();
  // SIGTERM to every running worker (agent shutdown). Returns how many were signalled.
  int StopAll();
  // SIGKILL to every running worker (end of the agent's shutdown grace).
  void KillAll();
  int running_workers() const;

  const AgentConfig& config() const { return config_; }
  // The address the manager and peers reach this agent at ("host:port"); its host is the
  // workers' VARUNA_NODE_ADDR, which they bind their gloo transport to.
  void set_address(std::string address);

 private:
  struct Worker {
    std::string job_id;
    int generation = 0;
    int rank = 0;
    int pid = 0;
    bool running = false;
    int exit_code = 0;
    int signal = 0;
    std::string error;
    std::string profile_json;  // a profile job's result (rank 0), sent on every heartbeat
    std::string log_path;
    std::string progress_path;
    uid_t uid = 0;  // the worker's user: its files are read only if it owns them
    absl::Time kill_at = absl::InfiniteFuture();  // set once a stop was requested
    // The worker's events (Note [Worker protocol] in common/launch/worker_protocol.cc), read
    // incrementally from this offset.
    int64_t progress_offset = 0;
    int64_t bad_lines = 0;         // progress lines the codec refused (the first is logged)
    v1::StepMetrics last;          // the newest step line
    HeartbeatReport::Steps steps;  // step records for the manager, until acknowledged
    int64_t resumed_from = -1;
    double ready_at = 0;
    double exited_at = 0;
    int64_t saved_step = 0;
    int64_t committed_step = 0;
    int64_t pending_step = 0;  // Note [Rolled rescue] in common/checkpoint/checkpoint_store.cc
    v1::InPlaceJoin in_place;  // from its ready event after a morph in place
    std::string parked;        // its newest parked event's reason (cleared on adoption)
    bool frozen = false;       // stopped when last looked at (Note [Frozen workers])
  };
  using Key = std::pair<std::string, int>;  // job, rank

  void Reap();
  absl::Status MakeGenerationDir(const std::string& job_dir, const std::string& gen_dir,
                                 const std::string& spec_path, const std::string& yaml,
                                 const std::string& run_as);
  // Exited workers of jobs whose directory SweepJobDirs removed are reported no more.
  void ForgetJobsWithoutDirs();
  // Sends the running workers `req.adopt()` names a ReconfigureCommand and files them under
  // their new rank and generation; returns the new ranks adopted (Note [Morph in place]).
  std::set<int> Adopt(const v1::LaunchRequest& req, int master_port);
  std::string JobDir(const std::string& job_id) const;
  void ReadProgress(Worker& w);
  void CheckNoticeFile();
  int SignalWorkers(const std::string& job_id, int max_generation, int sig, bool arm_kill,
                    absl::Duration grace);
  // Sends `command` over the worker's control FIFO, or `fallback_signal` when it does not
  // arrive. Returns "command", "signal" or "" (neither reached the worker).
  const char* CommandWorker(const Worker& w, v1::AgentCommand command, int fallback_signal);

  const AgentConfig config_;
  std::string address_;
  Clock* const clock_;
  ProcessLauncher* const launcher_;
  std::map<Key, Worker> workers_;
  std::map<std::string, int> newest_generation_;  // per job
  absl::Time last_sweep_ = absl::InfinitePast();  // of job directories
  int64_t manager_term_ = 0;                      // of the manager that answered the last heartbeat
  std::map<std::string, int> master_port_;        // "job/gen" -> port chosen here
  HeartbeatReport report_;
  AgentMetrics* metrics_ = nullptr;
  std::set<Key> ever_started_;  // (job, rank) started here: a later start is a restart
  StandbyPool standbys_;        // Note [Standby workers]
  void UpdateWorkerMetrics();
};

}  // namespace varuna

#pragma once

// The manager's state machines: the node table (manager/node_table.h: ALIVE -> SUSPECT ->
// DEAD by missed heartbeats; DRAINING by request, notice or machine_list) and the job
// controller here (PENDING ->
// STARTING -> RUNNING -> SUCCEEDED | FAILED(reason), CANCELLING -> CANCELLED). Every method
// runs on the manager's loop thread; answers that need an agent come back through `post`.
// docs/architecture.md "Control plane" draws both machines.

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/net/rpc.h"
#include "common/spec/job_spec.h"
#include "manager/agent_client.h"
#include "manager/manager_metrics.h"
#include "manager/node_table.h"
#include "manager/placement.h"
#include "manager/state_store.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

struct ManagerConfig {
  std::string listen = "127.0.0.1:7070";
  // Dashboard, JSON API and Prometheus /metrics (docs/observability.md); "" = off.
  std::string http_listen;
  bool http_allow_remote = false;  // serve it beyond loopback (plain HTTP)
  std::string state_dir;
  absl::Duration heartbeat_period = absl::Seconds(1);  // what agents are told to use
  int suspect_after_missed = 3;                        // heartbeats missed before SUSPECT
  int dead_after_missed = 10;                          // heartbeats missed before DEAD
  absl::Duration stop_grace = absl::Seconds(10);       // SIGTERM -> SIGKILL on cancel/failure
  absl::Duration start_timeout = absl::Seconds(120);   // STARTING longer than this fails
  absl::Duration agent_rpc_timeout = absl::Seconds(5);
  std::string machine_list;     // optional: only nodes (name or host) listed here get work
  bool check_job_files = true;  // data.path etc. must be readable by the manager at submit
  // What a peer can make the manager keep (Note [Peer limits] in node_table.cc).
  int max_nodes = 10000;
  int max_slots_per_node = 1024;
  absl::Duration forget_dead_after = absl::Hours(24);  // DEAD this long and idle: forgotten
  // Security (docs/operations.md "Security"): mutual TLS with agents, bearer tokens for
  // varunactl. Empty = plaintext / no tokens, allowed only on loopback or with allow_insecure.
  TlsFiles tls;
  std::string tokens_file;  // lines "NAME TOKEN"
  bool allow_insecure = false;
  // Morphing (docs/morphing.md): how long workers get to save before the manager stops
  // waiting, how long after the last trigger the re-plan waits for more (coalescing), how
  // long a joined node must stay before a job grows onto it, and the restart budget.
  absl::Duration morph_save_timeout = absl::Seconds(60);
  absl::Duration morph_coalesce = absl::Seconds(1);
  absl::Duration scale_up_delay = absl::Seconds(10);
  int max_morphs = 20;
  absl::Duration morph_window = absl::Hours(1);

  absl::Status Validate() const;
  absl::Duration suspect_after() const { return heartbeat_period * suspect_after_missed; }
  absl::Duration dead_after() const { return heartbeat_period * dead_after_missed; }
};

// Reads a manager config file (YAML; durations as *_s in seconds). Unknown keys are errors.
absl::Status LoadManagerConfigFile(const std::string& path, ManagerConfig* config);

// The job controller: jobs, their generations and morphs, on top of the node table.
class Manager : private NodeTable::Listener {
 public:
  using Post = std::function<void(std::function<void()>)>;
  Manager(ManagerConfig config, Clock* clock, StateStore* store, AgentClientPool* agents,
          Post post);

  // Loads jobs and nodes from the store; resumes launches and stops that were in flight.
  absl::Status Recover();

  // AgentRegistry.
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& req);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req);

  // JobApi.
  // `user` is the token's name ("" without tokens), recorded on the job. Submit never
  // touches the filesystem: the server checks files off the loop first.
  absl::StatusOr<v1::JobInfo> Submit(const v1::SubmitRequest& req, const std::string& user = "");
  std::vector<v1::JobInfo> ListJobs() const;
  absl::StatusOr<v1::JobInfo> GetJob(const std::string& id) const;
  absl::StatusOr<v1::JobInfo> Cancel(const std::string& id, const std::string& user = "");
  void GetLogs(const v1::GetLogsRequest& req,
               std::function<void(absl::StatusOr<v1::GetLogsResponse>)> done);
  std::vector<v1::NodeInfo> ListNodes() const;
  absl::StatusOr<v1::NodeInfo> Drain(const std::string& node, bool undo);
  // A preemption notice for `node` (varunactl preempt, or the node's own agent).
  absl::StatusOr<v1::NodeInfo> Preempt(const std::string& node, const v1::PreemptionNotice& n);
  v1::ListEventsResponse ListEvents(const v1::ListEventsRequest& req) const;
  absl::StatusOr<v1::GetMetricsResponse> GetMetrics(const v1::GetMetricsRequest& req) const;
  // AutoConfig for a job spec on the schedulable slots now (varunactl plan).
  absl::StatusOr<v1::PlanJobResponse> PlanJob(const v1::PlanJobRequest& req) const;
  v1::GetProfileResponse GetProfile(const v1::GetProfileRequest& req) const;

  // Node timeouts, launch timeouts, machine_list reload, scheduling, progress flush.
  void Tick();

  const ManagerConfig& config() const { return config_; }

  // Metrics (docs/observability.md): updated in the transitions from here on. Optional.
  void set_metrics(ManagerMetrics* m) { metrics_ = m; }
  // The stage map of a job's current generation: which rank holds which layers on which node,
  // each stage's share of its pipeline's compute, and pipeline 0's newest busy/wait times.
  absl::StatusOr<v1::GetStagesResponse> GetStages(const std::string& id) const;

 private:
  using Node = NodeTable::Node;

  // Everything that belongs to one launch of a job; NewGeneration() resets it.
  struct Generation {
    std::set<std::string> launch_pending;  // nodes whose Launch has not been acked
    absl::Time starting_since;
    absl::Time running_since;  // since RUNNING, or since this manager recovered the job
    // Note [Failure attribution]: without morphing, a rank's non-zero exit is held for two
    // heartbeat periods before the job fails, so that when a whole node died (and its peers'
    // collectives failed first) the reason names the lost node rather than a healthy rank.
    std::string pending_failure;
    // A rank its node's agent stopped reporting (CheckUnreported); preferred as the cause.
    std::optional<std::pair<std::string, int>> unreported;  // (node, rank)
    absl::Time fail_at = absl::InfiniteFuture();
    // The step after which a rank reported stopping on request (SIGUSR1); 0 if none did.
    int64_t stopped_after = 0;
    std::set<int> ready;        // ranks that reported their rendezvous done
    int64_t resumed_from = -1;  // the step they resumed after (-1 until known)
    int64_t newest_step = 0;    // newest step this generation reported
    std::string worker_error;   // the first error line a worker wrote
    double last_ready_at = 0;   // the workers' clock: when the last rank reported ready
    double first_step_at = 0;   // ... and when the first step after resumed_from ended
    // A profile job's report was handled (stored, or refused with worker_error set).
    bool profile_handled = false;
    bool profile_stored = false;
  };
  struct Job {
    v1::JobRecord rec;
    JobSpec spec;
    Generation gen;
    absl::Time last_stop_sent;
    absl::Time cancelling_since;  // since CANCELLING, or since this manager recovered the job
    absl::Time last_trigger = absl::InfinitePast();  // the newest cause merged into a morph
    int cause_priority = 0;                          // of the morph's reason (Cause)
    bool progress_dirty = false;
    v1::JobInfo& info() { return *rec.mutable_info(); }
    const v1::JobInfo& info() const { return rec.info(); }
    v1::MorphState& morph() { return *rec.mutable_morph(); }
    bool morphing() const { return rec.morph().phase() != v1::MorphState::NONE; }
  };
  // Why a running job must change (docs/morphing.md "Triggers"). Higher priority causes
  // replace the reason of a morph in progress (a lost node explains its peers' exits).
  struct Cause {
    std::string reason;
    bool graceful = false;                         // the workers can checkpoint at a step boundary
    std::set<std::string> leaving;                 // nodes the next plan must not use
    absl::Duration detect = absl::ZeroDuration();  // from the event to the manager knowing
    int priority = 1;  // 1 a rank saved after a peer failed, 2 a worker failed, 3 a node event
  };

  // Transitions: each checks the from-state, logs, persists, then acts.
  void StartJob(Job& job, const JobPlan& plan);
  // PlanWithProfile with the stored profile of the job's model (if any).
  absl::StatusOr<JobPlan> Plan(const Job& job, std::vector<FreeSlots> free) const;
  const v1::Profile* FindProfile(const JobSpec& spec) const;
  static void SetPlan(v1::JobInfo& info, const JobPlan& plan);
  // A profile job's rank 0 reported its profile: validate and store it.
  void StoreProfile(Job& job, const std::string& json);
  void MarkRunning(Job& job);
  void Succeed(Job& job);
  void Fail(Job& job, const std::string& reason);
  void MarkCancelled(Job& job, const std::string& reason);

  void Schedule();
  void SendLaunches(Job& job);
  void OnLaunchDone(const std::string& job_id, int generation, const std::string& node,
                    absl::StatusOr<v1::LaunchResponse> r);
  void SendStops(Job& job);
  void RecordExit(Job& job, int rank, int exit_code, int signal, const std::string& node);
  void CheckUnreported(const Node& node, const std::set<std::pair<std::string, int>>& reported);
  void CheckAllExited(Job& job);
  // NodeTable::Listener.
  void OnNodeLost(const Node& node, absl::Duration silent) override;
  void OnNodeLeaving(const std::string& node, const std::string& why) override;
  void OnNodeJoined(const std::string& node, const std::string& how) override;
  void OnNodeEvent(const std::string& kind, const std::string& node,
                   const std::string& message) override;
  void OnSlotsChanged() override;
  void SettleFailure(Job& job);
  std::string RanksOn(const Job& job, const std::string& node) const;
  static bool PlacedOn(const Job& job, const std::string& node, int rank);

  // The morph (manager/morph.cc): Trigger -> BeginMorph (SAVING) -> STOPPING -> PLANNING ->
  // Relaunch (LAUNCHING) -> RUNNING (RESUMING) -> FinishMorph. AdvanceMorph moves a job
  // along when what the phase waits for has happened (or its timer ran out).
  bool MorphAllowed(const Job& job) const;
  void Trigger(Job& job, const Cause& cause);
  void BeginMorph(Job& job, const Cause& cause);
  void SendSaveRequests(Job& job, bool abort_step);
  void OnSaveRequestFailed(const std::string& job_id, int generation, const std::string& node,
                           const absl::Status& status);
  void AdvanceMorph(Job& job);
  void SetPhase(Job& job, v1::MorphState::Phase phase);
  void Relaunch(Job& job, const JobPlan& plan);
  void FinishMorph(Job& job);
  bool AllRanksGone(const Job& job) const;
  bool FinishedTraining(const Job& job) const;
  std::vector<int> UnsavedStages(const Job& job) const;
  void NoteWorkerReport(Job& job, const v1::WorkerStatus& w);
  void RecordSteps(Job& job, const v1::WorkerStatus& w);
  void OnNodeLeaving(const std::string& node, const std::string& why, absl::Duration detect,
                     bool graceful);
  void NoteJoined(const std::string& node);
  void CheckGrowth();
  std::vector<FreeSlots> FreeSlotsFor(const Job* job, const std::set<std::string>& exclude) const;
  void NewGeneration(Job& job);
  void Emit(const std::string& kind, const std::string& job_id, const std::string& node,
            const std::string& message);
  double UnixNow() const;

  v1::LaunchRequest MakeLaunch(const Job& job, const std::string& node) const;
  std::map<std::string, int> UsedSlots() const;
  v1::NodeInfo Describe(const Node& n) const;
  void Persist(Job& job);
  std::string Now() const;
  static bool Active(v1::JobState s);
  static bool Reserving(const Job& job);
  static bool Terminal(v1::JobState s);

  const ManagerConfig config_;
  Clock* const clock_;
  StateStore* const store_;
  AgentClientPool* const agents_;
  const Post post_;
  NodeTable nodes_;
  std::map<std::string, Job> jobs_;  // by id
  // Stored profiles by "<model key>\n<precision>" (docs/autoconfig.md).
  std::map<std::string, v1::Profile> profiles_;
  std::vector<std::string> order_;  // ids in submission order
  std::map<std::string, std::string> by_request_;
  int64_t next_seq_ = 1;
  absl::Time last_flush_;
  // Growth: when a node joined, jobs may grow onto it after scale_up_delay.
  absl::Time grow_check_at_ = absl::InfiniteFuture();
  std::set<std::string> joined_;
  // Events (varunactl events): the newest kMaxEvents, also in the state database.
  std::deque<v1::Event> events_;
  int64_t next_event_seq_ = 1;
  ManagerMetrics* metrics_ = nullptr;
  absl::Time metrics_refreshed_ = absl::InfinitePast();
  std::map<std::string, v1::StepRecord> newest_step_;  // by job: for the stage map
  void RefreshMetrics();
};

}  // namespace varuna

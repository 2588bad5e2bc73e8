#pragma once

// The job controller: a job's life from submit to its terminal state (PENDING -> STARTING ->
// RUNNING -> SUCCEEDED | FAILED(reason), CANCELLING -> CANCELLED; RECONFIGURING belongs to
// the MorphController). Placement, launch, stop, exit attribution and the job timers; what a
// submission may ask for is JobAdmission's (job_admission.h). Every method runs on the
// manager's loop thread; answers that need an agent come back through `post`.
// docs/architecture.md "Control plane" draws the machine.

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/spec/job_spec.h"
#include "manager/jobs/event_log.h"
#include "manager/jobs/job.h"
#include "manager/jobs/job_admission.h"
#include "manager/jobs/job_options.h"
#include "manager/jobs/job_table.h"
#include "manager/jobs/profile_store.h"
#include "manager/jobs/step_series.h"
#include "manager/nodes/agent_client.h"
#include "manager/nodes/node_table.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

// What the job controller needs of morphing: the narrow interface jobs/ declares and
// morph/MorphController implements (Manager wires them), so that jobs/ never includes morph/.
class JobMorphing {
 public:
  virtual ~JobMorphing() = default;
  // Whether the job can morph at all: morphing on, a checkpoint.dir, not a profile job.
  virtual bool Allowed(const Job& job) const = 0;
  // Something happened that the job must survive: begin or join a morph, or fail the job.
  virtual void Trigger(Job& job, const Cause& cause) = 0;
  // Moves the job's morph along; Tick also runs its timers.
  virtual void Advance(Job& job) = 0;
  virtual void Tick(Job& job) = 0;
  virtual void SetPhase(Job& job, v1::MorphState::Phase phase) = 0;
  // Asks the job's live nodes to have their workers save and exit (or, with `probe`, only
  // whether each agent answers).
  virtual void SendSaveRequests(Job& job, bool abort_step, bool probe = false) = 0;
  // A worker of the current generation reported: rendezvous done, first step.
  virtual void NoteWorkerReport(Job& job, const v1::WorkerStatus& w) = 0;
};

// What the job controller needs of sharing (jobs/ declares, sharing/SharingController
// implements): the pending jobs to try, in order, each with JobInfo.allocated_slots set.
class JobSharing {
 public:
  virtual ~JobSharing() = default;
  // Re-decides every job's allocation if something changed (or period_s passed), begins the
  // resizes it calls for, and returns the pending jobs that may start now, in order.
  virtual std::vector<std::string> StartOrder() = 0;
};

// What the morph controller may ask of a job's lifecycle (implemented by JobController).
class JobLifecycle {
 public:
  virtual ~JobLifecycle() = default;
  virtual void Fail(Job& job, const std::string& reason) = 0;
  virtual void Succeed(Job& job) = 0;
  virtual void SendStops(Job& job) = 0;
  virtual void SendLaunches(Job& job) = 0;
};

class JobController final : public JobLifecycle {
 public:
  using Post = std::function<void(std::function<void()>)>;
  JobController(JobOptions options, Clock* clock, JobTable* jobs, NodeTable* nodes,
                AgentClientPool* agents, Post post, EventLog* events, ProfileStore* profiles,
                StepSeries* steps);
  // Wiring (Manager): the morph controller this one hands running jobs' failures to, and the
  // allocator's side every Schedule asks (null without a `sharing:` block).
  void set_morph(JobMorphing* morph, JobSharing* sharing = nullptr) {
    morph_ = morph;
    sharing_ = sharing;
  }
  // Who else takes the step records workers report (the straggler ladder).
  using OnStepsFn = std::function<void(Job&, const v1::WorkerStatus&)>;
  void set_on_steps(OnStepsFn f) { on_steps_ = std::move(f); }

  // After JobTable::Load: carries recovered active jobs on (exits seen before the restart,
  // launches and stops in flight, a morph in progress: Note [Morph recovery]).
  void ResumeRecovered();

  // Queues an admitted job (`spec` from JobAdmission::Admit) once JobAdmission::Check lets it
  // (a repeated request_id returns its job instead). `user` is the token's name ("" without
  // tokens), recorded on the job; `run_as` the Unix user its token maps to (the agents run
  // its workers as that user; "" = their default), else `run_as_uid` the tenant's uid (Note
  // [Tenant uids] in common/launch/tenant_uid.cc; 0 = none). `admin`: the token's role (a
  // class above normal needs it or sharing.submit_above_normal). Never touches the filesystem.
  absl::StatusOr<v1::JobInfo> Submit(const v1::SubmitRequest& req, JobSpec spec,
                                     const std::string& user, const std::string& run_as = "",
                                     uint32_t run_as_uid = 0, bool admin = true);
  absl::StatusOr<v1::JobInfo> Cancel(const std::string& id, const std::string& user);
  // Places pending jobs on the free schedulable slots: in submission order, or with sharing
  // (set_sharing) in the allocator's order, each within its allocated slots.
  void Schedule();
  // What one worker of the job's current generation, placed on `node`, reported.
  void OnWorkerReport(Job& job, const v1::WorkerStatus& w, const std::string& node);
  // A survivor of an older generation that a morph in place adopts: only its step records
  // (steps it applied before it parked, which the new generation continues from).
  void OnAdoptedWorkerReport(Job& job, const v1::WorkerStatus& w);
  // `error`: the rank's own error line (WorkerStatus.error; a launcher's reason).
  void RecordExit(Job& job, int rank, int exit_code, int signal, const std::string& node,
                  int64_t saved_step = 0, int64_t committed_step = 0, int64_t pending_step = 0,
                  const std::string& error = "");
  // A node its jobs must move off, lost or leaving (Note [Node gone]).
  void OnNodeGone(const NodeTable::Gone& gone);
  // Launch timeouts, held failures, repeated stops, morph timers, progress flush.
  void Tick();

  // JobLifecycle.
  void Fail(Job& job, const std::string& reason) override;
  void Succeed(Job& job) override;
  void SendStops(Job& job) override;
  void SendLaunches(Job& job) override;

 private:
  void StartJob(Job& job, const JobPlan& plan);
  // The steps of a report: the step series, then on_steps_.
  void RecordSteps(Job& job, const v1::WorkerStatus& w);
  v1::LaunchRequest MakeLaunch(const Job& job, const std::string& node) const;
  void OnLaunchDone(const std::string& job_id, int generation, const std::string& node,
                    absl::StatusOr<v1::LaunchResponse> r);
  void MarkRunning(Job& job);
  void CheckAllExited(Job& job);
  void SettleFailure(Job& job);
  void MarkCancelled(Job& job, const std::string& reason);
  // A profile job's rank 0 reported its profile: validate and store it.
  void StoreProfile(Job& job, const std::string& json);

  const JobOptions config_;
  Clock* const clock_;
  JobTable* const jobs_;
  NodeTable* const nodes_;
  AgentClientPool* const agents_;
  const Post post_;
  EventLog* const events_;
  ProfileStore* const profiles_;
  StepSeries* const steps_;
  const JobAdmission admission_;
  JobMorphing* morph_ = nullptr;
  JobSharing* sharing_ = nullptr;
  OnStepsFn on_steps_;
  absl::Time last_flush_;
};

}  // namespace varuna

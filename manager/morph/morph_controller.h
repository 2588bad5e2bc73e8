#pragma once

// The morph controller: how a running job survives lost, leaving and joining machines
// (docs/morphing.md). Trigger -> SAVING -> STOPPING -> PLANNING -> LAUNCHING (generation+1)
// -> RUNNING (RESUMING) -> Finish; Advance moves a job along when what its phase waits for
// has happened or the phase's timer ran out. The phase is stored in JobRecord.morph, so a
// restarted manager carries on (Note [Morph recovery] in job_controller.cc). Loop thread only.

#include <functional>
#include <optional>
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
#include "manager/morph/morph_options.h"
#include "manager/morph/save_coverage.h"
#include "manager/nodes/agent_client.h"
#include "manager/nodes/node_table.h"
#include "manager/state/manager_metrics.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

class MorphController final : public JobMorphing {
 public:
  using Post = std::function<void(std::function<void()>)>;
  MorphController(MorphOptions options, Clock* clock, JobTable* jobs, NodeTable* nodes,
                  AgentClientPool* agents, Post post, EventLog* events, ProfileStore* profiles,
                  JobLifecycle* lifecycle);
  void set_metrics(ManagerMetrics* m) { metrics_ = m; }

  // Whether the job can morph at all: morphing on, a checkpoint.dir, not a profile job.
  bool Allowed(const Job& job) const override;
  // Something happened that the job must survive: begin a morph, or join the one in
  // progress (coalescing), or fail the job when it cannot morph or its budget is spent.
  void Trigger(Job& job, const Cause& cause) override;
  // Moves the job's morph along: what its phase waits for, or its timers.
  void Advance(Job& job) override;
  // The timers: a relaunch that does not start within start_timeout is a new trigger; a
  // generation whose workers never report ready closes its morph record after it. Then Advance.
  void Tick(Job& job) override;
  // Records the morph (phases, steps lost) and clears it.
  void Finish(Job& job);
  // Enters `phase`, adding the time spent in the previous one to the morph's record.
  void SetPhase(Job& job, v1::MorphState::Phase phase) override;
  // Asks every live node of the job's generation to have its workers save and exit (or, with
  // `probe`, only whether its agent answers); a node that does not answer is lost.
  void SendSaveRequests(Job& job, bool abort_step, bool probe = false) override;
  // A worker of the current generation reported: rendezvous done, first step.
  void NoteWorkerReport(Job& job, const v1::WorkerStatus& w) override;
  // `node` joined: jobs may grow onto it after scale_up_delay (CheckGrowth).
  void NoteJoined(const std::string& node);
  void CheckGrowth();
  // An evicted job (JobRecord.evicted) whose workers saved and left: its morph ends, it goes
  // back to PENDING with the reason, keeping its generation and checkpoint (morph_growth.cc).
  void Requeue(Job& job);

 private:
  void BeginMorph(Job& job, const Cause& cause);
  void OnSaveRequestFailed(const std::string& job_id, int generation, const std::string& node,
                           const absl::Status& status);
  void Relaunch(Job& job, const JobPlan& plan);
  // Morph in place (Note [Morph in place] in worker/engine/regroup.cc): whether this cause can take
  // it, why not, and the survivors the new placement adopts.
  bool InPlacePossible(const Job& job, const Cause& cause) const;
  static bool EveryNodeLeaving(const Job& job, const std::set<std::string>& leaving);
  std::string RelaunchReason(const Job& job, const Cause& cause) const;
  // Note [Coalescing window] in morph_controller.cc: false while the morph still waits.
  bool CoalesceWindowOver(Job& job);
  void AdoptSurvivors(Job& job, const v1::JobInfo& old);
  // Every rank exited or sits on a lost or dead node; with `frozen_gone`, a rank whose process
  // is stopped (Note [Frozen workers] in agent/in_place.cc) counts as gone too: it will save
  // nothing, so the save phase stops waiting for it, while STOPPING still stops (and kills) it.
  bool AllRanksGone(const Job& job, bool frozen_gone = false) const;
  // Every rank exited, parked (a graceful morph in place) or frozen, and one parked.
  bool AllRanksGoneOrParked(const Job& job) const;
  bool FinishedTraining(const Job& job) const;

  const MorphOptions config_;
  Clock* const clock_;
  JobTable* const jobs_;
  NodeTable* const nodes_;
  AgentClientPool* const agents_;
  const Post post_;
  EventLog* const events_;
  ProfileStore* const profiles_;
  JobLifecycle* const lifecycle_;
  ManagerMetrics* metrics_ = nullptr;
  // Growth: when a node joined, jobs may grow onto it after scale_up_delay.
  absl::Time grow_check_at_ = absl::InfiniteFuture();
  std::set<std::string> joined_;
};

// Growth (morph_growth.cc): whether a running job should grow onto `plan`, made for the
// slots it could have now that `joined` came: only a plan with more slots and another shape
// (a morph that would not change the world is skipped). The join Cause, or nullopt.
std::optional<Cause> GrowthCause(const v1::JobInfo& info, const JobPlan& plan,
                                 const std::string& joined);

}  // namespace varuna

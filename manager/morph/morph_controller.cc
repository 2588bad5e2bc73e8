// The morph controller: how a running job survives lost, leaving and joining machines
// (docs/morphing.md). Every trigger ends in Trigger(); the phases are
//
//   RUNNING --Trigger--> RECONFIGURING: SAVING    workers save (graceful: checkpoint at the
//                                                 next step boundary; else abort the step and
//                                                 save the last completed one) and exit
//                                       STOPPING  stragglers get SIGTERM, then SIGKILL
//                                       PLANNING  re-plan on the slots alive now; wait for
//                                                 min_slots up to resources.max_wait_s
//                                       LAUNCHING generation+1, resuming from the newest
//                                                 complete checkpoint
//            RUNNING (RESUMING) --first step of the new generation--> RUNNING, record kept
//
// Triggers that arrive before LAUNCHING join the morph in progress (coalescing); later ones
// start the next morph. The state is in JobRecord.morph, so a restarted manager carries on.

#include "manager/morph/morph_controller.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/launch/exit_codes.h"
#include "common/pipeline/topology.h"
#include "glog/logging.h"
#include "manager/jobs/planning.h"

namespace varuna {
namespace {

const char* PhaseName(v1::MorphState::Phase p) {
  switch (p) {
    case v1::MorphState::SAVING:
      return "save";
    case v1::MorphState::STOPPING:
      return "stop";
    case v1::MorphState::PLANNING:
      return "plan";
    case v1::MorphState::LAUNCHING:
      return "launch";
    case v1::MorphState::RESUMING:
      return "rendezvous";
    default:
      return "none";
  }
}

v1::Shape ShapeOf(const v1::JobInfo& info) {
  v1::Shape s;
  s.set_stages(info.stages());
  s.set_replicas(info.replicas());
  s.set_micro_batch(info.micro_batch());
  if (TpOf(info) > 1) s.set_tp_size(TpOf(info));
  if (!info.pipelines().empty()) {
    if (auto t = Topology::Parse(info.pipelines()); t.ok()) {
      for (const PipelineLayout& p : t->pipelines()) s.add_depths(p.stages());
    }
  }
  return s;
}

// "2x3 mb4", or for heterogeneous pipelines their depths: "[3,2] mb4"; " tp2" after the
// shape of a tensor-parallel plan.
std::string ShapeText(const v1::Shape& s) {
  const std::string tp = s.tp_size() > 1 ? absl::StrCat(" tp", s.tp_size()) : "";
  if (s.depths_size() > 0) {
    return absl::StrCat("[", absl::StrJoin(s.depths(), ","), "]", tp, " mb", s.micro_batch());
  }
  return absl::StrCat(s.stages(), "x", s.replicas(), tp, " mb", s.micro_batch());
}

}  // namespace

MorphController::MorphController(MorphOptions options, Clock* clock, JobTable* jobs,
                                 NodeTable* nodes, AgentClientPool* agents, Post post,
                                 EventLog* events, ProfileStore* profiles, JobLifecycle* lifecycle)
    : config_(std::move(options)),
      clock_(clock),
      jobs_(jobs),
      nodes_(nodes),
      agents_(agents),
      post_(std::move(post)),
      events_(events),
      profiles_(profiles),
      lifecycle_(lifecycle) {}

bool MorphController::Allowed(const Job& job) const {
  return job.spec.morphing && !job.spec.checkpoint.dir.empty() && !job.info().profile_job();
}

void MorphController::Trigger(Job& job, const Cause& cause) {
  const v1::JobState s = job.info().state();
  if (s != v1::STARTING && s != v1::RUNNING && s != v1::RECONFIGURING) return;
  if (!Allowed(job)) {
    lifecycle_->Fail(
        job, absl::StrCat(cause.reason, job.spec.morphing
                                            ? " (set checkpoint.dir so the job can survive this)"
                                            : " (morphing: false)"));
    return;
  }
  const auto phase = job.rec.morph().phase();
  if (phase == v1::MorphState::SAVING || phase == v1::MorphState::STOPPING ||
      phase == v1::MorphState::PLANNING || phase == v1::MorphState::LAUNCHING) {
    // Coalesce: one morph for everything that happened before the new generation ran.
    v1::MorphState& m = job.morph();
    for (const auto& n : cause.leaving) {
      if (std::find(m.lost_nodes().begin(), m.lost_nodes().end(), n) == m.lost_nodes().end()) {
        m.add_lost_nodes(n);
      }
    }
    if (cause.priority > job.cause_priority) {
      m.mutable_record()->set_reason(cause.reason);
      m.mutable_record()->set_kind(cause.kind);
      job.cause_priority = cause.priority;
    }
    job.last_trigger = clock_->Now();
    LOG(INFO) << JobWho(job.info()) << " morph: also " << cause.reason << " (phase "
              << v1::MorphState::Phase_Name(phase) << (m.in_place() ? ", in place" : "") << ")";
    if (phase == v1::MorphState::SAVING && m.in_place() && m.graceful() && cause.graceful &&
        EveryNodeLeaving(job, {m.lost_nodes().begin(), m.lost_nodes().end()})) {
      // Every node of the job is now under notice: nobody stays to regroup. The parked
      // workers (their step saved) exit, and the job waits for machines.
      m.set_in_place(false);
      m.mutable_record()->set_in_place(false);
      m.mutable_record()->set_path("relaunch: every node of the job is leaving");
      SendSaveRequests(job, /*abort_step=*/false);
    } else if (phase == v1::MorphState::PLANNING && m.in_place()) {
      // Still planning: the survivors regroup into a plan without these nodes too.
    } else if (phase == v1::MorphState::LAUNCHING) {
      // The new generation may not be able to start (a node of it is gone): stop it too.
      if (m.in_place()) {
        m.set_in_place(false);
        m.mutable_record()->set_in_place(false);
        m.mutable_record()->set_path(
            absl::StrCat("relaunch: ", cause.reason, " during the in-place regroup"));
      }
      m.set_graceful(false);
      SetPhase(job, v1::MorphState::SAVING);
      SendSaveRequests(job, /*abort_step=*/true);
    } else if (phase == v1::MorphState::SAVING && m.graceful() && !cause.graceful) {
      if (m.in_place()) {  // the parked workers save and exit: the relaunch path
        m.set_in_place(false);
        m.mutable_record()->set_in_place(false);
        m.mutable_record()->set_path(
            absl::StrCat("relaunch: ", cause.reason, " during the graceful in-place save"));
      }
      m.set_graceful(false);
      m.mutable_record()->set_graceful(false);
      SendSaveRequests(job, /*abort_step=*/true);
    }
    jobs_->Persist(job);
    return;
  }
  if (phase == v1::MorphState::RESUMING) Finish(job);  // what it measured so far
  BeginMorph(job, cause);
}

void MorphController::BeginMorph(Job& job, const Cause& cause) {
  const absl::Time now = clock_->Now();
  // The restart budget: max_morphs within morph_window, then FAILED with the history.
  std::vector<std::string> history;
  for (const v1::MorphRecord* r : RecentMorphs(job, now, config_.morph_window)) {
    history.push_back(absl::StrCat(r->at(), " ", r->reason()));
  }
  const int recent = static_cast<int>(history.size());
  if (recent >= config_.max_morphs) {
    lifecycle_->Fail(job,
                     absl::StrCat(cause.reason, "; not morphing again: ", recent, " morphs within ",
                                  absl::FormatDuration(config_.morph_window), " (max_morphs=",
                                  config_.max_morphs, "): ", absl::StrJoin(history, "; ")));
    return;
  }
  v1::JobInfo& info = job.info();
  v1::MorphState& m = job.morph();
  m.Clear();
  m.set_graceful(cause.graceful);
  for (const auto& n : cause.leaving) m.add_lost_nodes(n);
  m.set_began(UnixSeconds(clock_->Now()));
  m.set_step_before(std::max<int64_t>(info.step(), job.gen.newest_step));
  v1::MorphRecord* r = m.mutable_record();
  r->set_reason(cause.reason);
  r->set_kind(cause.kind);
  *r->mutable_speeds() = {cause.speeds.begin(), cause.speeds.end()};
  *r->mutable_from() = ShapeOf(info);
  r->set_at(TimeText(clock_->Now()));
  r->set_graceful(cause.graceful);
  (*r->mutable_phases())["detect"] = absl::ToDoubleSeconds(cause.detect);
  job.cause_priority = cause.priority;
  job.last_trigger = now;
  info.set_state(v1::RECONFIGURING);
  info.set_reason(cause.reason);
  // Note [Morph in place] in worker/engine/regroup.cc: after a loss, the survivors (running with
  // --in_place) regroup into the new plan and keep their state: no save, no stop.
  const bool in_place = InPlacePossible(job, cause);
  m.set_in_place(in_place);
  r->set_in_place(in_place);
  r->set_path(in_place ? "in place: the survivors regroup with their state in memory"
                       : RelaunchReason(job, cause));
  if (in_place && cause.graceful) {
    // Every rank checkpoints at the next step boundary; those that stay park instead of
    // exiting (StopCommand.park), the leaving ones exit; then PLANNING (Advance, SAVING).
    r->set_path("in place: the workers checkpoint at a step boundary, the ones that stay regroup");
    LOG(WARNING) << JobWho(info) << " RECONFIGURING in place (graceful): " << cause.reason;
    events_->Emit("morph_begin", info.id(), "",
                  absl::StrCat("checkpoint and regroup in place: ", cause.reason));
    SetPhase(job, v1::MorphState::SAVING);
    jobs_->Persist(job);
    SendSaveRequests(job, /*abort_step=*/false);
    Advance(job);
    return;
  }
  if (in_place) {
    LOG(WARNING) << JobWho(info) << " RECONFIGURING in place: " << cause.reason;
    events_->Emit("morph_begin", info.id(), "", absl::StrCat("regroup in place: ", cause.reason));
    SetPhase(job, v1::MorphState::PLANNING);
    m.set_waiting_since(UnixSeconds(now));
    jobs_->Persist(job);
    // A node whose agent is gone (refused at once) is lost before the plan is made.
    SendSaveRequests(job, /*abort_step=*/false, /*probe=*/true);
    Advance(job);
    return;
  }
  LOG(WARNING) << JobWho(info) << " RECONFIGURING (" << (cause.graceful ? "graceful" : "abort")
               << "): " << cause.reason;
  events_->Emit("morph_begin", info.id(), "",
                absl::StrCat(cause.graceful ? "checkpoint and move: " : "recover: ", cause.reason));
  SetPhase(job, v1::MorphState::SAVING);
  jobs_->Persist(job);
  SendSaveRequests(job, !cause.graceful);
  Advance(job);  // nothing may be left running
}

// Asks every live node of the job's generation to have its workers save and exit. An agent
// that does not answer is treated as gone for this morph: its ranks are lost.
void MorphController::SendSaveRequests(Job& job, bool abort_step, bool probe) {
  std::set<std::string> nodes;
  for (const auto& p : job.info().placement()) nodes.insert(p.node());
  const auto& lost = job.rec.morph().lost_nodes();
  for (const std::string& name : nodes) {
    const NodeTable::Node* nit = nodes_->Find(name);
    if (nit == nullptr || nit->dead) continue;
    // A node that leaves (notice, drain, machine_list) still saves its ranks; one that
    // did not answer (suspect) is not asked again.
    if (nit->suspect && std::find(lost.begin(), lost.end(), name) != lost.end()) continue;
    v1::CheckpointRequest req;
    req.set_job_id(job.info().id());
    req.set_generation(job.info().generation());
    req.set_abort_step(abort_step);
    // A graceful morph in place: the workers of a node that stays park after the checkpoint.
    req.set_park(!abort_step && job.rec.morph().in_place() &&
                 std::find(lost.begin(), lost.end(), name) == lost.end());
    req.set_probe(probe);
    const std::string id = job.info().id();
    const int gen = job.info().generation();
    agents_->For(nit->rec.name(), nit->rec.address())
        ->Checkpoint(req, [this, id, gen, name](absl::StatusOr<v1::CheckpointResponse> r) {
          if (r.ok()) return;
          post_([this, id, gen, name, st = r.status()] { OnSaveRequestFailed(id, gen, name, st); });
        });
  }
}

void MorphController::OnSaveRequestFailed(const std::string& job_id, int generation,
                                          const std::string& node, const absl::Status& status) {
  Job* found = jobs_->Find(job_id);
  if (found == nullptr) return;
  Job& job = *found;
  if (job.info().generation() != generation || !job.morphing()) return;
  LOG(WARNING) << JobWho(job.info()) << " node " << node
               << " did not take the save request: " << status.message()
               << "; its ranks count as lost";
  const NodeTable::Node* nit = nodes_->Find(node);
  if (nit != nullptr && !nit->dead) {
    nodes_->MarkUnreachable(node);  // unschedulable until it heartbeats again
    events_->Emit("node_unreachable", "", node, std::string(status.message()));
  }
  Cause c;
  c.kind = "lost";
  c.reason =
      absl::StrCat("node ", node, " lost (its agent does not answer: ", status.message(), ")");
  c.leaving = {node};
  c.priority = 3;
  Trigger(job, c);
  Advance(job);
}

void MorphController::SetPhase(Job& job, v1::MorphState::Phase phase) {
  v1::MorphState& m = job.morph();
  const double now = UnixSeconds(clock_->Now());
  if (m.phase() != v1::MorphState::NONE && m.phase_since() > 0) {
    (*m.mutable_record()->mutable_phases())[PhaseName(m.phase())] += now - m.phase_since();
  }
  m.set_phase(phase);
  m.set_phase_since(now);
}

bool MorphController::AllRanksGone(const Job& job, bool frozen_gone) const {
  std::set<int> exited;
  for (const auto& e : job.rec.exits()) exited.insert(e.rank());
  if (frozen_gone) exited.insert(job.gen.frozen.begin(), job.gen.frozen.end());
  const auto& lost = job.rec.morph().lost_nodes();
  for (const auto& p : job.info().placement()) {
    if (exited.count(p.rank())) continue;
    const NodeTable::Node* nit = nodes_->Find(p.node());
    if (nit == nullptr || nit->dead) continue;
    const bool gone_node =
        std::find(lost.begin(), lost.end(), p.node()) != lost.end() && (nit->suspect || nit->dead);
    if (gone_node) continue;
    return false;
  }
  return true;
}

bool MorphController::AllRanksGoneOrParked(const Job& job) const {
  std::set<int> done(job.gen.parked.begin(), job.gen.parked.end());
  for (const auto& e : job.rec.exits()) done.insert(e.rank());
  done.insert(job.gen.frozen.begin(), job.gen.frozen.end());
  for (const auto& p : job.info().placement()) {
    if (done.count(p.rank())) continue;
    const NodeTable::Node* nit = nodes_->Find(p.node());
    if (nit == nullptr || nit->dead || nit->suspect) continue;
    return false;
  }
  return !job.gen.parked.empty();
}

bool MorphController::FinishedTraining(const Job& job) const {
  if (job.rec.exits_size() < job.info().placement_size()) return false;
  for (const auto& e : job.rec.exits()) {
    if (e.exit_code() != 0 || e.signal() != 0) return false;
  }
  const int64_t steps = job.spec.train.steps;
  return job.gen.newest_step >= steps &&
         (job.gen.stopped_after == 0 || job.gen.stopped_after >= steps);
}

void MorphController::Tick(Job& job) {
  const absl::Time now = clock_->Now();
  const v1::JobState s = job.info().state();
  const auto phase = job.rec.morph().phase();
  if (s == v1::RECONFIGURING && phase == v1::MorphState::LAUNCHING &&
      now - job.gen.starting_since > config_.start_timeout) {
    Cause c;
    c.reason = absl::StrCat("the relaunch did not start within ",
                            absl::FormatDuration(config_.start_timeout), " (no answer from ",
                            absl::StrJoin(job.gen.launch_pending, ","), ")");
    c.leaving = job.gen.launch_pending;
    c.priority = 3;
    Trigger(job, c);
  } else if (s == v1::RUNNING && phase == v1::MorphState::RESUMING &&
             now - job.gen.running_since > config_.start_timeout) {
    // Workers that never write the ready line (a user program): record what is known.
    Finish(job);
  }
  Advance(job);
}

void MorphController::Advance(Job& job) {
  if (!job.morphing()) return;
  v1::MorphState& m = job.morph();
  const double now = UnixSeconds(clock_->Now());
  const double in_phase = now - m.phase_since();
  switch (m.phase()) {
    case v1::MorphState::SAVING: {
      if (AllRanksGone(job) && FinishedTraining(job)) {
        // The trigger came as the last step ended: nothing to move, the job is done.
        LOG(INFO) << JobWho(job.info()) << " finished training during the morph; no relaunch";
        job.rec.clear_morph();
        job.info().set_state(v1::RUNNING);
        lifecycle_->Succeed(job);
        return;
      }
      if (AllRanksGone(job, /*frozen_gone=*/true)) {
        // Every saver is done; a frozen rank is stopped (and killed) in STOPPING.
        SetPhase(job, v1::MorphState::STOPPING);
        jobs_->Persist(job);
        break;  // STOPPING next time round (or right below)
      }
      if (m.in_place() && AllRanksGoneOrParked(job)) {
        SetPhase(job, v1::MorphState::PLANNING);
        m.set_waiting_since(now);
        jobs_->Persist(job);
        break;  // PLANNING right below
      }
      const double timeout = absl::ToDoubleSeconds(config_.morph_save_timeout);
      if (m.graceful() && in_phase > timeout) {
        if (m.in_place()) {
          m.set_in_place(false);
          m.mutable_record()->set_in_place(false);
          m.mutable_record()->set_path(
              "relaunch: the graceful save took longer than morph_save_timeout_s");
        }
        LOG(WARNING) << JobWho(job.info()) << " workers did not checkpoint within " << timeout
                     << " s; aborting their step";
        m.set_graceful(false);
        m.mutable_record()->set_graceful(false);
        SendSaveRequests(job, /*abort_step=*/true);
        SetPhase(job, v1::MorphState::SAVING);  // counted in save; a second window to abort
        jobs_->Persist(job);
      } else if (!m.graceful() && in_phase > timeout) {
        LOG(WARNING) << JobWho(job.info()) << " workers did not save within " << timeout
                     << " s; stopping them";
        SetPhase(job, v1::MorphState::STOPPING);
        jobs_->Persist(job);
      }
      return;
    }
    case v1::MorphState::STOPPING:
    case v1::MorphState::PLANNING:
    case v1::MorphState::LAUNCHING:
    case v1::MorphState::RESUMING:
    default:
      break;
  }
  if (m.phase() == v1::MorphState::STOPPING) {
    if (!AllRanksGone(job)) {
      if (clock_->Now() - job.last_stop_sent > absl::Seconds(5)) lifecycle_->SendStops(job);
      if (in_phase < absl::ToDoubleSeconds(config_.stop_grace) + 5) return;
      LOG(WARNING) << JobWho(job.info()) << " ranks still reported after the stop grace; "
                   << "the next generation's launch kills them";
    }
    SetPhase(job, v1::MorphState::PLANNING);
    m.set_waiting_since(now);
    jobs_->Persist(job);
  }
  if (m.phase() == v1::MorphState::PLANNING) {
    if (job.rec.evicted()) {
      Requeue(job);  // every worker saved and left: back to PENDING, nothing to plan
      return;
    }
    if (!CoalesceWindowOver(job)) return;
    const std::set<std::string> exclude(m.lost_nodes().begin(), m.lost_nodes().end());
    auto plan = PlanForJob(job, jobs_->FreeSlotsFor(&job, exclude), *profiles_);
    if (!plan.ok()) {
      if (plan.status().code() != absl::StatusCode::kResourceExhausted) {
        lifecycle_->Fail(job, absl::StrCat("re-plan after '", m.record().reason(),
                                           "' failed: ", plan.status().message()));
        return;
      }
      const double waited = now - m.waiting_since();
      if (waited > job.spec.resources.max_wait_s) {
        lifecycle_->Fail(job, absl::StrCat("gave up after waiting ", static_cast<int64_t>(waited),
                                           " s for slots (resources.max_wait_s) after '",
                                           m.record().reason(), "': ", plan.status().message()));
        return;
      }
      const std::string reason = absl::StrCat("waiting for slots: ", plan.status().message());
      if (job.info().reason() != reason) {
        job.info().set_reason(reason);
        events_->Emit("morph_waiting", job.info().id(), "", reason);
      }
      return;
    }
    Relaunch(job, *plan);
  }
}

// Note [Coalescing window]: a morph waits morph_coalesce_s after its last trigger before it
// plans, so events that come together (a rack's machines, a zone's notices) make one morph.
// The wait is its own phase in the record ("coalesce", up to the window's end), so "plan" is
// the planner and any wait for slots. The allocator's resizes and evictions skip it: the
// manager decided them at once, for every job together; a machine event joining one brings
// its kind, and with it the window, back.
bool MorphController::CoalesceWindowOver(Job& job) {
  v1::MorphState& m = job.morph();
  const std::string& kind = m.record().kind();
  const absl::Time end = job.last_trigger + config_.morph_coalesce;
  if (kind != "resize" && kind != "evict" && clock_->Now() < end) return false;
  auto& phases = *m.mutable_record()->mutable_phases();
  if (job.coalesce_counted != job.last_trigger) {
    // Each window once (a trigger while the morph waits for slots opens another): the part
    // of it since this phase began, or since its trigger.
    const bool decided = kind == "resize" || kind == "evict";
    const double from = std::max(m.phase_since(), UnixSeconds(job.last_trigger));
    const double waited =
        decided ? 0.0
                : std::max(0.0, std::min(UnixSeconds(clock_->Now()), UnixSeconds(end)) - from);
    phases["coalesce"] += waited;
    m.set_phase_since(m.phase_since() + waited);
    job.coalesce_counted = job.last_trigger;
  }
  return true;
}

// Note [Saved steps]: the survivors' saves are compared, not just counted. Each saver (exit 75,
// or exit 0 after a stop request) reports the step it saved (and the next step, when its rescue
// wrote pending layers for it: Note [Rolled rescue] in common/checkpoint/checkpoint_store.cc); a
// stage (a segment range, for heterogeneous pipelines) is covered at step S when one of its
// savers saved S, or wrote pending layers for S and another saver saved S. The relaunch
// resumes from the newest complete checkpoint ("auto"); this says which step that should be
// and why, so a morph record explains a resume from further back: a stage no rank was left to
// save (every replica lost at once), or saves that cover no common step.
bool MorphController::InPlacePossible(const Job& job, const Cause& cause) const {
  return config_.morph_in_place && job.spec.entrypoint.empty() && job.spec.parallel.tp_size == 1 &&
         job.info().state() != v1::STARTING && !EveryNodeLeaving(job, cause.leaving);
}

// True when `leaving` holds every node the job's generation runs on: no survivor would be
// left to regroup (a whole Slurm allocation preempted, every node under notice), so the
// workers save and exit and the job waits for machines holding none.
bool MorphController::EveryNodeLeaving(const Job& job, const std::set<std::string>& leaving) {
  if (job.info().placement().empty()) return false;
  for (const v1::RankPlacement& p : job.info().placement()) {
    if (!leaving.count(p.node())) return false;
  }
  return true;
}

std::string MorphController::RelaunchReason(const Job& job, const Cause& cause) const {
  if (!config_.morph_in_place) return "relaunch: morph_in_place is off in the manager's config";
  if (!job.spec.entrypoint.empty()) {
    return "relaunch: the job's entrypoint is a program of its own (no in-place protocol)";
  }
  if (job.spec.parallel.tp_size != 1) {
    return "relaunch: a tensor-parallel job resumes from its checkpoint (split layers are not "
           "handed over in place yet)";
  }
  return "relaunch: the job had not started training";
}

// The survivors of the generation now running, by node (ranks that neither exited nor sit on
// a lost or dead node), paired with the new plan's ranks on the same node: each keeps its
// local rank (its device), the new generation adopts it, and the plan's other ranks on that
// node are fresh workers on the free local ranks (Note [Morph in place] in
// worker/engine/regroup.cc).
void MorphController::AdoptSurvivors(Job& job, const v1::JobInfo& old) {
  v1::MorphState& m = job.morph();
  std::set<int> exited;
  for (const auto& e : job.rec.exits()) exited.insert(e.rank());
  const auto& lost = m.lost_nodes();
  std::map<std::string, std::vector<v1::RankPlacement>> survivors;
  for (const auto& p : old.placement()) {
    const NodeTable::Node* nit = nodes_->Find(p.node());
    if (exited.count(p.rank()) || job.gen.frozen.count(p.rank()) || nit == nullptr || nit->dead ||
        nit->suspect || std::find(lost.begin(), lost.end(), p.node()) != lost.end()) {
      continue;
    }
    survivors[p.node()].push_back(p);
  }
  m.clear_adopted();
  std::map<std::string, std::vector<v1::RankPlacement*>> fresh;
  for (auto& p : *job.info().mutable_placement()) fresh[p.node()].push_back(&p);
  for (auto& [node, ranks] : fresh) {
    std::vector<v1::RankPlacement>& kept = survivors[node];
    std::set<int> used;
    size_t i = 0;
    for (; i < ranks.size() && i < kept.size(); ++i) {
      ranks[i]->set_local_rank(kept[i].local_rank());
      used.insert(kept[i].local_rank());
      v1::InPlaceRank* a = m.add_adopted();
      a->set_old_generation(old.generation());
      a->set_old_rank(kept[i].rank());
      a->set_new_rank(ranks[i]->rank());
      a->set_node(node);
    }
    int next = 0;
    for (; i < ranks.size(); ++i) {
      while (used.count(next)) ++next;
      ranks[i]->set_local_rank(next);
      used.insert(next);
    }
  }
}

void MorphController::Relaunch(Job& job, const JobPlan& plan) {
  v1::JobInfo& info = job.info();
  v1::MorphState& m = job.morph();
  const v1::JobInfo old = info;
  // An in-place morph saved nothing: the workers choose the step themselves (Note
  // [Handover]) and report it; the saves below are the relaunch path's.
  const SaveCoverage cover = m.in_place() ? SaveCoverage() : CoverageOf(job);
  m.mutable_record()->set_committed_step(cover.committed);
  m.mutable_record()->clear_saved_steps();
  for (const auto& s : cover.saved) *m.mutable_record()->add_saved_steps() = s;
  if (!m.in_place() && !cover.missing.empty() && job.gen.newest_step > 0) {
    m.mutable_record()->set_note(absl::StrCat(
        "no rank of stage ", absl::StrJoin(cover.missing, ","),
        " was left to save the newest step: resumed from the newest complete checkpoint"));
  }
  std::vector<std::string> saved;
  for (const auto& s : cover.saved) saved.push_back(absl::StrCat(s.rank(), ":", s.step()));
  if (cover.common_step > 0) {
    m.mutable_record()->set_resume_reason(absl::StrCat(
        "step ", cover.common_step, ": the newest step every stage's survivors saved (rank:step ",
        absl::StrJoin(saved, " "), ")",
        cover.common_step < cover.newest_saved
            ? absl::StrCat("; step ", cover.newest_saved, " was not on every stage")
            : ""));
  } else if (!cover.missing.empty()) {
    m.mutable_record()->set_resume_reason(absl::StrCat(
        "the newest complete checkpoint: no survivor saved stage ",
        absl::StrJoin(cover.missing, ","), " (rank:step ", absl::StrJoin(saved, " "), ")"));
  } else if (!cover.saved.empty()) {
    m.mutable_record()->set_resume_reason(
        absl::StrCat("the newest complete checkpoint: the survivors' saves (rank:step ",
                     absl::StrJoin(saved, " "), ") share no step"));
  }
  if (!m.in_place() && cover.missing.empty() && cover.common_step < cover.committed) {
    // Every survivor writes the committed step: a save that does not cover it was lost.
    m.mutable_record()->set_note(
        absl::StrCat("the survivors' saves (rank:step ", absl::StrJoin(saved, " "),
                     ") do not cover the "
                     "committed step ",
                     cover.committed, ": resumed from the newest complete checkpoint"));
  }
  SetPhase(job, v1::MorphState::LAUNCHING);
  m.set_launched_at(UnixSeconds(clock_->Now()));
  info.set_generation(info.generation() + 1);
  info.set_reason("");
  ApplyPlan(info, plan, nodes_->Find(plan.ranks[0].node())->rec.address());
  if (m.in_place()) {
    AdoptSurvivors(job, old);
    if (m.adopted().empty()) {
      m.set_in_place(false);
      m.mutable_record()->set_in_place(false);
      m.mutable_record()->set_path("relaunch: no survivor to regroup");
    }
  }
  *m.mutable_record()->mutable_to() = ShapeOf(info);
  m.mutable_record()->set_generation(info.generation());
  m.clear_lost_nodes();
  NewGeneration(job, clock_->Now());
  jobs_->Persist(job);
  std::set<std::string> used_nodes;
  for (const auto& p : plan.ranks) used_nodes.insert(p.node());
  const bool in_place = m.in_place();
  LOG(INFO) << JobWho(info) << (in_place ? " regrouping in place " : " relaunching ")
            << ShapeText(m.record().from()) << " -> " << ShapeText(m.record().to())
            << " map=" << plan.stage_to_rank_map << " nodes=" << absl::StrJoin(used_nodes, ",");
  events_->Emit(
      in_place ? "morph_regroup" : "morph_relaunch", info.id(), "",
      absl::StrCat("generation ", info.generation(), ": ", ShapeText(m.record().from()), " -> ",
                   ShapeText(m.record().to()), " on ", absl::StrJoin(used_nodes, ",")));
  lifecycle_->SendLaunches(job);
}

void MorphController::Finish(Job& job) {
  v1::MorphState& m = job.morph();
  if (m.phase() == v1::MorphState::NONE) return;
  SetPhase(job, v1::MorphState::NONE);
  v1::MorphRecord r = m.record();
  if (job.gen.resumed_from >= 0) {
    r.set_resumed_from(job.gen.resumed_from);
    // In place, the hand-over's step is committed by construction: every layer had a live
    // holder or the checkpoint at it (Note [Handover] in common/pipeline/handover.cc).
    if (r.in_place()) r.set_committed_step(job.gen.resumed_from);
    r.set_steps_lost(std::max<int64_t>(0, m.step_before() - job.gen.resumed_from));
  } else {
    // The next morph began before this generation reported where it resumed: its loss is
    // counted by that next morph (which starts from the same newest step).
    r.set_resumed_from(-1);
    r.set_steps_lost(-1);
  }
  double total = 0;
  for (const auto& [phase, s] : r.phases()) total += phase == "detect" ? 0 : s;
  (*r.mutable_phases())["total"] = total;
  *job.info().add_morphs() = r;
  if (metrics_) metrics_->OnMorph(job.info().id(), r);
  constexpr int kMaxMorphRecords = 1000;
  if (job.info().morphs_size() > kMaxMorphRecords) {
    job.info().mutable_morphs()->DeleteSubrange(0, 1);
  }
  job.rec.clear_morph();
  LOG(INFO) << JobWho(job.info()) << " morph done: " << r.reason() << "; " << ShapeText(r.from())
            << " -> " << ShapeText(r.to()) << ", steps lost " << r.steps_lost() << ", " << total
            << " s";
  events_->Emit("morph_done", job.info().id(), "",
                absl::StrCat(ShapeText(r.from()), " -> ", ShapeText(r.to()),
                             ", resumed after step ", r.resumed_from(), ", steps lost ",
                             r.steps_lost(), ", ", absl::StrFormat("%.2f", total), " s"));
  jobs_->Persist(job);
}

// What a worker of the current generation says about its rendezvous and its saves.
void MorphController::NoteWorkerReport(Job& job, const v1::WorkerStatus& w) {
  Generation& g = job.gen;
  if (w.resumed_from() >= 0 && !g.ready.count(w.rank())) {
    g.ready.insert(w.rank());
    if (w.has_in_place() && job.morphing() && job.rec.morph().in_place()) {
      v1::MorphState& m = job.morph();
      v1::MorphRecord* r = m.mutable_record();
      if (r->resume_reason().empty()) r->set_resume_reason(w.in_place().handover());
      r->set_moved_bytes(r->moved_bytes() + w.in_place().moved_bytes());
      r->set_checkpoint_bytes_read(r->checkpoint_bytes_read() +
                                   w.in_place().checkpoint_bytes_read());
      m.set_regroup_s(std::max(m.regroup_s(), w.in_place().regroup_s()));
      m.set_agree_s(std::max(m.agree_s(), w.in_place().agree_s()));
      m.set_transfer_s(std::max(m.transfer_s(), w.in_place().transfer_s()));
    }
    g.resumed_from = std::max(g.resumed_from, w.resumed_from());
    g.last_ready_at = std::max(g.last_ready_at, w.ready_at());
  }
  for (const v1::StepMetrics& s : w.steps()) {
    if (g.resumed_from >= 0 && s.step() == g.resumed_from + 1 && s.at() > 0) {
      g.first_step_at = g.first_step_at > 0 ? std::min(g.first_step_at, s.at()) : s.at();
    }
  }
  if (!job.morphing() || job.rec.morph().phase() != v1::MorphState::RESUMING) return;
  v1::MorphState& m = job.morph();
  auto& phases = *m.mutable_record()->mutable_phases();
  if (static_cast<int>(g.ready.size()) == job.info().placement_size() &&
      !phases.count("rendezvous")) {
    // From the acks to every rank ready: the workers' clocks say when, where they did
    // (finer than the heartbeat period the manager sees it at).
    const double ready = g.last_ready_at > 0 ? std::min(g.last_ready_at, UnixSeconds(clock_->Now()))
                                             : UnixSeconds(clock_->Now());
    phases["rendezvous"] = std::max(0.0, ready - m.phase_since());
    if (m.in_place()) {
      // The slowest rank's regroup (new groups and stage), agree and transfer; what is left of
      // the span is the command's way to the workers and their waits on each other.
      phases["regroup"] = m.regroup_s();
      phases["agree"] = m.agree_s();
      phases["transfer"] = m.transfer_s();
      phases["rendezvous"] =
          std::max(0.0, phases["rendezvous"] - m.regroup_s() - m.agree_s() - m.transfer_s());
    }
    m.set_phase_since(ready);
    job.info().set_step(static_cast<int32_t>(std::max<int64_t>(0, g.resumed_from)));
  }
  if (phases.count("rendezvous") && g.newest_step > g.resumed_from && g.resumed_from >= 0) {
    const double first = g.first_step_at > 0 ? std::min(g.first_step_at, UnixSeconds(clock_->Now()))
                                             : UnixSeconds(clock_->Now());
    phases["first_step"] = std::max(0.0, first - m.phase_since());
    m.set_phase_since(0);  // FinishMorph must not add the phase again
    Finish(job);
  }
}

}  // namespace varuna

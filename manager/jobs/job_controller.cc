#include "manager/jobs/job_controller.h"

#include <signal.h>

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/launch/exit_codes.h"
#include "common/net/rpc.h"
#include "glog/logging.h"
#include "manager/jobs/planning.h"

namespace varuna {
namespace {

// Note [Stopped on request]: exit 0 after a stop request (SIGUSR1: a preemption notice, an
// operator) is not the end of training. Until morphing relaunches such a job, it ends
// FAILED with a reason that says where its progress is.
std::string StoppedOnRequestReason(int64_t step, int64_t steps, const std::string& ckpt_dir) {
  const std::string saved =
      ckpt_dir.empty() ? "the job has no checkpoint.dir, so nothing was saved"
                       : absl::StrCat("checkpoint of step ", step, " in ", ckpt_dir,
                                      "; resubmit with --set checkpoint.resume=latest to continue");
  return absl::StrCat("workers stopped on request (SIGUSR1) after step ", step, " of ", steps, "; ",
                      saved);
}

}  // namespace

JobController::JobController(JobOptions options, Clock* clock, JobTable* jobs, NodeTable* nodes,
                             AgentClientPool* agents, Post post, EventLog* events,
                             ProfileStore* profiles, StepSeries* steps)
    : config_(std::move(options)),
      clock_(clock),
      jobs_(jobs),
      nodes_(nodes),
      agents_(agents),
      post_(std::move(post)),
      events_(events),
      profiles_(profiles),
      steps_(steps),
      admission_(config_, jobs),
      last_flush_(clock->Now()) {}

void JobController::ResumeRecovered() {
  const absl::Time now = clock_->Now();
  int active = 0;
  for (auto& [id, job] : jobs_->all()) {
    if (!Active(job.info().state())) continue;
    ++active;
    LOG(INFO) << JobWho(job.info()) << " recovered in state "
              << v1::JobState_Name(job.info().state());
    job.gen.newest_step = job.info().step();
    for (const auto& e : job.rec.exits()) {
      if ((e.exit_code() != 0 || e.signal() != 0) && morph_->Allowed(job) && !job.morphing() &&
          e.exit_code() != kExitBadInput) {
        // A failure recorded just before the restart: the morph it should have started.
        const std::string id = job.info().id();
        const std::string reason = absl::StrCat(
            "rank ", e.rank(), " exited with ",
            e.signal() != 0 ? SignalName(e.signal()) : absl::StrCat("code ", e.exit_code()));
        post_([this, id, reason] {
          Job* it = jobs_->Find(id);
          if (it == nullptr) return;
          Cause c;
          c.reason = reason;
          c.priority = 2;
          morph_->Trigger(*it, c);
        });
        break;
      }
      if ((e.exit_code() != 0 || e.signal() != 0) && job.gen.pending_failure.empty()) {
        job.gen.pending_failure = absl::StrCat(
            "rank ", e.rank(), " exited with ",
            e.signal() != 0 ? SignalName(e.signal()) : absl::StrCat("code ", e.exit_code()));
        job.gen.fail_at = now;
      }
    }
    if (job.info().state() == v1::STARTING) SendLaunches(job);
    if (job.info().state() == v1::CANCELLING) SendStops(job);
    // Note [Morph recovery]: a morph's phase is stored with the job at every transition, so a
    // restarted manager carries the morph on from that phase by re-sending what the phase
    // waits for: save requests (SAVING), stops (STOPPING) or launches (LAUNCHING).
    switch (job.rec.morph().phase()) {
      case v1::MorphState::SAVING:
        morph_->SendSaveRequests(job, !job.rec.morph().graceful());
        break;
      case v1::MorphState::STOPPING:
        SendStops(job);
        break;
      case v1::MorphState::LAUNCHING:
        SendLaunches(job);
        break;
      case v1::MorphState::PLANNING:
        // The wait for slots starts again: the time the manager was down (a requeued Slurm
        // allocation waiting in the queue) is not the job's wait for machines.
        job.morph().set_waiting_since(UnixSeconds(now));
        jobs_->Persist(job);
        break;
      default:
        break;
    }
  }
  LOG(INFO) << "recovered " << jobs_->all().size() << " jobs (" << active << " active)";
}

void JobController::OnAdoptedWorkerReport(Job& job, const v1::WorkerStatus& w) {
  RecordSteps(job, w);
}

void JobController::RecordSteps(Job& job, const v1::WorkerStatus& w) {
  steps_->Record(job, w);
  if (on_steps_) on_steps_(job, w);
}

void JobController::OnWorkerReport(Job& job, const v1::WorkerStatus& w, const std::string& node) {
  // The agent repeats the profile on every heartbeat; it is handled once per generation.
  if (!w.profile_json().empty() && !job.gen.profile_handled) {
    job.gen.profile_handled = true;
    StoreProfile(job, w.profile_json());
  }
  const v1::StepMetrics& p = w.progress();
  v1::JobInfo& info = job.info();
  RecordSteps(job, w);
  morph_->NoteWorkerReport(job, w);
  if (!w.error().empty() && job.gen.worker_error.empty()) {
    job.gen.worker_error = w.error().substr(0, 500);
  }
  if (p.step() > info.step() && p.step() <= info.total_steps() &&
      job.rec.morph().phase() != v1::MorphState::RESUMING) {
    info.set_step(static_cast<int32_t>(p.step()));
    info.set_loss(p.loss());
    info.set_samples_per_s(p.samples_per_s());
    info.set_step_time_s(p.step_time_s());
    job.progress_dirty = true;
  }
  if (p.stopped() && p.step() <= info.total_steps()) {
    job.gen.stopped_after = std::max<int64_t>(job.gen.stopped_after, p.step());
  }
  if (w.state() != v1::WORKER_RUNNING) {
    RecordExit(job, w.rank(), w.exit_code(), w.signal(), node, w.saved_step(), w.committed_step(),
               w.pending_step(), w.error());
    return;
  }
  // A stopped process (Note [Frozen workers] in agent/in_place.cc) is lost now; a parked worker
  // (its step failed, Note [Morph in place] in worker/engine/regroup.cc) asks for a regroup.
  if (w.frozen()) job.gen.frozen.insert(w.rank());
  if (!w.parked().empty() && job.gen.parked.insert(w.rank()).second && job.morphing()) {
    morph_->Advance(job);  // a graceful morph in place waits for every rank to park
  }
  if ((w.frozen() || !w.parked().empty()) && info.state() == v1::RUNNING && !job.morphing() &&
      morph_->Allowed(job)) {
    Cause c;
    const std::string who = absl::StrCat("rank ", w.rank(), " on node ", node);
    c.reason = w.frozen() ? absl::StrCat(who, " is stopped (frozen)")
                          : absl::StrCat(who, " lost a peer: ", w.parked());
    c.priority = w.frozen() ? 2 : 1;
    morph_->Trigger(job, c);
  }
}

absl::StatusOr<v1::JobInfo> JobController::Submit(const v1::SubmitRequest& req, JobSpec spec,
                                                  const std::string& user,
                                                  const std::string& run_as, uint32_t run_as_uid,
                                                  bool admin) {
  if (!req.request_id().empty()) {
    if (const Job* repeat = jobs_->ByRequest(user, req.request_id())) return repeat->info();
  }
  RETURN_IF_ERROR(admission_.Check(spec, user, admin));
  Job job;
  job.spec = std::move(spec);
  job.rec.set_spec_yaml(req.spec_yaml());
  job.rec.set_request_id(req.request_id());
  v1::JobInfo& info = job.info();
  info.set_name(job.spec.name);
  info.set_state(v1::PENDING);
  info.set_total_steps(static_cast<int32_t>(job.spec.train.steps));
  info.set_submitted_at(TimeText(clock_->Now()));
  info.set_reason("waiting for slots");
  info.set_submitted_by(user);
  info.set_priority(job.spec.priority);
  info.set_run_as_user(run_as);
  if (run_as.empty()) info.set_run_as_uid(run_as_uid);
  info.set_profile_job(req.profile());
  Job& added = jobs_->Add(std::move(job), clock_->Now());
  LOG(INFO) << "job=" << added.info().id() << " submitted name=" << added.spec.name
            << (user.empty() ? "" : absl::StrCat(" by=", user));
  post_([this] { Schedule(); });
  return added.info();
}

absl::StatusOr<v1::JobInfo> JobController::Cancel(const std::string& id, const std::string& user) {
  ASSIGN_OR_RETURN(Job * found, jobs_->Get(id));
  Job& job = *found;
  if (!Terminal(job.info().state()) && job.info().state() != v1::CANCELLING) {
    job.info().set_cancelled_by(user);
  }
  switch (job.info().state()) {
    case v1::PENDING:
      MarkCancelled(job, "cancelled before it started");
      break;
    case v1::STARTING:
    case v1::RUNNING:
    case v1::RECONFIGURING:
      LOG(INFO) << JobWho(job.info()) << " CANCELLING";
      job.info().set_state(v1::CANCELLING);
      job.info().set_reason("cancel requested");
      job.cancelling_since = clock_->Now();
      job.gen.launch_pending.clear();
      job.rec.clear_morph();
      jobs_->Persist(job);
      SendStops(job);
      CheckAllExited(job);
      break;
    default:
      break;  // CANCELLING or finished: cancelling again changes nothing
  }
  return job.info();
}

void JobController::Schedule() {
  std::vector<std::string> order = sharing_ ? sharing_->StartOrder() : jobs_->order();
  if (!sharing_) {
    // Without a sharing: block, the queue is in submission order within each priority class.
    const auto& classes = config_.priority_classes;
    auto rank = [&](const std::string& id) {
      const Job* j = jobs_->Find(id);
      return j == nullptr
                 ? 0
                 : std::find(classes.begin(), classes.end(), j->spec.priority) - classes.begin();
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
    int position = 0;
    for (const std::string& id : order) {
      Job* j = jobs_->Find(id);
      if (j != nullptr) {
        j->info().set_queue_position(j->info().state() == v1::PENDING ? ++position : 0);
      }
    }
  }
  std::map<std::string, int> used = jobs_->UsedSlots();
  for (const std::string& id : order) {
    Job* found = jobs_->Find(id);
    if (found == nullptr || found->info().state() != v1::PENDING) continue;
    Job& job = *found;
    std::vector<FreeSlots> free;
    int largest = 0;  // a node's slots, used or not
    int total_free = 0;
    for (const auto& [name, n] : nodes_->all()) {
      if (!nodes_->Schedulable(n)) continue;
      largest = std::max(largest, n.rec.slots());
      const int f = n.rec.slots() - used[name];
      if (f > 0) free.push_back({name, f}), total_free += f;
    }
    // With sharing, a job starts at the width it was given, not on what is free while the
    // jobs it displaces still shrink (it would start small and soon be resized).
    if (const int alloc = job.info().allocated_slots(); sharing_ && total_free < alloc) {
      const std::string reason = absl::StrCat("starting: waiting for ", alloc - total_free,
                                              " of its ", alloc, " slots to be freed");
      if (job.info().reason() != reason) job.info().set_reason(reason);
      continue;
    }
    auto plan = PlanForJob(job, free, *profiles_);
    if (!plan.ok()) {
      // A tensor-parallel group lives on one node: none of the nodes there could ever hold it.
      const int tp = job.spec.parallel.tp_size;
      const std::string reason =
          tp > 1 && tp > largest
              ? absl::StrCat("waiting for a node of at least ", tp,
                             " slots (parallel.tp_size; a tensor-parallel group stays on one "
                             "node): the largest schedulable node has ",
                             largest)
              : absl::StrCat("waiting for slots: ", plan.status().message());
      if (plan.status().code() != absl::StatusCode::kResourceExhausted) {
        Fail(job, std::string(plan.status().message()));
      } else if (job.info().reason() != reason) {
        job.info().set_reason(reason);
      }
      continue;  // later, smaller jobs may still fit
    }
    for (const auto& p : plan->ranks) ++used[p.node()];
    StartJob(job, *plan);
  }
}

void JobController::StoreProfile(Job& job, const std::string& json) {
  if (!job.info().profile_job()) return;
  bool repeat = false;
  absl::StatusOr<v1::Profile> stored = profiles_->Store(json, job.spec, &repeat);
  if (!stored.ok()) {
    LOG(WARNING) << JobWho(job.info()) << " reported an unusable profile: " << stored.status();
    if (job.gen.worker_error.empty()) {
      job.gen.worker_error =
          absl::StrCat("unusable profile: ", stored.status().message()).substr(0, 500);
    }
    return;
  }
  job.gen.profile_stored = true;
  if (repeat) return;  // the same report again (after a manager restart)
  events_->Emit(
      "profile_stored", job.info().id(), "",
      absl::StrCat("profile of ", stored->model_key(), " (", stored->precision(), ", ",
                   stored->segments_size(), " segments) stored; jobs of this model plan with it"));
}

void JobController::StartJob(Job& job, const JobPlan& plan) {
  CHECK_EQ(job.info().state(), v1::PENDING);
  v1::JobInfo& info = job.info();
  info.set_state(v1::STARTING);
  info.set_queue_position(0);
  info.set_generation(info.generation() + 1);
  job.rec.set_evicted(false);
  info.set_reason("");
  ApplyPlan(info, plan, nodes_->Find(plan.ranks[0].node())->rec.address());
  info.set_started_at(TimeText(clock_->Now()));
  NewGeneration(job, clock_->Now());
  jobs_->Persist(job);
  events_->Emit("job_state", info.id(), "",
                absl::StrCat("STARTING ",
                             plan.pipelines.empty() ? absl::StrCat(plan.stages, "x", plan.replicas)
                                                    : absl::StrCat("pipelines ", plan.pipelines),
                             plan.tp_size > 1 ? absl::StrCat(" tp", plan.tp_size) : "", " mb",
                             plan.micro_batch));
  std::set<std::string> used_nodes;
  for (const auto& p : plan.ranks) used_nodes.insert(p.node());
  LOG(INFO) << JobWho(info) << " STARTING stages=" << plan.stages << " replicas=" << plan.replicas
            << " micro_batch=" << plan.micro_batch << " tp_size=" << plan.tp_size
            << " map=" << plan.stage_to_rank_map << " pipelines=" << plan.pipelines
            << " nodes=" << absl::StrJoin(used_nodes, ",");
  SendLaunches(job);
}

v1::LaunchRequest JobController::MakeLaunch(const Job& job, const std::string& node) const {
  const v1::JobInfo& info = job.info();
  v1::LaunchRequest req;
  req.set_job_id(info.id());
  req.set_generation(info.generation());
  req.set_job_name(info.name());
  req.set_spec_yaml(jobs_->SpecYaml(info.id()));
  req.set_world_size(info.slots());
  auto hp = SplitHostPort(info.master());
  req.set_master_addr(hp.ok() ? hp->first : "");
  req.set_master_port(hp.ok() ? hp->second : 0);
  req.set_stage_to_rank_map(info.stage_to_rank_map());
  req.set_pipelines(info.pipelines());
  req.set_run_as_user(info.run_as_user());
  req.set_run_as_uid(info.run_as_uid());
  req.set_micro_batch(info.micro_batch());
  // A profile job's shape is one sample per slot (the worker ignores it).
  req.set_per_replica_batch(
      std::max<int64_t>(1, job.spec.train.global_batch / std::max(1, info.replicas())));
  for (const auto& e : job.spec.entrypoint) req.add_entrypoint(e);
  for (const auto& [k, v] : job.spec.env) (*req.mutable_env())[k] = v;
  // Every generation after the first resumes from the newest complete checkpoint (a
  // morph's saves included); the first starts as the job spec says.
  if (info.generation() > 1 && !job.spec.checkpoint.dir.empty()) req.set_resume_step("auto");
  req.set_code_dir(job.spec.code_dir);
  // Bounded: it rides in the survivors' reconfigure command, whose line has a size limit.
  if (job.morphing()) req.set_why(job.rec.morph().record().reason().substr(0, 256));
  req.set_schedule(info.schedule());
  for (int b : info.boundaries()) req.add_stage_boundaries(b);
  req.set_profile(info.profile_job());
  // Note [Morph in place] in worker/engine/regroup.cc: workers that may regroup; the generation an
  // in-place morph launches adopts the survivors on this node and its fresh workers join by
  // hand-over.
  // A tp job relaunches (Note [Tensor parallelism] in worker/models/tensor_parallel.cc: no in-place
  // hand-over of split layers yet), and so does one whose next plan may split (tp_size auto).
  req.set_tp_size(TpOf(info));
  req.set_in_place(config_.morph_in_place && job.spec.entrypoint.empty() &&
                   job.spec.parallel.tp_size == 1 && morph_->Allowed(job));
  if (job.morphing() && job.rec.morph().in_place()) {
    req.set_join_in_place(true);
    for (const auto& a : job.rec.morph().adopted()) {
      if (a.node() != node) continue;
      v1::InPlaceRank* x = req.add_adopt();
      *x = a;
      x->clear_node();
    }
  }
  for (const auto& p : info.placement()) {
    if (p.node() != node) continue;
    v1::RankAssignment* a = req.add_ranks();
    a->set_rank(p.rank());
    a->set_local_rank(p.local_rank());
  }
  return req;
}

// Note [Launch order]: the node of rank 0 is launched first with master_port 0; its agent
// picks a free port, which the other nodes then get. A repeat (after a manager restart)
// gets the same port back, because the agent remembers what it picked per generation.
void JobController::SendLaunches(Job& job) {
  const v1::JobInfo& info = job.info();
  const std::string rank0_node = info.placement(0).node();
  auto hp = SplitHostPort(info.master());
  const bool port_known = hp.ok() && hp->second != 0;
  job.gen.launch_pending.clear();
  for (const auto& p : info.placement()) job.gen.launch_pending.insert(p.node());
  std::vector<std::string> targets;
  if (!port_known) {
    targets.push_back(rank0_node);
  } else {
    targets.assign(job.gen.launch_pending.begin(), job.gen.launch_pending.end());
  }
  for (const std::string& node_name : targets) {
    const NodeTable::NodeTable::Node* nit = nodes_->Find(node_name);
    if (nit == nullptr) continue;
    auto client = agents_->For(nit->rec.name(), nit->rec.address());
    const std::string id = info.id();
    const int gen = info.generation();
    client->Launch(MakeLaunch(job, node_name),
                   [this, id, gen, node_name](absl::StatusOr<v1::LaunchResponse> r) {
                     post_([this, id, gen, node_name, r = std::move(r)]() mutable {
                       OnLaunchDone(id, gen, node_name, std::move(r));
                     });
                   });
  }
}

void JobController::OnLaunchDone(const std::string& job_id, int generation, const std::string& node,
                                 absl::StatusOr<v1::LaunchResponse> r) {
  Job* found = jobs_->Find(job_id);
  if (found == nullptr) return;
  Job& job = *found;
  v1::JobInfo& info = job.info();
  const bool relaunch =
      info.state() == v1::RECONFIGURING && job.rec.morph().phase() == v1::MorphState::LAUNCHING;
  if (info.generation() != generation || (info.state() != v1::STARTING && !relaunch)) return;
  if (!r.ok()) {
    const std::string reason =
        absl::StrCat("launch on node ", node, " failed: ", r.status().message());
    const auto code = r.status().code();
    if (morph_->Allowed(job) && (code == absl::StatusCode::kUnavailable ||
                                 code == absl::StatusCode::kDeadlineExceeded || relaunch)) {
      nodes_->MarkUnreachable(node);
      Cause c;  // the node is unreachable: re-plan without it
      c.kind = "lost";
      c.reason = reason;
      c.leaving = {node};
      c.priority = 3;
      morph_->Trigger(job, c);
      return;
    }
    Fail(job, reason);
    return;
  }
  const bool first = SplitHostPort(info.master()).value_or(std::make_pair("", 0)).second == 0;
  job.gen.launch_pending.erase(node);
  if (first) {
    info.set_master(absl::StrCat(HostOf(info.master()), ":", r->master_port()));
    jobs_->Persist(job);
    SendLaunches(job);  // the rest, now that the port is known (a repeat here is harmless)
  }
  if (job.gen.launch_pending.empty()) MarkRunning(job);
}

void JobController::MarkRunning(Job& job) {
  const bool relaunch = job.info().state() == v1::RECONFIGURING &&
                        job.rec.morph().phase() == v1::MorphState::LAUNCHING;
  if (job.info().state() != v1::STARTING && !relaunch) return;
  job.info().set_state(v1::RUNNING);
  job.gen.running_since = clock_->Now();
  if (relaunch) morph_->SetPhase(job, v1::MorphState::RESUMING);
  LOG(INFO) << JobWho(job.info()) << " RUNNING master=" << job.info().master();
  jobs_->Persist(job);
  events_->Emit("job_state", job.info().id(), "",
                absl::StrCat("RUNNING generation ", job.info().generation(), " (",
                             job.info().stages(), "x", job.info().replicas(), ")"));
  CheckAllExited(job);  // a job can finish before its last launch was acknowledged
}

void JobController::SendStops(Job& job) {
  job.last_stop_sent = clock_->Now();
  std::set<std::string> nodes;
  for (const auto& p : job.info().placement()) nodes.insert(p.node());
  for (const std::string& name : nodes) {
    const NodeTable::NodeTable::Node* nit = nodes_->Find(name);
    if (nit == nullptr || nit->dead) continue;
    v1::StopRequest req;
    req.set_job_id(job.info().id());
    req.set_generation(job.info().generation());
    req.set_grace_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(config_.stop_grace)));
    const std::string who = JobWho(job.info());
    agents_->For(nit->rec.name(), nit->rec.address())
        ->Stop(req, [who, name](absl::StatusOr<v1::StopResponse> r) {
          if (!r.ok()) LOG(WARNING) << who << " stop on node " << name << ": " << r.status();
        });
  }
}

// Note [Launch failures that repeat]: a rank that exits 126 or 127 with the launcher's reason
// ("varuna-agent: the worker user ... cannot enter ...": Note [Launch failures] in
// agent/process_launcher.cc) never ran. A morph would place the job on the same machines,
// which fail the same way: once 20 morphs over 160 generations. So a launch failure does not
// start a morph at once: the manager waits up to three heartbeats for the generation's other
// ranks. If every rank failed to start, the job fails with the first reason and no morph;
// else the held morph starts (one node's problem: the others ran).
namespace {
bool IsLaunchFailure(int exit_code, int signal, const std::string& error) {
  return signal == 0 && (exit_code == 126 || exit_code == 127) &&
         absl::StartsWith(error, "varuna-agent: ");
}
}  // namespace

void JobController::RecordExit(Job& job, int rank, int exit_code, int signal,
                               const std::string& node, int64_t saved_step, int64_t committed_step,
                               int64_t pending_step, const std::string& error) {
  for (const auto& e : job.rec.exits()) {
    if (e.rank() == rank) return;  // already known
  }
  v1::RankExit* e = job.rec.add_exits();
  e->set_rank(rank);
  e->set_exit_code(exit_code);
  e->set_signal(signal);
  e->set_saved_step(saved_step);
  e->set_committed_step(committed_step);
  e->set_pending_step(pending_step);
  const v1::JobState s = job.info().state();
  const bool live = s == v1::STARTING || s == v1::RUNNING || s == v1::RECONFIGURING;
  if (live && signal == 0 && exit_code == kExitBadInput) {
    // Its input is wrong: no restart can fix that, so no morph (common/launch/exit_codes.h).
    Fail(job, absl::StrCat(
                  "rank ", rank, " on node ", node, " cannot run the job: ",
                  job.gen.worker_error.empty() ? "bad input (see its log)" : job.gen.worker_error));
    return;
  }
  if (live && morph_->Allowed(job)) {
    jobs_->Persist(job);
    const auto phase = job.rec.morph().phase();
    if (phase == v1::MorphState::SAVING || phase == v1::MorphState::STOPPING) {
      morph_->Advance(job);  // an exit the morph waits for
      return;
    }
    const std::string who = absl::StrCat("rank ", rank, " on node ", node);
    if (IsLaunchFailure(exit_code, signal, error) && job.gen.ready.empty()) {
      job.gen.launch_failed[rank] = absl::StrCat(who, ": ", error);
      if (static_cast<int>(job.gen.launch_failed.size()) >= job.info().placement_size()) {
        Fail(job, absl::StrCat("no rank could start (", job.gen.launch_failed.size(), " of ",
                               job.info().placement_size(),
                               "), so no morph: ", job.gen.launch_failed.begin()->second));
        return;
      }
      if (job.gen.launch_settle_at == absl::InfiniteFuture()) {
        job.gen.launch_settle_at =
            clock_->Now() + std::max(absl::Seconds(3), 3 * nodes_->heartbeat_period());
      }
      return;
    }
    if (exit_code != 0 || signal != 0) {
      Cause c;
      if (signal == 0 && exit_code == kExitRescued) {
        c.reason = absl::StrCat(who, " lost a peer mid-step and saved its last step");
        c.priority = 1;
      } else {
        c.reason = absl::StrCat(
            who, " ",
            signal != 0 ? absl::StrCat("was killed by ", SignalName(signal))
                        : absl::StrCat("exited with code ", exit_code),
            job.gen.worker_error.empty() ? "" : absl::StrCat(": ", job.gen.worker_error));
        c.priority = 2;
      }
      morph_->Trigger(job, c);
    } else if (job.gen.stopped_after > 0 && job.gen.stopped_after < job.spec.train.steps) {
      Cause c;
      c.reason =
          absl::StrCat("workers stopped on request (SIGUSR1) after step ", job.gen.stopped_after);
      c.graceful = true;
      c.priority = 2;
      morph_->Trigger(job, c);
    } else {
      CheckAllExited(job);
    }
    morph_->Advance(job);
    return;
  }
  if ((s == v1::STARTING || s == v1::RUNNING) && (exit_code != 0 || signal != 0)) {
    if (job.gen.pending_failure.empty()) {
      job.gen.pending_failure = absl::StrCat(
          "rank ", rank, " on node ", node, " ",
          signal != 0 ? absl::StrCat("was killed by ", SignalName(signal))
                      : absl::StrCat("exited with code ", exit_code),
          job.gen.worker_error.empty() ? "" : absl::StrCat(": ", job.gen.worker_error));
      job.gen.fail_at = clock_->Now() + 2 * nodes_->heartbeat_period();
    }
    jobs_->Persist(job);
    return;
  }
  jobs_->Persist(job);
  CheckAllExited(job);
}

void JobController::SettleFailure(Job& job) {
  const absl::Time now = clock_->Now();
  std::set<std::string> job_nodes;
  for (const auto& p : job.info().placement()) job_nodes.insert(p.node());
  for (const std::string& name : job_nodes) {
    const NodeTable::NodeTable::Node* it = nodes_->Find(name);
    if (it == nullptr) continue;
    const absl::Duration silent = now - it->last_seen;
    if (it->dead || silent >= 1.5 * nodes_->heartbeat_period()) {
      Fail(job, absl::StrCat("node ", name, " lost (no heartbeat for ",
                             absl::FormatDuration(absl::Trunc(silent, absl::Seconds(1))),
                             "; it ran ", RanksOn(job, name), "); then ", job.gen.pending_failure));
      return;
    }
  }
  if (job.gen.unreported && UnreportedReason(*job.gen.unreported) != job.gen.pending_failure) {
    // Its peers' exits were the consequence (their collectives lost the rank).
    Fail(job,
         absl::StrCat(UnreportedReason(*job.gen.unreported), "; then ", job.gen.pending_failure));
    return;
  }
  Fail(job, job.gen.pending_failure);
}

void JobController::CheckAllExited(Job& job) {
  if (job.rec.exits_size() < job.info().placement_size()) return;
  const v1::JobState s = job.info().state();
  if (s == v1::RUNNING) {
    if (job.info().profile_job() && !job.gen.profile_stored) {
      Fail(job, job.gen.worker_error.empty()
                    ? "the profile job ended without reporting a profile"
                    : absl::StrCat("no profile stored: ", job.gen.worker_error));
      return;
    }
    const int64_t steps = job.spec.train.steps;
    if (job.gen.stopped_after > 0 && job.gen.stopped_after < steps) {  // Note [Stopped on request]
      Fail(job, StoppedOnRequestReason(job.gen.stopped_after, steps, job.spec.checkpoint.dir));
      return;
    }
    Succeed(job);
  } else if (s == v1::CANCELLING) {
    MarkCancelled(job, "cancelled by request");
  }
}

void JobController::Succeed(Job& job) {
  if (job.info().state() != v1::RUNNING) return;
  job.info().set_state(v1::SUCCEEDED);
  job.info().set_reason("");
  job.info().set_finished_at(TimeText(clock_->Now()));
  LOG(INFO) << JobWho(job.info()) << " SUCCEEDED at step " << job.info().step();
  job.rec.clear_morph();
  jobs_->Persist(job);
  events_->Emit("job_state", job.info().id(), "",
                absl::StrCat("SUCCEEDED at step ", job.info().step()));
  post_([this] { Schedule(); });
}

void JobController::Fail(Job& job, const std::string& reason) {
  if (Terminal(job.info().state())) return;
  const bool had_workers = Active(job.info().state());
  job.info().set_state(v1::FAILED);
  job.info().set_reason(reason);
  job.info().set_finished_at(TimeText(clock_->Now()));
  job.gen.launch_pending.clear();
  job.rec.clear_morph();
  LOG(WARNING) << JobWho(job.info()) << " FAILED: " << reason;
  jobs_->Persist(job);
  events_->Emit("job_state", job.info().id(), "", absl::StrCat("FAILED: ", reason));
  if (had_workers) SendStops(job);
  post_([this] { Schedule(); });
}

void JobController::MarkCancelled(Job& job, const std::string& reason) {
  const v1::JobState s = job.info().state();
  if (s != v1::PENDING && s != v1::CANCELLING) return;
  job.info().set_state(v1::CANCELLED);
  job.info().set_reason(reason);
  job.info().set_finished_at(TimeText(clock_->Now()));
  LOG(INFO) << JobWho(job.info()) << " CANCELLED";
  jobs_->Persist(job);
  events_->Emit("job_state", job.info().id(), "", absl::StrCat("CANCELLED: ", reason));
  post_([this] { Schedule(); });
}

// Note [Node gone]: a lost node and a leaving one take this one route. Every job with ranks
// on it morphs off it (Cause kind "lost", "drain" or "notice"); a leaving node's workers still
// run, so its morph is graceful (they save at a step boundary), a lost one's is not and is
// pushed along at once. A lost node's ranks of a cancelling job count as killed, and a job
// that cannot morph fails; a leaving node's job that cannot morph is failed by Trigger.
void JobController::OnNodeGone(const NodeTable::Gone& gone) {
  const bool lost = gone.kind == "lost";
  if (lost) events_->Emit("node_lost", "", gone.node, gone.why);
  // The job's reason keeps whole seconds ("no heartbeat for 4s"); a source's reason as it is.
  const std::string what =
      lost && absl::StartsWith(gone.why, "no heartbeat")
          ? absl::StrCat("no heartbeat for ",
                         absl::FormatDuration(absl::Trunc(gone.silent, absl::Seconds(1))))
          : gone.why;
  for (auto& [id, job] : jobs_->all()) {
    const v1::JobState s = job.info().state();
    std::vector<int> ranks;
    for (const auto& p : job.info().placement()) {
      if (p.node() == gone.node) ranks.push_back(p.rank());
    }
    if (ranks.empty()) continue;
    if (lost) {
      if (!Active(s)) continue;
      if (s == v1::CANCELLING) {
        for (int r : ranks) RecordExit(job, r, 0, SIGKILL, gone.node);
        continue;
      }
    } else if (s != v1::STARTING && s != v1::RUNNING && s != v1::RECONFIGURING) {
      continue;
    }
    Cause c;
    c.kind = gone.kind;
    c.reason = lost ? absl::StrCat("node ", gone.node, " lost (", what, "; it ran ",
                                   RanksOn(job, gone.node), ")")
                    : gone.why;
    c.graceful = gone.graceful();
    c.leaving = {gone.node};
    c.detect = lost ? gone.silent : absl::ZeroDuration();
    c.priority = 3;
    if (lost && !morph_->Allowed(job)) {
      Fail(job, absl::StrCat(c.reason, job.gen.pending_failure.empty() ? "" : "; then ",
                             job.gen.pending_failure));
      continue;
    }
    morph_->Trigger(job, c);
    if (lost) morph_->Advance(job);
  }
}

void JobController::Tick() {
  const absl::Time now = clock_->Now();
  for (auto& [id, job] : jobs_->all()) {
    const v1::JobState s = job.info().state();
    if (s == v1::STARTING && now - job.gen.starting_since > config_.start_timeout) {
      Fail(job, absl::StrCat("workers did not start within ",
                             absl::FormatDuration(config_.start_timeout), " (no answer from ",
                             absl::StrJoin(job.gen.launch_pending, ","), ")"));
    } else if ((s == v1::STARTING || s == v1::RUNNING) && !job.gen.pending_failure.empty() &&
               now >= job.gen.fail_at) {
      SettleFailure(job);
    } else if (s == v1::CANCELLING && now - job.last_stop_sent > absl::Seconds(5)) {
      SendStops(job);                              // in case a Stop was lost; agents ignore repeats
    } else if (now >= job.gen.launch_settle_at) {  // Note [Launch failures that repeat]
      job.gen.launch_settle_at = absl::InfiniteFuture();
      if (Active(s) && !job.morphing() && morph_->Allowed(job)) {
        Cause c;
        c.reason = job.gen.launch_failed.begin()->second;
        c.priority = 2;
        morph_->Trigger(job, c);
        morph_->Advance(job);
      }
    }
    morph_->Tick(job);
  }
  if (now - last_flush_ >= absl::Seconds(10)) {
    last_flush_ = now;
    for (auto& [id, job] : jobs_->all()) {
      if (job.progress_dirty) jobs_->Persist(job);
    }
  }
}

}  // namespace varuna

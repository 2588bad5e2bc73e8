#include "manager/reconciler.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "glog/logging.h"

namespace varuna {

HeartbeatReconciler::HeartbeatReconciler(const ManagerConfig& config, Clock* clock, JobTable* jobs,
                                         NodeTable* nodes, JobController* jobs_ctl,
                                         MorphController* morph, Post post)
    : config_(config),
      clock_(clock),
      jobs_(jobs),
      nodes_(nodes),
      jobs_ctl_(jobs_ctl),
      morph_(morph),
      post_(std::move(post)) {}

absl::StatusOr<v1::RegisterResponse> HeartbeatReconciler::Register(const v1::RegisterRequest& req) {
  const auto used = jobs_->UsedSlots();
  RETURN_IF_ERROR(nodes_
                      ->Register(req,
                                 [&used](const std::string& n) {
                                   auto it = used.find(n);
                                   return it == used.end() ? 0 : it->second;
                                 })
                      .status());
  v1::RegisterResponse resp;
  resp.set_heartbeat_period_ms(absl::ToInt64Milliseconds(nodes_->heartbeat_period()));
  return resp;
}

namespace {

// A running worker of the generation before the current one that an in-place morph adopts
// (Note [Morph in place] in worker/engine/regroup.cc): its agent files it under the new generation
// when the launch arrives; until then it must not be stopped as stale.
bool AdoptedInPlace(const Job& job, const std::string& node, const v1::WorkerStatus& w) {
  if (!job.morphing() || !job.rec.morph().in_place()) return false;
  for (const auto& a : job.rec.morph().adopted()) {
    if (a.node() == node && a.old_generation() == w.generation() && a.old_rank() == w.rank()) {
      return true;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<v1::HeartbeatResponse> HeartbeatReconciler::Heartbeat(
    const v1::HeartbeatRequest& req) {
  ASSIGN_OR_RETURN(NodeTable::Node * found, nodes_->Heartbeat(req.name()));
  if (metrics_ && req.last_rtt_s() > 0 && std::isfinite(req.last_rtt_s())) {
    metrics_->OnHeartbeat(req.name(), req.last_rtt_s());
  }
  NodeTable::Node& node = *found;
  if (req.probe_score() > 0 && std::isfinite(req.probe_score())) {
    node.probe_score = req.probe_score();
  }
  if (req.has_preemption() && !node.rec.has_preemption()) {
    const std::string name = node.rec.name();
    const v1::PreemptionNotice notice = req.preemption();
    post_([this, name, notice] { nodes_->Preempt(name, notice).IgnoreError(); });
  }
  v1::HeartbeatResponse resp;
  resp.set_heartbeat_period_ms(absl::ToInt64Milliseconds(nodes_->heartbeat_period()));
  std::set<std::pair<std::string, int>> stop, release;
  std::set<std::pair<std::string, int>> reported;  // (job, rank) of current generations
  int other_running = 0;
  for (const v1::WorkerStatus& w : req.workers()) {
    const bool running = w.state() == v1::WORKER_RUNNING;
    Job* job = jobs_->Find(w.job_id());
    const bool current =
        job != nullptr && w.generation() == job->info().generation() && Active(job->info().state());
    if (!current && running && job != nullptr && AdoptedInPlace(*job, node.rec.name(), w)) {
      // The new generation takes it over (Note [Morph in place]); the steps it finished
      // before it parked still count, whenever their report arrives.
      jobs_ctl_->OnAdoptedWorkerReport(*job, w);
      continue;
    }
    if (!current) {
      // A stale generation, a finished job or one this manager never knew.
      if (running) {
        stop.insert({w.job_id(), w.generation()});
        ++other_running;
      } else {
        release.insert({w.job_id(), w.generation()});
      }
      continue;
    }
    // Note [Peer limits] (peer_limits.cc): a node speaks only for the ranks placed on it; anything
    // else is a confused or hostile agent and is ignored (it must not fail, finish or advance a
    // job).
    if (!PlacedOn(*job, node.rec.name(), w.rank())) {
      LOG(WARNING) << "node=" << node.rec.name() << " reported rank " << w.rank() << " of "
                   << JobWho(job->info()) << ", which is not placed there; ignored";
      continue;
    }
    reported.insert({w.job_id(), w.rank()});
    jobs_ctl_->OnWorkerReport(*job, w, node.rec.name());
  }
  node.other_running = other_running;
  CheckUnreported(node, reported);
  for (const auto& [id, gen] : stop) {
    v1::JobRef* r = resp.add_stop();
    r->set_job_id(id);
    r->set_generation(gen);
  }
  for (const auto& [id, gen] : release) {
    v1::JobRef* r = resp.add_release();
    r->set_job_id(id);
    r->set_generation(gen);
  }
  // Note [Durable step records] in agent/heartbeat_report.cc.
  std::set<std::string> reported_jobs;
  for (const v1::WorkerStatus& w : req.workers()) {
    if (reported_jobs.size() < 1000 && reported_jobs.insert(w.job_id()).second) {
      v1::DurableStep* d = resp.add_durable();
      d->set_job_id(w.job_id());
      d->set_step(jobs_->DurableStep(w.job_id()));
    }
  }
  return resp;
}

// A rank the job placed on this node that its agent no longer reports, neither running nor
// exited: the agent restarted (its workers died with it) or lost track of them. Without
// this the job would wait for that rank forever. Launches are acknowledged only after the
// workers exist, so a RUNNING job's ranks are in every heartbeat built after the ack; the
// two-period allowance covers a heartbeat that was already in flight, and a rank reported
// again later (a heartbeat slower than that) withdraws the charge. A CANCELLING job only
// waits for its ranks to be gone, so an unreported rank counts as killed.
void HeartbeatReconciler::CheckUnreported(const NodeTable::Node& node,
                                          const std::set<std::pair<std::string, int>>& reported) {
  const absl::Time now = clock_->Now();
  const std::string& name = node.rec.name();
  for (auto& [id, job] : jobs_->all()) {
    const v1::JobState state = job.info().state();
    if (state == v1::RUNNING && job.gen.unreported) {
      const auto& [node_name, rank] = *job.gen.unreported;
      if (node_name == name && reported.count({id, rank})) {
        LOG(INFO) << JobWho(job.info()) << " rank " << rank << " on node " << name
                  << " is reported again";
        if (job.gen.pending_failure == UnreportedReason(*job.gen.unreported)) {
          job.gen.pending_failure.clear();
          job.gen.fail_at = absl::InfiniteFuture();
        }
        job.gen.unreported.reset();
      }
      continue;
    }
    const auto phase = job.rec.morph().phase();
    const bool saving = state == v1::RECONFIGURING &&
                        (phase == v1::MorphState::SAVING || phase == v1::MorphState::STOPPING);
    const bool cancelling = state == v1::CANCELLING || saving;
    if (!cancelling && state != v1::RUNNING) continue;
    const absl::Time since =
        saving ? absl::UnixEpoch() + absl::Seconds(job.rec.morph().phase_since())
               : (state == v1::CANCELLING ? job.cancelling_since : job.gen.running_since);
    if (now - since < 2 * nodes_->heartbeat_period()) continue;
    std::vector<int> missing;
    for (const auto& p : job.info().placement()) {
      if (p.node() == name && !reported.count({id, p.rank()})) missing.push_back(p.rank());
    }
    if (missing.empty()) continue;  // the common case: no exit list to look at
    for (const auto& e : job.rec.exits()) {
      missing.erase(std::remove(missing.begin(), missing.end(), e.rank()), missing.end());
    }
    if (missing.empty()) continue;
    if (cancelling) {
      LOG(WARNING) << JobWho(job.info()) << " ranks " << absl::StrJoin(missing, ",") << " on node "
                   << name << " are no longer known to its agent; counted as gone";
      for (int r : missing) jobs_ctl_->RecordExit(job, r, 0, SIGKILL, name);
      continue;
    }
    job.gen.unreported = {name, missing.front()};
    const std::string reason = UnreportedReason(*job.gen.unreported);
    LOG(WARNING) << JobWho(job.info()) << " " << reason;
    if (morph_->Allowed(job)) {
      Cause c;
      c.kind = "lost";  // the agent no longer knows the rank
      c.reason = reason;
      c.priority = 3;
      morph_->Trigger(job, c);
      continue;
    }
    if (job.gen.pending_failure.empty()) {
      job.gen.pending_failure = reason;
      job.gen.fail_at = now + 2 * nodes_->heartbeat_period();
    }
  }
}

}  // namespace varuna

// MorphController's growth (the other half of manager/morph/morph_controller.cc): nodes that
// join, or come back, and the jobs that grow onto them after scale_up_delay; and the end of an
// eviction (the allocator's, manager/sharing).

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "manager/jobs/planning.h"
#include "manager/morph/morph_controller.h"

namespace varuna {

void MorphController::NoteJoined(const std::string& node) {
  joined_.insert(node);
  grow_check_at_ = clock_->Now() + config_.scale_up_delay;
  // A morph waiting for slots leaves out the nodes it lost. One that is back (a new agent: a
  // requeued Slurm allocation, a restarted machine; the old generation is gone by PLANNING)
  // may be planned on again, or a job whose every node was preempted would wait forever.
  for (const std::string& id : jobs_->order()) {
    Job& job = *jobs_->Find(id);
    if (job.info().state() != v1::RECONFIGURING ||
        job.rec.morph().phase() != v1::MorphState::PLANNING) {
      continue;
    }
    auto* lost = job.morph().mutable_lost_nodes();
    auto it = std::find(lost->begin(), lost->end(), node);
    if (it == lost->end()) continue;
    lost->erase(it);
    jobs_->Persist(job);
    LOG(INFO) << JobWho(job.info()) << " morph: node " << node << " is back; it may be planned on";
  }
}

// Jobs grow onto joined slots after scale_up_delay, by a graceful morph, only if the plan
// for the larger slot set differs from the shape they run (a morph that would not change
// the world is skipped). Pending jobs were scheduled first and took what they needed.
void MorphController::CheckGrowth() {
  if (config_.allocator_grows) return;  // Note [Allocation] in manager/sharing/allocator.cc
  if (clock_->Now() < grow_check_at_) return;
  grow_check_at_ = absl::InfiniteFuture();
  const std::string joined = absl::StrJoin(joined_, ",");
  joined_.clear();
  for (const std::string& id : jobs_->order()) {
    Job& job = *jobs_->Find(id);
    if (job.info().state() != v1::RUNNING || job.morphing() || !Allowed(job)) continue;
    auto plan = PlanForJob(job, jobs_->FreeSlotsFor(&job, {}), *profiles_);
    if (!plan.ok()) continue;
    const std::optional<Cause> c = GrowthCause(job.info(), *plan, joined);
    if (!c) continue;
    Trigger(job, *c);
  }
}

void MorphController::Requeue(Job& job) {
  v1::MorphState& m = job.morph();
  m.mutable_record()->set_note("evicted: back to PENDING, resumes from its checkpoint");
  *m.mutable_record()->mutable_to() = v1::Shape();
  const std::string reason = m.record().reason();
  job.gen.resumed_from = -1;  // its loss is known when it resumes, and counted by that morph
  Finish(job);
  job.rec.set_evicted(true);  // first of its class to start again (Finish kept it)
  v1::JobInfo& info = job.info();
  info.set_state(v1::PENDING);
  info.set_reason(reason);
  info.set_slots(0);
  info.clear_placement();
  info.set_allocated_slots(0);
  job.gen.launch_pending.clear();
  jobs_->Persist(job);
  LOG(WARNING) << JobWho(info) << " PENDING: " << reason;
  events_->Emit("job_state", info.id(), "", absl::StrCat("PENDING ", reason));
}

std::optional<Cause> GrowthCause(const v1::JobInfo& info, const JobPlan& plan,
                                 const std::string& joined) {
  const int now_slots = info.slots();
  const int plan_slots = static_cast<int>(plan.ranks.size());
  if (plan_slots <= now_slots) return std::nullopt;
  if (plan.stages == info.stages() && plan.replicas == info.replicas() &&
      plan.micro_batch == info.micro_batch() && plan.schedule == info.schedule() &&
      plan.pipelines == info.pipelines() && plan.tp_size == TpOf(info)) {
    return std::nullopt;
  }
  Cause c;
  c.kind = "join";
  c.reason = absl::StrCat("node(s) ", joined, " joined: ", plan_slots,
                          " slots available (running on ", now_slots, ")");
  c.graceful = true;
  c.priority = 3;
  return c;
}

}  // namespace varuna

#include "manager/sharing/sharing_controller.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/planner/autoconfig.h"
#include "common/planner/profile.h"
#include "glog/logging.h"

namespace varuna {
namespace {

bool FixedShape(const JobSpec& s) {
  return !s.parallel.pipelines.empty() || (s.parallel.stages > 0 && s.parallel.replicas > 0);
}

int FixedWorld(const JobSpec& s) {
  int n = 0;
  if (!s.parallel.pipelines.empty()) {
    for (const auto& p : s.parallel.pipelines) n += p.count * static_cast<int>(p.stages.size());
  } else {
    n = s.parallel.stages * s.parallel.replicas;
  }
  return n * std::max(1, s.parallel.tp_size);
}

std::string UserText(const std::string& user) { return user.empty() ? std::string("-") : user; }

}  // namespace

SharingController::SharingController(SharingOptions options, Clock* clock, JobTable* jobs,
                                     NodeTable* nodes, EventLog* events, ProfileStore* profiles,
                                     JobMorphing* morph)
    : options_(std::move(options)),
      policy_(options_.Policy()),
      clock_(clock),
      jobs_(jobs),
      nodes_(nodes),
      events_(events),
      profiles_(profiles),
      morph_(morph) {}

bool SharingController::Bendable(const Job& job) const {
  return morph_->Allowed(job) && !FixedShape(job.spec) && !job.info().profile_job();
}

const std::vector<double>& SharingController::CurveOf(const Job& job,
                                                      const std::vector<int>& slots_per_node) {
  static const std::vector<double> kNone;
  const v1::Profile* stored = profiles_->Find(job.spec);
  // Note [Curves]: what the simulation depends on, so jobs of one model and shape share a
  // curve: the model, the batch, the parallel settings, the cluster's layout, the profile.
  const ParallelSpec& par = job.spec.parallel;
  const std::string key = absl::StrCat(
      ModelKey(job.spec.model), "/", job.spec.train.precision, "/", job.spec.train.global_batch,
      "/", par.stages, "x", par.replicas, "/", par.micro_batch, "/", par.tp_size, "/", par.schedule,
      "/", absl::StrJoin(slots_per_node, ","), stored ? "/p" : "/b");
  auto found = curves_.find(key);
  if (found != curves_.end()) return found->second;
  // A decision spends at most kCurveBudget simulating new curves; jobs left over are taken as
  // linear for now, and the next decision (at once: curves_pending_) simulates them.
  constexpr absl::Duration kCurveBudget = absl::Milliseconds(200);
  if (curve_time_ >= kCurveBudget) {
    curves_pending_ = true;
    return kNone;
  }
  const absl::Time began = absl::Now();
  std::vector<double>& rate = curves_[key];
  SimulateCurve(job.spec, stored, slots_per_node, &rate);
  curve_time_ += absl::Now() - began;
  return rate;
}

void SharingController::SimulateCurve(const JobSpec& job_spec, const v1::Profile* stored,
                                      const std::vector<int>& slots_per_node,
                                      std::vector<double>* out) {
  std::vector<double>& rate = *out;
  absl::StatusOr<v1::Profile> builtin;
  if (stored == nullptr) {
    builtin = BuiltinProfile(job_spec);
    if (!builtin.ok()) return;
  }
  PlanRequest req;
  req.slots_per_node = slots_per_node;
  req.all = true;  // the best shape at every width, not only the widest of each stage count
  req.best_per_width = true;
  req.simulate_within = 1;
  // Widths past the budget count with their lower bound (the widest, fastest go first).
  req.max_simulated_tasks = 4'000'000;
  req.budget_s = 0.2;
  JobSpec spec = job_spec;
  spec.resources.max_slots = 0;
  spec.resources.min_slots = 1;
  auto set = PlanShapes(spec, stored ? *stored : *builtin, req);
  if (!set.ok()) return;
  int total = 0;
  for (int s : slots_per_node) total += s;
  rate.assign(total + 1, 0);
  // A shape the planner only bounded (far slower than the best) still runs: its bound counts
  // where no simulated shape has that width.
  std::vector<double> bound(total + 1, 0);
  for (const v1::Plan& p : set->plans()) {
    if (!p.rejected().empty() || p.slots() <= 0 || p.slots() > total) continue;
    double& r = p.lower_bound() ? bound[p.slots()] : rate[p.slots()];
    r = std::max(r, p.samples_per_s());
  }
  for (int w = 1; w <= total; ++w) {
    if (rate[w] <= 0) rate[w] = bound[w];
  }
  for (int w = 1; w <= total; ++w) rate[w] = std::max(rate[w], rate[w - 1]);
  if (rate[total] <= 0) rate.clear();
}

std::vector<AllocJob> SharingController::Inputs(const std::vector<int>& slots_per_node) {
  const absl::Time now = clock_->Now();
  std::vector<AllocJob> out;
  for (const std::string& id : jobs_->order()) {
    const Job& job = *jobs_->Find(id);
    const v1::JobInfo& info = job.info();
    if (Terminal(info.state())) continue;
    AllocJob a;
    a.id = id;
    a.user = info.submitted_by();
    a.class_rank = std::max(0, options_.ClassRank(job.spec.priority));
    if (options_.ClassRank(job.spec.priority) < 0) {
      a.class_rank = static_cast<int>(options_.classes.size()) - 1;  // a class since removed
    }
    a.running = info.state() != v1::PENDING;
    // A job in a morph holds its old slots until it relaunches; the allocator counts the width
    // it is becoming (its plan is capped at it), or a resize would be undone while it runs.
    a.current = !a.running                                     ? 0
                : job.morphing() && info.allocated_slots() > 0 ? info.allocated_slots()
                                                               : info.slots();
    a.seq = job.rec.seq();
    a.evicted = job.rec.evicted();
    a.bendable = info.state() != v1::CANCELLING && Bendable(job);
    a.pinned =
        a.running && job.rec.resized_at() > 0 &&
        UnixSeconds(now) - job.rec.resized_at() < absl::ToDoubleSeconds(options_.min_interval);
    if (FixedShape(job.spec)) {
      a.min = a.max = FixedWorld(job.spec);
    } else {
      a.min = std::max(1, job.spec.resources.min_slots);
      a.max = job.spec.resources.max_slots;
      if (options_.enabled && (a.bendable || !a.running)) a.rate = CurveOf(job, slots_per_node);
    }
    if (!a.running && a.evicted && job.rec.resized_at() > 0) {
      a.waiting_s = UnixSeconds(now) - job.rec.resized_at();  // since its eviction
    } else if (!a.running) {
      absl::Time since;
      std::string err;
      if (absl::ParseTime("%Y-%m-%dT%H:%M:%SZ", info.submitted_at(), &since, &err)) {
        a.waiting_s = absl::ToDoubleSeconds(now - since);
      }
    }
    out.push_back(std::move(a));
  }
  return out;
}

std::vector<std::string> SharingController::StartOrder() {
  std::vector<int> slots_per_node;
  int capacity = 0;
  for (const auto& [name, n] : nodes_->all()) {
    // Every slot of a schedulable node: workers still exiting (other_running, a resized job's
    // old ranks) hold slots for seconds, and counting them out would shrink or evict jobs for
    // nothing. Starts and grows wait for the slots to be free (Schedule, Apply).
    if (!nodes_->Schedulable(n) || n.rec.slots() <= 0) continue;
    slots_per_node.push_back(n.rec.slots());
    capacity += n.rec.slots();
  }
  std::string fp = absl::StrCat(capacity, ";");
  for (const std::string& id : jobs_->order()) {
    const Job& job = *jobs_->Find(id);
    if (Terminal(job.info().state())) continue;
    absl::StrAppend(&fp, id, ":", job.info().state(), ":", job.info().slots(), ":", job.morphing(),
                    ";");
  }
  const absl::Time now = clock_->Now();
  if (fp != fingerprint_ || now - decided_at_ >= options_.period || curves_pending_) {
    fingerprint_ = std::move(fp);
    decided_at_ = now;
    capacity_ = capacity;
    curve_time_ = absl::ZeroDuration();
    curves_pending_ = false;
    if (curves_.size() > 4096) curves_.clear();  // layouts come and go: keep it bounded
    decision_ = Allocate(Inputs(slots_per_node), capacity, policy_);
    Apply();
  }
  std::vector<std::string> order;
  for (const std::string& id : decision_.queue) {
    auto it = decision_.target.find(id);
    if (it != decision_.target.end() && it->second > 0) order.push_back(id);
  }
  return order;
}

void SharingController::Apply() {
  // Who the changes are for: pending jobs that start, then running ones that grow.
  std::vector<std::string> gainers;
  for (const std::string& id : jobs_->order()) {
    const Job& job = *jobs_->Find(id);
    const int t = decision_.target[id];
    if (!Terminal(job.info().state()) && t > job.info().slots()) {
      gainers.push_back(absl::StrCat("job ", id, " (", job.spec.priority, ", user ",
                                     UserText(job.info().submitted_by()), ")"));
    }
  }
  const std::string for_whom =
      gainers.empty() ? std::string("the cluster's other jobs")
                      : absl::StrJoin(gainers.begin(),
                                      gainers.begin() + std::min<size_t>(3, gainers.size()), ", ");
  std::map<std::string, int> position;
  for (const std::string& id : decision_.queue) position.emplace(id, position.size() + 1);
  bool shrinking = false;
  for (const std::string& id : jobs_->order()) {
    Job& job = *jobs_->Find(id);
    v1::JobInfo& info = job.info();
    if (Terminal(info.state())) continue;
    const int t = decision_.target[id];
    const std::string& why = decision_.why[id];
    if (info.allocated_slots() != t) {
      info.set_allocated_slots(t);
      jobs_->Persist(job);
    }
    info.set_queue_position(info.state() == v1::PENDING ? position[id] : 0);
    if (info.state() == v1::PENDING) {
      const std::string reason =
          t > 0 ? absl::StrCat("starting with ", t, " slots") : absl::StrCat("waiting: ", why);
      if (t == 0 && info.reason() != reason) info.set_reason(reason);
      continue;
    }
    if (job.morphing()) {
      const std::string& kind = job.rec.morph().record().kind();
      shrinking |= kind == "evict" || (kind == "resize" && t < info.slots());
      continue;
    }
    if (info.state() != v1::RUNNING || !Bendable(job) || t >= info.slots()) continue;
    Resize(job, t, why, for_whom);
    shrinking = true;
  }
  if (shrinking) return;  // grows wait for every shrink to free its slots
  int free = capacity_;
  for (const auto& [node, n] : jobs_->UsedSlots()) free -= n;
  for (const std::string& id : jobs_->order()) {
    Job& job = *jobs_->Find(id);
    const int t = decision_.target[id];
    if (job.info().state() != v1::RUNNING || job.morphing() || !Bendable(job) ||
        t <= job.info().slots() || t - job.info().slots() > free) {
      continue;
    }
    free -= t - job.info().slots();
    Resize(job, t, "", "");
  }
}

void SharingController::Resize(Job& job, int target, const std::string& why,
                               const std::string& for_whom) {
  v1::JobInfo& info = job.info();
  const int from = info.slots();
  Cause c;
  c.graceful = true;
  c.priority = 3;
  job.rec.set_resized_at(UnixSeconds(clock_->Now()));
  if (target == 0) {
    c.kind = "evict";
    c.reason = absl::StrCat("evicted for ", for_whom, ": ", why);
    for (const auto& p : info.placement()) c.leaving.insert(p.node());
    job.rec.set_evicted(true);
    events_->Emit("job_evicted", info.id(), "", c.reason);
  } else {
    c.kind = "resize";
    c.reason = target < from ? absl::StrCat("resized ", from, " -> ", target, " slots for ",
                                            for_whom, why.empty() ? "" : absl::StrCat(": ", why))
                             : absl::StrCat("resized ", from, " -> ", target,
                                            " slots: the allocator gives it room that is free");
    events_->Emit("job_resized", info.id(), "", c.reason);
  }
  LOG(INFO) << JobWho(info) << " sharing: " << c.reason;
  jobs_->Persist(job);
  morph_->Trigger(job, c);
}

}  // namespace varuna

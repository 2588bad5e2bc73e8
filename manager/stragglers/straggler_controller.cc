#include "manager/stragglers/straggler_controller.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/pipeline/schedule.h"
#include "common/planner/autoconfig.h"
#include "common/planner/profile.h"
#include "common/planner/tp_plan.h"
#include "glog/logging.h"
#include "manager/jobs/planning.h"
#include "manager/stragglers/ladder.h"

namespace varuna {

// Note [Straggler ladder]: once a job's detector has a full window (Note [Straggler
// detection]), a node below stragglers.slow_below is a straggler. Policy `report` stops at an
// event; `auto` (the default) climbs a ladder (as soon as a node is slow, then at most once
// per window), each rung only when it pays:
//  1. tolerate: the simulator (with the measured speeds, Note [Speed-aware plans]) predicts
//     the current plan, a plan that works around the slow node (rebalance: fewer layers or a
//     smaller batch share for it) and the best plan without it (evict). Unless the better of
//     the two is at least min_gain faster, and its saving over the steps left (scaled to
//     measured seconds by the current step's measured/predicted ratio) exceeds what a morph
//     costs this job (its morphs' measured total; 5 s before the first), nothing happens.
//  2. rebalance: the job's record keeps the node's speed (JobRecord.stragglers.speeds), and
//     a graceful morph (kind "straggler") re-plans: the planner, and every later plan of the
//     job, sees the node as slow.
//  3. evict: the node goes into JobRecord.stragglers.evicted (FreeSlotsFor leaves it out of
//     this job's plans) and a graceful morph moves off it, as a drain does.
//  4. re-admit: a rebalanced node measured at recovered_above for probation_s loses its
//     speed factor (a morph of kind "recovered" when the plan changes): with less work a
//     node may look fast while what slows it persists (a neighbour taking a fixed share). An
//     evicted node is probed after probation_s (Note [Speed probe] in agent/probe.cc): at
//     recovered_above of its baseline it is re-admitted (kind "recovered", when the job can use
//     it); otherwise the probation doubles (up to an hour).
// Each action's morph record carries the kind and the measured speeds; the event stream says
// what was predicted for each rung. Against flapping: the thresholds (slow_below <
// recovered_above) leave a band in which nothing changes; a node already planned around keeps
// the speed its plan used until it is measured outside 2x of it (kReplanFactor); the ladder
// runs once per window, and not before two windows of a generation it made; and it never
// spends more than half of the job's morph budget
// (max_morphs within morph_window_s), which is there for failures.

namespace {

// A morph's cost before the job has measured one: above what a morph costs here in place
// (about 1 s) or by relaunch (about 3 s), docs/benchmarks.md (f).
constexpr double kDefaultMorphCostS = 5;
constexpr double kMaxProbationS = 3600;
// A node planned around at speed s is re-planned only when measured outside [s/2, 2 s].
constexpr double kReplanFactor = 2;

std::string SpeedText(double s) { return absl::StrFormat("%.2fx", s); }

std::string PlanText(const JobPlan& p) {
  std::string shape = p.pipelines.empty() ? absl::StrCat(p.stages, "x", p.replicas)
                                          : absl::StrCat(p.replicas, " pipelines ", p.pipelines);
  return absl::StrCat(shape, " on ", p.ranks.size(), " slots");
}

}  // namespace

StragglerController::StragglerController(StragglerOptions options, Clock* clock, JobTable* jobs,
                                         NodeTable* nodes, AgentClientPool* agents, Post post,
                                         EventLog* events, ProfileStore* profiles,
                                         JobMorphing* morph)
    : config_(std::move(options)),
      clock_(clock),
      jobs_(jobs),
      nodes_(nodes),
      agents_(agents),
      post_(std::move(post)),
      events_(events),
      profiles_(profiles),
      morph_(morph) {}

absl::StatusOr<v1::Profile> StragglerController::CostsOf(const Job& job) const {
  absl::StatusOr<v1::Profile> profile = ProfileForStragglers(job, *profiles_);
  return profile.ok() ? profile : BuiltinProfile(job.spec);
}

StragglerSpec StragglerController::Settings(const Job& job) const {
  return ResolveStragglers(job.spec.stragglers, config_.stragglers);
}

StragglerController::JobState& StragglerController::StateFor(const Job& job) {
  JobState& st = jobs_state_[job.info().id()];
  if (st.generation == job.info().generation()) return st;
  st.generation = job.info().generation();
  st.detector.reset();
  st.speeds.clear();
  st.links.clear();
  st.step_times.clear();
  st.decided_at_step = 0;
  absl::StatusOr<v1::Profile> profile = CostsOf(job);
  if (!profile.ok()) return st;
  // A tp job's ranks here are positions, each a tp group (Note [Tensor-parallel plans]).
  profile = TensorParallelProfile(*profile, job.spec.model, TpOf(job.info()));
  if (!profile.ok()) return st;
  auto ranks = RanksOf(job.info(), *profile, job.spec.train.global_batch);
  if (!ranks.ok()) {
    LOG(INFO) << JobWho(job.info()) << " no straggler detection: " << ranks.status().message();
    return st;
  }
  std::set<std::string> planned_slow;
  for (const auto& n : job.rec.stragglers().speeds()) planned_slow.insert(n.node());
  st.detector = std::make_unique<StragglerDetector>(*std::move(ranks), Settings(job).window_steps,
                                                    planned_slow);
  return st;
}

void StragglerController::OnSteps(Job& job, const v1::WorkerStatus& w) {
  if (w.steps().empty() || w.generation() != job.info().generation()) return;
  if (Settings(job).policy == "off" || job.info().profile_job()) return;
  JobState& st = StateFor(job);
  if (st.detector == nullptr) return;
  bool took = false;
  for (const v1::StepMetrics& s : w.steps()) {
    const std::vector<double> busy(s.rank_busy_s().begin(), s.rank_busy_s().end());
    const std::vector<double> wait(s.rank_wait_s().begin(), s.rank_wait_s().end());
    if (!st.detector->Add(s.step(), busy, wait)) continue;
    took = true;
    if (std::isfinite(s.step_time_s()) && s.step_time_s() > 0) {
      st.step_times.push_back(s.step_time_s());
      if (st.step_times.size() > 20) st.step_times.erase(st.step_times.begin());
    }
  }
  if (took && st.detector->full()) Decide(job, st);
}

void StragglerController::Decide(Job& job, JobState& st) {
  const StragglerSpec s = Settings(job);
  const std::string& id = job.info().id();
  st.speeds = st.detector->Speeds(s.slow_below / 2);
  if (metrics_) metrics_->SetNodeSpeeds(id, st.speeds);
  std::set<std::string> slow;
  for (const auto& [node, speed] : st.speeds) {
    if (speed < s.slow_below) slow.insert(node);
  }
  for (const std::string& node : slow) {
    if (!st.reported.insert(node).second) continue;
    const std::string msg = absl::StrCat("node ", node, " computes at ", SpeedText(st.speeds[node]),
                                         " its peers' speed (median of ", s.window_steps, " steps)",
                                         s.policy == "report" ? "; policy report: no action" : "");
    LOG(WARNING) << JobWho(job.info()) << " straggler: " << msg;
    events_->Emit("straggler", id, node, msg);
  }
  for (auto it = st.reported.begin(); it != st.reported.end();) {
    auto sp = st.speeds.find(*it);
    if (sp != st.speeds.end() && sp->second >= s.recovered_above) {
      events_->Emit("straggler_cleared", id, *it,
                    absl::StrCat("node ", *it, " computes at ", SpeedText(sp->second),
                                 " its peers' speed again"));
      it = st.reported.erase(it);
    } else {
      ++it;
    }
  }
  for (const std::string& link : st.detector->SlowLinks(s.slow_below)) {
    if (st.links.insert(link).second) events_->Emit("straggler_link", id, "", link);
  }
  if (s.policy != "auto" || !morph_->Allowed(job) || job.info().state() != v1::RUNNING ||
      job.morphing()) {
    return;
  }
  // The ladder runs as soon as a node is slow, then at most once per window (its plans cost
  // milliseconds, and a decision needs fresh measurements).
  const int64_t step = job.gen.newest_step;
  if (st.decided_at_step > 0 && step - st.decided_at_step < s.window_steps) return;
  // A generation the ladder made settles for two windows before the ladder runs again.
  const auto& morphs = job.info().morphs();
  if (!morphs.empty() && morphs.rbegin()->generation() == job.info().generation() &&
      (morphs.rbegin()->kind() == "straggler" || morphs.rbegin()->kind() == "recovered") &&
      st.detector->steps() < 2 * s.window_steps) {
    return;
  }
  for (const auto& n : job.rec.stragglers().speeds()) {
    auto it = st.speeds.find(n.node());
    if (it == st.speeds.end() || it->second < s.recovered_above) {
      st.fast_since.erase(n.node());
      continue;
    }
    const absl::Time since = st.fast_since.emplace(n.node(), clock_->Now()).first->second;
    if (clock_->Now() - since >= absl::Seconds(s.probation_s)) {
      st.decided_at_step = step;
      Recover(job, st, std::string(n.node()), it->second);  // a copy: Recover removes n
      return;
    }
  }
  if (slow.empty()) return;
  st.decided_at_step = step;
  Ladder(job, st, slow);
}

// The predicted step of the job's running topology, as placed, with `speeds` for its nodes
// (1 for the others).
absl::StatusOr<double> StragglerController::PredictRunning(
    const Job& job, const v1::Profile& profile, const std::map<std::string, double>& speeds) const {
  const v1::JobInfo& info = job.info();
  auto topo = TopologyOf(info, profile, job.spec.train.global_batch);
  auto policy = ParseSchedulePolicy(info.schedule().empty() ? "varuna" : info.schedule());
  if (!topo.ok()) return topo.status();
  if (!policy.ok()) return policy.status();
  PlanRequest req;
  std::map<std::string, int> index;
  std::vector<int> node_of(topo->world_size(), 0);
  const int tp = TpOf(info);  // the topology's ranks are positions of tp processes
  for (const auto& p : info.placement()) {
    if (p.rank() % tp != 0) continue;
    auto [it, fresh] = index.emplace(p.node(), static_cast<int>(index.size()));
    if (fresh) {
      req.slots_per_node.push_back(0);
      req.node_speed.push_back(speeds.count(p.node()) ? speeds.at(p.node()) : 1.0);
    }
    ++req.slots_per_node[it->second];
    if (p.rank() >= 0 && p.rank() / tp < topo->world_size()) node_of[p.rank() / tp] = it->second;
  }
  // The plan running now, in tp groups (the planner below derives the same costs itself).
  auto groups = TensorParallelProfile(profile, job.spec.model, tp);
  if (!groups.ok()) return groups.status();
  auto now_plan = SimulateTopology(job.spec, *groups, *topo, std::max(1, info.micro_batch()),
                                   *policy, node_of, req);
  if (!now_plan.ok()) return now_plan.status();
  return now_plan->step_s();
}

void StragglerController::Ladder(Job& job, JobState& st, const std::set<std::string>& slow) {
  const StragglerSpec s = Settings(job);
  const v1::JobInfo& info = job.info();
  absl::StatusOr<v1::Profile> profile = CostsOf(job);
  auto cannot = [&](const std::string& why) {
    if (st.no_plan == why) return;
    st.no_plan = why;
    events_->Emit("straggler_tolerated", info.id(), "",
                  absl::StrCat("cannot plan around it: ", why));
  };
  if (!profile.ok()) return cannot(std::string(profile.status().message()));
  // The speeds the planner sees: the measured ones of slow nodes, 1 for the rest (their
  // noise is not planned for). A node the job already plans around keeps the speed its plan
  // used unless the measurement moved past kReplanFactor of it: a node measured at 0.3 and
  // then 0.5 is the same straggler, not a reason for another morph.
  std::map<std::string, double> speeds;
  for (const std::string& n : slow) speeds[n] = st.speeds[n];
  for (const auto& n : job.rec.stragglers().speeds()) {
    auto it = st.speeds.find(n.node());
    if (it == st.speeds.end()) continue;
    const double ratio = it->second / n.speed();
    speeds[n.node()] = ratio < kReplanFactor && ratio > 1 / kReplanFactor ? n.speed() : it->second;
  }
  // Morphs for stragglers never spend the budget that keeps a job alive through failures
  // (max_morphs within morph_window): past half of it, the node is tolerated.
  const int recent =
      static_cast<int>(RecentMorphs(job, clock_->Now(), config_.morph_window).size());
  // Now: the running topology, as placed, with those speeds.
  absl::StatusOr<double> predicted_now = PredictRunning(job, *profile, speeds);
  if (!predicted_now.ok()) return cannot(std::string(predicted_now.status().message()));
  const double now_s = *predicted_now;
  auto rebalanced = PlanWithProfile(job.spec, jobs_->FreeSlotsFor(&job, {}), &*profile, speeds);
  auto evicted = PlanWithProfile(job.spec, jobs_->FreeSlotsFor(&job, slow), &*profile, speeds);
  const double inf = std::numeric_limits<double>::infinity();
  // A plan without a prediction (fixed parallel.pipelines: the placement rule) is no option.
  auto predicted = [&](const absl::StatusOr<JobPlan>& p) {
    return p.ok() && p->predicted_step_s > 0 ? p->predicted_step_s : inf;
  };
  const double reb_s = predicted(rebalanced);
  const double ev_s = predicted(evicted);
  std::vector<std::string> parts;
  for (const std::string& n : slow) {
    parts.push_back(absl::StrCat("node ", n, " at ", SpeedText(st.speeds[n])));
  }
  auto option = [&](const absl::StatusOr<JobPlan>& p, double s) {
    if (!p.ok()) return absl::StrCat("impossible (", p.status().message(), ")");
    if (s == inf) return absl::StrCat("not predicted (", p->source, ")");
    return absl::StrFormat("%.3f s (%s)", s, PlanText(*p));
  };
  std::string text = absl::StrFormat(
      "%s its peers' speed: predicted step %.3f s now; rebalanced %s; without %s %s",
      absl::StrJoin(parts, ", "), now_s, option(rebalanced, reb_s), absl::StrJoin(slow, ","),
      option(evicted, ev_s));
  LadderInput in;
  in.now_s = now_s;
  in.rebalanced_s = reb_s;
  in.evicted_s = ev_s;
  in.measured_s = Median(st.step_times);
  in.steps_left = std::max<int64_t>(0, info.total_steps() - job.gen.newest_step);
  in.recent_morphs = recent;
  in.max_morphs = config_.max_morphs;
  in.min_gain = s.min_gain;
  in.morph_cost_s = MorphCost(job);
  const LadderDecision decision = DecideLadder(in);
  const std::string& why_not = decision.why_not;
  if (!why_not.empty()) {
    // Once per slow set and reason, not every window (the numbers move with every window).
    const std::string key = absl::StrCat(absl::StrJoin(slow, ","), why_not.substr(0, 8));
    if (st.no_plan != key) {
      st.no_plan = key;
      events_->Emit("straggler_tolerated", info.id(), "",
                    absl::StrCat(text, "; tolerated: ", why_not));
    }
    return;
  }
  std::map<std::string, double> measured_speeds = st.speeds;
  v1::StragglerState& rec = *job.rec.mutable_stragglers();
  if (decision.action == LadderAction::kEvict) {
    const double now = UnixSeconds(clock_->Now());
    for (const std::string& n : slow) {
      v1::EvictedNode* e = rec.add_evicted();
      e->set_node(n);
      e->set_speed(st.speeds[n]);
      e->set_probation_s(s.probation_s);
      e->set_probe_after(now + s.probation_s);
    }
    auto* sp = rec.mutable_speeds();
    sp->erase(std::remove_if(sp->begin(), sp->end(),
                             [&](const v1::NodeSpeed& n) { return slow.count(n.node()) > 0; }),
              sp->end());
    Trigger(job, "straggler", absl::StrCat(text, "; evict ", absl::StrJoin(slow, ",")), slow,
            measured_speeds);
  } else {
    rec.clear_speeds();
    for (const auto& [n, v] : speeds) {
      v1::NodeSpeed* ns = rec.add_speeds();
      ns->set_node(n);
      ns->set_speed(v);
    }
    Trigger(job, "straggler", absl::StrCat(text, "; rebalance"), {}, measured_speeds);
  }
}

void StragglerController::Recover(Job& job, JobState& st, std::string node, double speed) {
  auto* sp = job.rec.mutable_stragglers()->mutable_speeds();
  sp->erase(std::remove_if(sp->begin(), sp->end(),
                           [&](const v1::NodeSpeed& n) { return n.node() == node; }),
            sp->end());
  st.reported.erase(node);
  st.fast_since.erase(node);
  const std::string reason = absl::StrCat("node ", node, " computes at ", SpeedText(speed),
                                          " its peers' speed again: planned at full speed");
  auto plan = PlanForJob(job, jobs_->FreeSlotsFor(&job, {}), *profiles_);
  const v1::JobInfo& info = job.info();
  if (plan.ok() &&
      (plan->stages != info.stages() || plan->replicas != info.replicas() ||
       plan->micro_batch != info.micro_batch() || plan->pipelines != info.pipelines() ||
       plan->ranks.size() != static_cast<size_t>(info.slots()))) {
    Trigger(job, "recovered", reason, {}, st.speeds);
    return;
  }
  events_->Emit("straggler_recovered", info.id(), node, absl::StrCat(reason, " (same plan)"));
  jobs_->Persist(job);
}

void StragglerController::Trigger(Job& job, const std::string& kind, const std::string& reason,
                                  std::set<std::string> leaving,
                                  const std::map<std::string, double>& speeds) {
  LOG(WARNING) << JobWho(job.info()) << " " << kind << ": " << reason;
  events_->Emit(kind == "straggler" ? "straggler_action" : "straggler_recovered", job.info().id(),
                "", reason);
  Cause c;
  c.kind = kind;
  c.reason = reason;
  c.graceful = true;
  c.leaving = std::move(leaving);
  c.priority = 3;
  for (const auto& [node, speed] : speeds) {
    v1::NodeSpeed ns;
    ns.set_node(node);
    ns.set_speed(speed);
    c.speeds.push_back(ns);
  }
  jobs_->Persist(job);
  morph_->Trigger(job, c);
}

double StragglerController::MorphCost(const Job& job) const {
  std::vector<double> totals;
  for (const auto& m : job.info().morphs()) {
    auto it = m.phases().find("total");
    if (it != m.phases().end() && std::isfinite(it->second) && it->second > 0) {
      totals.push_back(it->second);
    }
  }
  return totals.empty() ? kDefaultMorphCostS : Median(totals);
}

void StragglerController::Tick() {
  const absl::Time now = clock_->Now();
  for (auto it = jobs_state_.begin(); it != jobs_state_.end();) {
    const Job* job = jobs_->Find(it->first);
    if (job == nullptr || Terminal(job->info().state())) {
      if (metrics_) metrics_->SetNodeSpeeds(it->first, {});
      it = jobs_state_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& [id, job] : jobs_->all()) {
    if (job.rec.stragglers().evicted().empty() || !Active(job.info().state())) continue;
    JobState& st = jobs_state_[id];
    for (const auto& e : job.rec.stragglers().evicted()) {
      if (UnixSeconds(now) < e.probe_after() || st.probing.count(e.node())) continue;
      const NodeTable::Node* n = nodes_->Find(e.node());
      if (n == nullptr || n->dead || n->suspect) continue;
      st.probing.insert(e.node());
      v1::ProbeRequest req;
      req.set_duration_ms(500);
      agents_->For(n->rec.name(), n->rec.address())
          ->Probe(req, [this, id = id, node = e.node()](absl::StatusOr<v1::ProbeResponse> r) {
            post_([this, id, node, r = std::move(r)] { OnProbe(id, node, r); });
          });
    }
  }
}

double StragglerController::Baseline(const std::string& node) const {
  const NodeTable::Node* n = nodes_->Find(node);
  if (n != nullptr && n->probe_score > 0) return n->probe_score;
  std::vector<double> others;  // no baseline of its own: its peers' (same machine type)
  for (const auto& [name, other] : nodes_->all()) {
    if (other.probe_score > 0) others.push_back(other.probe_score);
  }
  return Median(others);
}

void StragglerController::OnProbe(const std::string& job_id, const std::string& node,
                                  absl::StatusOr<v1::ProbeResponse> r) {
  Job* job = jobs_->Find(job_id);
  if (job == nullptr) return;
  jobs_state_[job_id].probing.erase(node);
  auto* evicted = job->rec.mutable_stragglers()->mutable_evicted();
  auto e = std::find_if(evicted->begin(), evicted->end(),
                        [&](const v1::EvictedNode& x) { return x.node() == node; });
  if (e == evicted->end()) return;
  const StragglerSpec s = Settings(*job);
  const double now = UnixSeconds(clock_->Now());
  const double baseline = Baseline(node);
  const double ratio = r.ok() && baseline > 0 ? r->score() / baseline : 0;
  if (!r.ok() || (baseline > 0 && ratio < s.recovered_above)) {
    e->set_probation_s(std::min(kMaxProbationS, 2 * e->probation_s()));
    e->set_probe_after(now + e->probation_s());
    events_->Emit("straggler_probe", job_id, node,
                  absl::StrCat("node ", node,
                               r.ok() ? absl::StrCat(" still slow: its probe runs at ",
                                                     SpeedText(ratio), " its baseline")
                                      : absl::StrCat(" not probed: ", r.status().message()),
                               "; next probe in ", static_cast<int64_t>(e->probation_s()), " s"));
    jobs_->Persist(*job);
    return;
  }
  const std::string reason = absl::StrCat(
      "node ", node, " recovered: ",
      baseline > 0 ? absl::StrCat("its probe runs at ", SpeedText(ratio), " its baseline")
                   : "no baseline to compare its probe with, re-admitted on trial",
      "; re-admitted");
  evicted->erase(e);
  jobs_->Persist(*job);
  if (job->info().state() != v1::RUNNING || job->morphing() || !morph_->Allowed(*job)) {
    events_->Emit("straggler_recovered", job_id, node, reason);  // the next plan may use it
    return;
  }
  auto plan = PlanForJob(*job, jobs_->FreeSlotsFor(job, {}), *profiles_);
  if (!plan.ok() || plan->ranks.size() <= static_cast<size_t>(job->info().slots())) {
    events_->Emit("straggler_recovered", job_id, node,
                  absl::StrCat(reason, " (the job's plan does not use it now)"));
    return;
  }
  Trigger(*job, "recovered", reason, {}, {{node, ratio}});
}

void StragglerController::Annotate(std::vector<v1::NodeInfo>* nodes) const {
  // One pass over the jobs, then one lookup per node: ListNodes serves thousands of nodes.
  std::map<std::string, double> slowest;
  std::map<std::string, std::vector<std::string>> notes;
  for (const auto& [id, st] : jobs_state_) {
    const Job* job = jobs_->Find(id);
    if (job == nullptr) continue;
    const double slow_below = Settings(*job).slow_below;
    for (const auto& [node, speed] : st.speeds) {
      auto [it, fresh] = slowest.emplace(node, speed);
      if (!fresh) it->second = std::min(it->second, speed);
      if (speed < slow_below) {
        notes[node].push_back(absl::StrCat("slow in job ", id, " (", SpeedText(speed), ")"));
      }
    }
  }
  const double now = UnixSeconds(clock_->Now());
  for (const auto& [id, job] : jobs_->all()) {
    if (!Active(job.info().state())) continue;
    for (const auto& e : job.rec.stragglers().evicted()) {
      notes[e.node()].push_back(
          absl::StrCat("evicted by job ", id, " at ", SpeedText(e.speed()), ", probe in ",
                       std::max<int64_t>(0, static_cast<int64_t>(e.probe_after() - now)), " s"));
      slowest.emplace(e.node(), e.speed());
    }
  }
  for (v1::NodeInfo& n : *nodes) {
    auto s = slowest.find(n.name());
    n.set_relative_speed(s == slowest.end() ? 0 : s->second);
    auto t = notes.find(n.name());
    n.set_speed_note(t == notes.end() ? "" : absl::StrJoin(t->second, "; "));
  }
}

void StragglerController::Annotate(const std::string& job_id, v1::GetStagesResponse* stages) const {
  auto it = jobs_state_.find(job_id);
  const Job* job = jobs_->Find(job_id);
  if (it == jobs_state_.end() || job == nullptr || it->second.detector == nullptr ||
      it->second.generation != job->info().generation()) {
    return;  // nothing measured of this generation yet
  }
  const JobState& st = it->second;
  const double slow_below = Settings(*job).slow_below;
  const std::vector<double>& busy = st.detector->newest_busy();
  const std::vector<double>& wait = st.detector->newest_wait();
  for (v1::StageInfo& s : *stages->mutable_stages()) {
    const size_t r = static_cast<size_t>(s.rank());
    if (r < busy.size() && r < wait.size()) {
      s.set_busy_s(busy[r]);
      s.set_wait_s(wait[r]);
    }
    auto sp = st.speeds.find(s.node());
    if (sp != st.speeds.end()) {
      s.set_node_speed(sp->second);
      s.set_slow(sp->second < slow_below);
    }
  }
}

void StragglerController::Forget(const std::string& job_id) {
  jobs_state_.erase(job_id);
  if (metrics_) metrics_->SetNodeSpeeds(job_id, {});
}

}  // namespace varuna

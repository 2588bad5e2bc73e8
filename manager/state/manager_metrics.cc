#include "manager/state/manager_metrics.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>

#include "absl/strings/match.h"

namespace varuna {
namespace {

// Note [Series from the start]: a job's counters and histograms exist at 0 from its
// submission (AddJob), so its first morph is an increase that rate() and increase() see (a
// series born at 1 hides it: Prometheus's "avoid missing metrics"). The same care for what
// goes in: a histogram's sum is forever, so a value a peer made up (a NaN, 1e300 or negative step
// time, a heartbeat round trip of a year) would poison it for the life of the series. Durations are
// observed only when finite and in [0, max_s].
bool Plausible(double seconds, double max_s) {
  return std::isfinite(seconds) && seconds >= 0 && seconds <= max_s;
}

const prometheus::Histogram::BucketBoundaries& StepBuckets() {
  static const auto* b =
      new prometheus::Histogram::BucketBoundaries{0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100};
  return *b;
}
const prometheus::Histogram::BucketBoundaries& MorphBuckets() {
  static const auto* b =
      new prometheus::Histogram::BucketBoundaries{0.1, 0.3, 1, 3, 10, 30, 100, 300};
  return *b;
}
const char* const kReasonKinds[] = {"lost",      "notice",    "drain",  "join",  "failed",
                                    "straggler", "recovered", "resize", "evict", "other"};
// Every phase a morph record has (docs/morphing.md); the in-place path's are regroup, agree
// and transfer. A job's series are made and removed together, so only these are exported.
const char* const kPhases[] = {"detect",     "save",    "stop",  "plan",     "launch",
                               "rendezvous", "regroup", "agree", "transfer", "first_step"};

}  // namespace

ManagerMetrics::ManagerMetrics(MetricsRegistry& r)
    : nodes_(r.Gauge("varuna_nodes", "Registered nodes by state")),
      node_slots_(r.Gauge("varuna_node_slots", "Worker slots a node offers")),
      jobs_(r.Gauge("varuna_jobs", "Jobs by state")),
      job_step_(r.Gauge("varuna_job_step", "Newest optimizer step a job reported")),
      job_loss_(r.Gauge("varuna_job_loss", "Training loss of the newest step")),
      job_eval_loss_(
          r.Gauge("varuna_job_eval_loss", "Validation loss of the newest step that computed one")),
      job_samples_(
          r.Gauge("varuna_job_samples_per_second", "Samples per second of the newest step")),
      job_step_seconds_(r.Histogram("varuna_job_step_seconds", "Wall-clock time per step")),
      job_bubble_(r.Gauge("varuna_job_bubble_ratio",
                          "Measured pipeline bubble of the newest step (pipeline 0)")),
      job_mfu_(r.Gauge("varuna_job_mfu", "Model FLOP/s utilisation of the newest step")),
      job_slots_(r.Gauge("varuna_job_allocated_slots",
                         "Slots a job holds, or the allocator gives it (sharing)")),
      user_slots_(r.Gauge("varuna_user_allocated_slots",
                          "Slots the jobs of a user (token name; - without tokens) hold")),
      morphs_(r.Counter("varuna_morphs_total", "Finished morphs by the kind of their cause")),
      morph_phase_(r.Histogram("varuna_morph_phase_seconds", "Duration of each morph phase")),
      heartbeat_latency_(r.Histogram("varuna_heartbeat_latency_seconds",
                                     "Round trip of an agent's heartbeat RPC, as it measured")),
      node_speed_(r.Gauge("varuna_node_relative_speed",
                          "A node's compute speed relative to its peers in a job (1 = as fast)")),
      is_leader_(r.Gauge("varuna_manager_is_leader",
                         "1 while this manager leads (several managers on etcd; 1 when alone)")),
      leader_changes_(r.Counter("varuna_manager_leader_changes_total",
                                "Elections this manager won (several managers on etcd)")) {
  SetJobs({});
  SetNodes({});
  leader_changes_.Add({});
}

void ManagerMetrics::SetLeader(bool leading) { is_leader_.Add({}).Set(leading ? 1 : 0); }

void ManagerMetrics::OnElected() { leader_changes_.Add({}).Increment(); }

void ManagerMetrics::SetNodes(const std::vector<v1::NodeInfo>& nodes) {
  std::map<std::string, double> by_state;
  std::set<std::string> present;
  for (const v1::NodeInfo& n : nodes) {
    by_state[v1::NodeState_Name(n.state())] += 1;
    present.insert(n.name());
    prometheus::Gauge*& g = slots_by_node_[n.name()];
    if (g == nullptr) g = &node_slots_.Add({{"node", n.name()}});
    g->Set(n.slots());
  }
  // Nodes the manager forgot (DEAD and idle past forget_dead_after): their series go.
  std::vector<std::string> gone;
  for (const auto& [name, g] : slots_by_node_) {
    if (!present.count(name)) gone.push_back(name);
  }
  for (const std::string& name : gone) ForgetNode(name);
  std::vector<std::string> all;
  for (int s = v1::NodeState_MIN; s <= v1::NodeState_MAX; ++s) {
    if (v1::NodeState_IsValid(s) && s != 0) all.push_back(v1::NodeState_Name(s));
  }
  SetCounts(nodes_, "state", by_state, all);
}

void ManagerMetrics::SetJobs(const std::map<std::string, double>& by_state) {
  std::vector<std::string> all;
  for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
    if (v1::JobState_IsValid(s) && s != 0) all.push_back(v1::JobState_Name(s));
  }
  SetCounts(jobs_, "state", by_state, all);
}

void ManagerMetrics::SetAllocations(const std::map<std::string, int>& by_job,
                                    const std::map<std::string, int>& by_user) {
  for (const auto& [job, n] : by_job) job_slots_.Add({{"job", job}}).Set(n);
  for (const auto& [user, gauge] : user_gauges_) {
    if (!by_user.count(user)) gauge->Set(0);  // a user whose jobs ended shows 0, not the past
  }
  for (const auto& [user, n] : by_user) {
    prometheus::Gauge*& g = user_gauges_[user];
    if (g == nullptr) g = &user_slots_.Add({{"user", user.empty() ? "-" : user}});
    g->Set(n);
  }
}

void ManagerMetrics::OnSteps(const std::string& job, const std::vector<v1::StepRecord>& steps) {
  if (steps.empty()) return;
  const prometheus::Labels l{{"job", job}};
  auto& hist = job_step_seconds_.Add(l, StepBuckets());
  // The gauges show the newest step by (generation, step): a morph that rewinds shows the
  // re-run steps, but a late report of an older generation (an adopted survivor's backlog)
  // never moves them back.
  auto key = [](const v1::StepRecord& s) {
    return std::pair<int64_t, int64_t>(s.generation(), s.step());
  };
  const v1::StepRecord* newest = &steps[0];
  const v1::StepRecord* newest_eval = nullptr;
  for (const v1::StepRecord& s : steps) {
    if (s.step_time_s() > 0 && Plausible(s.step_time_s(), 86400)) hist.Observe(s.step_time_s());
    if (key(s) >= key(*newest)) newest = &s;
    if (s.has_eval_loss() && (newest_eval == nullptr || key(s) >= key(*newest_eval))) {
      newest_eval = &s;
    }
  }
  if (newest_eval != nullptr) {
    auto [at, first] = shown_eval_.emplace(job, key(*newest_eval));
    if (first || key(*newest_eval) >= at->second) {
      at->second = key(*newest_eval);
      job_eval_loss_.Add(l).Set(newest_eval->eval_loss());
    }
  }
  auto [shown, fresh] = shown_step_.emplace(job, key(*newest));
  if (!fresh) {
    if (key(*newest) < shown->second) return;
    shown->second = key(*newest);
  }
  job_step_.Add(l).Set(static_cast<double>(newest->step()));
  job_loss_.Add(l).Set(newest->loss());
  job_samples_.Add(l).Set(newest->samples_per_s());
  job_bubble_.Add(l).Set(newest->bubble_ratio());
  job_mfu_.Add(l).Set(newest->mfu());
}

std::string ManagerMetrics::ReasonKind(const v1::MorphRecord& morph) {
  if (std::find(std::begin(kReasonKinds), std::end(kReasonKinds), morph.kind()) !=
      std::end(kReasonKinds)) {
    return morph.kind();
  }
  const std::string& reason = morph.reason();  // a record from before kinds
  if (absl::StrContains(reason, "preempt") || absl::StrContains(reason, "notice")) {
    return "notice";
  }
  if (absl::StrContains(reason, "drain")) return "drain";
  if (absl::StrContains(reason, " lost") || absl::StrContains(reason, "does not answer")) {
    return "lost";
  }
  if (absl::StrContains(reason, "joined")) return "join";
  if (absl::StrContains(reason, "exit") || absl::StrContains(reason, "fail") ||
      absl::StrContains(reason, "signal") || absl::StrContains(reason, "killed by") ||
      absl::StrContains(reason, "(frozen)")) {
    return "failed";
  }
  return "other";
}

void ManagerMetrics::OnMorph(const std::string& job, const v1::MorphRecord& morph) {
  morphs_.Add({{"job", job}, {"reason", ReasonKind(morph)}}).Increment();
  for (const auto& [phase, seconds] : morph.phases()) {
    const bool known =
        std::find(std::begin(kPhases), std::end(kPhases), phase) != std::end(kPhases);
    if (!known || !Plausible(seconds, 86400)) continue;
    morph_phase_.Add({{"job", job}, {"phase", phase}}, MorphBuckets()).Observe(seconds);
  }
}

void ManagerMetrics::OnHeartbeat(const std::string& node, double latency_s) {
  prometheus::Histogram*& h = latency_by_node_[node];
  if (h == nullptr) {
    h = &heartbeat_latency_.Add({{"node", node}}, prometheus::Histogram::BucketBoundaries{
                                                      0.001, 0.003, 0.01, 0.03, 0.1, 1});
  }
  if (Plausible(latency_s, 3600)) h->Observe(latency_s);
}

void ManagerMetrics::AddJob(const std::string& job) {
  if (!jobs_known_.insert(job).second) return;
  for (const char* kind : kReasonKinds) morphs_.Add({{"job", job}, {"reason", kind}});
  for (const char* phase : kPhases)
    morph_phase_.Add({{"job", job}, {"phase", phase}}, MorphBuckets());
  job_step_seconds_.Add({{"job", job}}, StepBuckets());
}

void ManagerMetrics::ForgetJob(const std::string& job) {
  shown_step_.erase(job);
  shown_eval_.erase(job);
  if (!jobs_known_.erase(job)) return;
  const prometheus::Labels l{{"job", job}};
  for (const char* kind : kReasonKinds)
    morphs_.Remove(&morphs_.Add({{"job", job}, {"reason", kind}}));
  for (const char* phase : kPhases) {
    morph_phase_.Remove(&morph_phase_.Add({{"job", job}, {"phase", phase}}, MorphBuckets()));
  }
  job_step_seconds_.Remove(&job_step_seconds_.Add(l, StepBuckets()));
  SetNodeSpeeds(job, {});
  for (auto* family : {&job_step_, &job_loss_, &job_eval_loss_, &job_samples_, &job_bubble_,
                       &job_mfu_, &job_slots_}) {
    family->Remove(&family->Add(l));
  }
}

void ManagerMetrics::SetNodeSpeeds(const std::string& job,
                                   const std::map<std::string, double>& speeds) {
  std::set<std::string>& had = speed_nodes_[job];
  for (const std::string& node : had) {
    if (!speeds.count(node)) node_speed_.Remove(&node_speed_.Add({{"job", job}, {"node", node}}));
  }
  had.clear();
  for (const auto& [node, speed] : speeds) {
    if (!Plausible(speed, 1000)) continue;
    node_speed_.Add({{"job", job}, {"node", node}}).Set(speed);
    had.insert(node);
  }
  if (had.empty()) speed_nodes_.erase(job);
}

void ManagerMetrics::ForgetNode(const std::string& node) {
  if (auto it = slots_by_node_.find(node); it != slots_by_node_.end()) {
    node_slots_.Remove(it->second);
    slots_by_node_.erase(it);
  }
  if (auto it = latency_by_node_.find(node); it != latency_by_node_.end()) {
    heartbeat_latency_.Remove(it->second);
    latency_by_node_.erase(it);
  }
}

}  // namespace varuna

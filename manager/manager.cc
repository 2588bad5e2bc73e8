#include "manager/manager.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "glog/logging.h"
#include "manager/jobs/log_proxy.h"
#include "manager/jobs/planning.h"

namespace varuna {

// ---- what the node table's changes mean for jobs ----------------------------------------

class Manager::NodeEvents final : public NodeTable::Listener {
 public:
  explicit NodeEvents(Manager* m) : m_(m) {}
  void OnNodeGone(const NodeTable::Gone& gone) override { m_->job_controller_.OnNodeGone(gone); }
  void OnNodeJoined(const std::string& node, const std::string& how) override {
    m_->events_.Emit("node_joined", "", node, how);
    m_->morph_controller_.NoteJoined(node);
  }
  void OnNodeEvent(const std::string& kind, const std::string& node,
                   const std::string& message) override {
    m_->events_.Emit(kind, "", node, message);
  }
  // Many nodes change at once (a cluster's agents coming back after a manager restart, 10,000
  // of them): one Schedule runs for all of them, not one each queued ahead of their heartbeats.
  void OnSlotsChanged() override {
    if (schedule_posted_) return;
    schedule_posted_ = true;
    m_->post_([this] {
      schedule_posted_ = false;
      m_->job_controller_.Schedule();
    });
  }

 private:
  Manager* const m_;
  bool schedule_posted_ = false;  // the manager's loop only
};

// ---- the Slurm source's view and hands ----------------------------------------------------

namespace {

// Slots a job could use: its fixed shape, else resources.max_slots, else unbounded.
int64_t MaxUsefulSlots(const JobSpec& s) {
  constexpr int64_t kUnbounded = int64_t{1} << 40;
  int64_t n = kUnbounded;
  if (!s.parallel.pipelines.empty()) {
    n = 0;
    for (const auto& p : s.parallel.pipelines) {
      n += static_cast<int64_t>(p.count) * static_cast<int64_t>(p.stages.size());
    }
  } else if (s.parallel.stages > 0 && s.parallel.replicas > 0) {
    n = static_cast<int64_t>(s.parallel.stages) * s.parallel.replicas;
  }
  if (n != kUnbounded) n *= std::max(1, s.parallel.tp_size);  // processes per position
  if (s.resources.max_slots > 0) n = std::min<int64_t>(n, s.resources.max_slots);
  return n;
}

}  // namespace

class Manager::SlurmHost final : public SlurmSource::Host {
 public:
  explicit SlurmHost(Manager* m) : m_(m) {}
  SlurmView View() override {
    SlurmView v;
    const auto used = m_->jobs_.UsedSlots();
    int64_t others = 0;  // slots of schedulable nodes the source did not bring
    for (const auto& [name, n] : m_->nodes_.all()) {
      auto it = used.find(name);
      const int u = it == used.end() ? 0 : it->second;
      v.nodes.push_back({name, !n.dead, !m_->nodes_.DrainReason(n).empty(), u});
      if (m_->slurm_->SourceOf(name).empty() && m_->nodes_.Schedulable(n)) {
        others += n.rec.slots();
      }
    }
    int64_t want = 0;
    for (const auto& [id, job] : m_->jobs_.all()) {
      const v1::JobState s = job.info().state();
      if (Terminal(s) || s == v1::CANCELLING) continue;
      want = std::min<int64_t>(want + MaxUsefulSlots(job.spec), int64_t{1} << 40);
    }
    v.wanted_slots = std::max<int64_t>(0, want - others);
    return v;
  }
  void LoseNode(const std::string& node, const std::string& why) override {
    m_->nodes_.Lose(node, why);
  }
  void ForgetNode(const std::string& node) override {
    const auto used = m_->jobs_.UsedSlots();
    auto it = used.find(node);
    m_->nodes_.Forget(node, it == used.end() ? 0 : it->second);
  }
  void Event(const std::string& kind, const std::string& node,
             const std::string& message) override {
    m_->events_.Emit(kind, "", node, message);
  }

 private:
  Manager* const m_;
};

Manager::Manager(ManagerConfig config, Clock* clock, StateStore* store, AgentClientPool* agents,
                 Post post)
    : config_(std::move(config)),
      clock_(clock),
      store_(store),
      agents_(agents),
      post_(std::move(post)),
      node_events_(std::make_unique<NodeEvents>(this)),
      nodes_(config_.node_options(), clock, store, node_events_.get()),
      jobs_(store, &nodes_),
      events_(clock, store),
      steps_(store),
      profiles_(store),
      job_controller_(config_.job_options(), clock, &jobs_, &nodes_, agents, post_, &events_,
                      &profiles_, &steps_),
      morph_controller_(config_.morph_options(), clock, &jobs_, &nodes_, agents, post_, &events_,
                        &profiles_, &job_controller_),
      straggler_controller_(config_.straggler_options(), clock, &jobs_, &nodes_, agents, post_,
                            &events_, &profiles_, &morph_controller_),
      reconciler_(config_, clock, &jobs_, &nodes_, &job_controller_, &morph_controller_, post_) {
  job_controller_.set_morph(&morph_controller_);
  job_controller_.set_on_steps(
      [this](Job& job, const v1::WorkerStatus& w) { straggler_controller_.OnSteps(job, w); });
}

Manager::~Manager() = default;

void Manager::set_metrics(ManagerMetrics* m) {
  metrics_ = m;
  steps_.set_metrics(m);
  morph_controller_.set_metrics(m);
  straggler_controller_.set_metrics(m);
  reconciler_.set_metrics(m);
}

void Manager::StartSlurm(SlurmCommands* commands, Post off_loop) {
  if (!config_.slurm.enabled()) return;
  slurm_host_ = std::make_unique<SlurmHost>(this);
  slurm_ = std::make_unique<SlurmSource>(config_.slurm, clock_, commands, post_,
                                         std::move(off_loop), slurm_host_.get());
}

absl::Status Manager::Recover() {
  RETURN_IF_ERROR(nodes_.Load());
  RETURN_IF_ERROR(jobs_.Load(clock_->Now()));
  RETURN_IF_ERROR(profiles_.Load());
  RETURN_IF_ERROR(events_.Load());
  job_controller_.ResumeRecovered();
  events_.Emit(
      "manager_started", "", "",
      absl::StrCat("recovered ", jobs_.all().size(), " jobs, ", nodes_.all().size(), " nodes"));
  LOG(INFO) << "recovered " << nodes_.all().size() << " nodes and " << jobs_.all().size()
            << " jobs from " << config_.state_dir;
  return absl::OkStatus();
}

void Manager::Tick() {
  const auto used = jobs_.UsedSlots();
  nodes_.Tick([&used](const std::string& n) {
    auto it = used.find(n);
    return it == used.end() ? 0 : it->second;
  });
  job_controller_.Tick();
  job_controller_.Schedule();
  morph_controller_.CheckGrowth();
  straggler_controller_.Tick();
  if (slurm_) slurm_->Tick();
  if (clock_->Now() - synced_at_ >= absl::Seconds(1)) {  // Note [High-rate state] (etcd_store.h)
    synced_at_ = clock_->Now();
    if (absl::Status s = store_->Sync(); !s.ok()) LOG(WARNING) << "state store: " << s;
  }
  if (metrics_ && clock_->Now() - metrics_refreshed_ >= absl::Seconds(1)) RefreshMetrics();
  if (clock_->Now() - pruned_at_ >= absl::Seconds(10)) {  // Note [Retention] in job_table.cc
    pruned_at_ = clock_->Now();
    for (const std::string& id :
         jobs_.Prune(clock_->Now(), config_.max_finished_jobs, config_.finished_job_ttl)) {
      LOG(INFO) << "job=" << id
                << " pruned (retention: max_finished_jobs=" << config_.max_finished_jobs
                << ", finished_job_ttl_s=" << absl::ToInt64Seconds(config_.finished_job_ttl) << ")";
      steps_.Forget(id);
      straggler_controller_.Forget(id);
      if (metrics_) metrics_->ForgetJob(id);
    }
  }
}

// ---- the services' calls -------------------------------------------------------------------

absl::StatusOr<v1::RegisterResponse> Manager::Register(const v1::RegisterRequest& req) {
  return reconciler_.Register(req);
}

absl::StatusOr<v1::HeartbeatResponse> Manager::Heartbeat(const v1::HeartbeatRequest& req) {
  return reconciler_.Heartbeat(req);
}

absl::StatusOr<v1::JobInfo> Manager::Submit(const v1::SubmitRequest& req, JobSpec spec,
                                            const std::string& user, const std::string& run_as) {
  auto r = job_controller_.Submit(req, std::move(spec), user, run_as);
  if (r.ok() && metrics_ != nullptr) metrics_->AddJob(r->id());
  return r;
}

std::vector<v1::JobInfo> Manager::ListJobs() const {
  std::vector<v1::JobInfo> out;
  for (const auto& id : jobs_.order()) out.push_back(jobs_.Find(id)->info());
  return out;
}

// Note [Pages]: every list a client can grow is paged, by count and by bytes, so no reply
// nears the 4 MiB message limit however many jobs (events: EventLog::List; step records:
// StepSeries::Get). A jobs page token is the seq of the page's last job; jobs pruned
// meanwhile (retention) simply drop out.
absl::StatusOr<v1::ListJobsResponse> Manager::ListJobs(const v1::ListJobsRequest& req) const {
  constexpr size_t kMaxPageBytes = 2 << 20;
  const int size = req.page_size() > 0 ? std::min(req.page_size(), 1000) : 500;
  int64_t after = 0;
  if (!req.page_token().empty() && (!absl::SimpleAtoi(req.page_token(), &after) || after < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("list jobs: page_token '", req.page_token(), "' is not from a previous page"));
  }
  v1::ListJobsResponse resp;
  size_t bytes = 0;
  int64_t last = 0;
  for (const auto& id : jobs_.order()) {
    const Job& job = *jobs_.Find(id);
    if (job.rec.seq() <= after) continue;
    const size_t b = job.info().ByteSizeLong();
    if (resp.jobs_size() >= size || (resp.jobs_size() > 0 && bytes + b > kMaxPageBytes)) {
      resp.set_next_page_token(absl::StrCat(last));
      break;
    }
    bytes += b;
    last = job.rec.seq();
    *resp.add_jobs() = job.info();
  }
  return resp;
}

absl::StatusOr<v1::JobInfo> Manager::GetJob(const std::string& id) const {
  const Job* job = jobs_.Find(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job with id '", id, "'"));
  return job->info();
}

absl::StatusOr<v1::JobInfo> Manager::Cancel(const std::string& id, const std::string& user) {
  return job_controller_.Cancel(id, user);
}

void Manager::GetLogs(const v1::GetLogsRequest& req,
                      std::function<void(absl::StatusOr<v1::GetLogsResponse>)> done) {
  const Job* job = jobs_.Find(req.job_id());
  if (job == nullptr) {
    done(absl::NotFoundError(absl::StrCat("no job with id '", req.job_id(), "'")));
    return;
  }
  ProxyLogs(*job, nodes_, agents_, req, std::move(done));
}

v1::NodeInfo Manager::Describe(const NodeTable::Node& n) const {
  const auto used = jobs_.UsedSlots();
  auto it = used.find(n.rec.name());
  std::vector<v1::NodeInfo> info{nodes_.Describe(n, it == used.end() ? 0 : it->second)};
  straggler_controller_.Annotate(&info);
  return info[0];
}

std::vector<v1::NodeInfo> Manager::ListNodes() const {
  const auto used = jobs_.UsedSlots();  // once, not per node: 1,000 nodes made this quadratic
  std::vector<v1::NodeInfo> out;
  out.reserve(nodes_.all().size());
  for (const auto& [name, n] : nodes_.all()) {
    auto it = used.find(name);
    out.push_back(nodes_.Describe(n, it == used.end() ? 0 : it->second));
    if (slurm_) out.back().set_source(slurm_->SourceOf(name));
  }
  straggler_controller_.Annotate(&out);
  return out;
}

std::vector<v1::MachineSource> Manager::ListSources() const {
  std::vector<v1::MachineSource> out;
  if (slurm_) out.push_back(slurm_->Status());
  return out;
}

absl::StatusOr<v1::NodeInfo> Manager::Drain(const std::string& name, bool undo) {
  ASSIGN_OR_RETURN(NodeTable::Node * n, nodes_.Drain(name, undo));
  return Describe(*n);
}

absl::StatusOr<v1::NodeInfo> Manager::Preempt(const std::string& name,
                                              const v1::PreemptionNotice& notice) {
  ASSIGN_OR_RETURN(NodeTable::Node * n, nodes_.Preempt(name, notice));
  return Describe(*n);
}

v1::ListEventsResponse Manager::ListEvents(const v1::ListEventsRequest& req) const {
  return events_.List(req);
}

absl::StatusOr<v1::GetMetricsResponse> Manager::GetMetrics(const v1::GetMetricsRequest& req) const {
  if (jobs_.Find(req.job_id()) == nullptr) {
    return absl::NotFoundError(absl::StrCat("no job with id '", req.job_id(), "'"));
  }
  return steps_.Get(req);
}

PlanInputs Manager::PlanInputsFor(const JobSpec& spec) const {
  return ::varuna::PlanInputsFor(spec, nodes_, profiles_);
}

v1::GetProfileResponse Manager::GetProfile(const v1::GetProfileRequest& req) const {
  return profiles_.Get(req);
}

absl::StatusOr<v1::GetStagesResponse> Manager::GetStages(const std::string& id) const {
  const Job* job = jobs_.Find(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job with id '", id, "'"));
  ASSIGN_OR_RETURN(v1::GetStagesResponse resp,
                   DescribeStages(*job, profiles_.Find(job->spec), steps_.Newest(id)));
  straggler_controller_.Annotate(id, &resp);
  return resp;
}

// Note [Metrics]: counts by state (nodes, jobs) are refreshed at most once a second from the
// tables, whatever changed them; everything event-like (steps, morphs, heartbeat round trips)
// is recorded where it happens.
void Manager::RefreshMetrics() {
  metrics_refreshed_ = clock_->Now();
  std::vector<v1::NodeInfo> nodes;  // state and slots only: no used-slot accounting
  nodes.reserve(nodes_.all().size());
  for (const auto& [name, n] : nodes_.all()) nodes.push_back(nodes_.Describe(n, 0));
  metrics_->SetNodes(nodes);
  std::map<std::string, double> jobs;
  for (const auto& [id, job] : jobs_.all()) {
    jobs[v1::JobState_Name(job.info().state())] += 1;
    metrics_->AddJob(id);  // also the jobs of a recovery (Note [Series from the start])
  }
  metrics_->SetJobs(jobs);
}

}  // namespace varuna

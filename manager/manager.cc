#include "manager/manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "glog/logging.h"

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

// ---- the Slurm source, its view and its hands -----------------------------------------------

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

class Manager::Slurm final : public SlurmSource::Host {
 public:
  Slurm(Manager* m, SlurmCommands* commands, Post off_loop)
      : m_(m),
        source_(m->config_.slurm, m->clock_, commands, m->post_, std::move(off_loop), this) {}
  SlurmSource& source() { return source_; }

  SlurmView View() override {
    SlurmView v;
    const auto used = m_->jobs_.UsedSlots();
    int64_t others = 0;  // slots of schedulable nodes the source did not bring
    for (const auto& [name, n] : m_->nodes_.all()) {
      auto it = used.find(name);
      const int u = it == used.end() ? 0 : it->second;
      v.nodes.push_back({name, !n.dead, !m_->nodes_.DrainReason(n).empty(), u});
      if (source_.SourceOf(name).empty() && m_->nodes_.Schedulable(n)) {
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
  SlurmSource source_;
};

Manager::Manager(ManagerConfig config, Clock* clock, StateStore* store, AgentClientPool* agents,
                 Post post)
    : config_(std::move(config)),
      clock_(clock),
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
      reconciler_(config_, clock, &jobs_, &nodes_, &job_controller_, &morph_controller_, post_),
      housekeeping_(config_, clock, store, &nodes_, &jobs_, &steps_, &straggler_controller_) {
  if (config_.sharing.enabled) {
    optional_.sharing = std::make_unique<SharingController>(
        config_.sharing, clock, &jobs_, &nodes_, &events_, &profiles_, &morph_controller_);
  }
  job_controller_.set_morph(&morph_controller_, optional_.sharing.get());
  job_controller_.set_on_steps(
      [this](Job& job, const v1::WorkerStatus& w) { straggler_controller_.OnSteps(job, w); });
}

Manager::~Manager() = default;

void Manager::set_metrics(ManagerMetrics* m) {
  housekeeping_.set_metrics(m);
  steps_.set_metrics(m);
  morph_controller_.set_metrics(m);
  straggler_controller_.set_metrics(m);
  reconciler_.set_metrics(m);
}

void Manager::StartSlurm(SlurmCommands* commands, Post off_loop) {
  if (!config_.slurm.enabled()) return;
  optional_.slurm = std::make_unique<Slurm>(this, commands, std::move(off_loop));
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
  if (optional_.slurm) optional_.slurm->source().Tick();
  housekeeping_.Tick();
}

// ---- the agents' registry calls, and the parts the services' facade asks ---------------------

absl::StatusOr<v1::RegisterResponse> Manager::Register(const v1::RegisterRequest& req) {
  return reconciler_.Register(req);
}

absl::StatusOr<v1::HeartbeatResponse> Manager::Heartbeat(const v1::HeartbeatRequest& req) {
  return reconciler_.Heartbeat(req);
}

Manager::Parts Manager::parts() {
  return {&nodes_,
          &jobs_,
          &events_,
          &steps_,
          &profiles_,
          &job_controller_,
          &straggler_controller_,
          optional_.slurm ? &optional_.slurm->source() : nullptr,
          housekeeping_.metrics(),
          optional_.sharing.get()};
}

}  // namespace varuna

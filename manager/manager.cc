#include "manager/manager.h"

#include <signal.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/base/yaml_util.h"
#include "common/launch/exit_codes.h"
#include "common/net/rpc.h"
#include "common/planner/autoconfig.h"
#include "common/planner/profile.h"
#include "glog/logging.h"

namespace varuna {
namespace {

std::string JobWho(const v1::JobInfo& j) {
  return absl::StrCat("job=", j.id(), " gen=", j.generation());
}

std::string SignalName(int sig) {
  switch (sig) {
    case SIGKILL:
      return "SIGKILL";
    case SIGTERM:
      return "SIGTERM";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGABRT:
      return "SIGABRT";
    case SIGINT:
      return "SIGINT";
    case SIGBUS:
      return "SIGBUS";
    default:
      return absl::StrCat("signal ", sig);
  }
}

std::string HostOf(const std::string& address) {
  auto hp = SplitHostPort(address);
  return hp.ok() ? hp->first : address;
}

std::string UnreportedReason(const std::pair<std::string, int>& node_rank) {
  return absl::StrCat("rank ", node_rank.second, " on node ", node_rank.first,
                      " is no longer known to its agent (agent restarted?)");
}

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

absl::Status ManagerConfig::Validate() const {
  if (state_dir.empty()) return absl::InvalidArgumentError("manager: --state_dir is required");
  if (heartbeat_period < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError("manager: heartbeat_period_s must be >= 0.001");
  }
  if (suspect_after_missed < 1 || dead_after_missed <= suspect_after_missed) {
    return absl::InvalidArgumentError(
        "manager: need 1 <= suspect_after_missed < dead_after_missed");
  }
  if (stop_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("manager: stop_grace_s must be >= 0");
  }
  if (max_nodes < 1 || max_slots_per_node < 1) {
    return absl::InvalidArgumentError("manager: max_nodes and max_slots_per_node must be >= 1");
  }
  if (morph_save_timeout <= absl::ZeroDuration() || morph_coalesce < absl::ZeroDuration() ||
      scale_up_delay < absl::ZeroDuration() || morph_window <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "manager: morph_save_timeout_s and morph_window_s must be > 0, morph_coalesce_s and "
        "scale_up_delay_s >= 0");
  }
  if (max_morphs < 0) return absl::InvalidArgumentError("manager: max_morphs must be >= 0");
  if (forget_dead_after < dead_after()) {
    return absl::InvalidArgumentError(
        "manager: forget_dead_after_s must be at least the time to DEAD");
  }
  RETURN_IF_ERROR(CheckListenSecurity("varuna-manager", listen, tls.enabled(), allow_insecure));
  if (!IsLoopbackListen(listen) && tokens_file.empty() && !allow_insecure) {
    // TLS alone lets anyone who trusts the CA in: the job API (and so every agent's
    // programs) needs tokens beyond loopback.
    return absl::FailedPreconditionError(
        "manager: refusing to serve " + listen +
        " without --tokens_file: anyone who reaches it could submit jobs (or give "
        "--allow_insecure on a trusted network)");
  }
  return absl::OkStatus();
}

absl::Status LoadManagerConfigFile(const std::string& path, ManagerConfig* c) {
  return ForEachConfigEntry(
      path, "manager config",
      [&](const std::string& what, const std::string& key, const YAML::Node& v) -> absl::Status {
        auto str = [&](std::string* out) { return ReadInto(v, what, key, out); };
        auto num = [&](auto* out) { return ReadInto(v, what, key, out); };
        auto seconds = [&](absl::Duration* out) { return ReadSeconds(v, what, key, out); };
        if (key == "listen") return str(&c->listen);
        if (key == "http_listen") return str(&c->http_listen);
        if (key == "state_dir") return str(&c->state_dir);
        if (key == "heartbeat_period_s") return seconds(&c->heartbeat_period);
        if (key == "suspect_after_missed") return num(&c->suspect_after_missed);
        if (key == "dead_after_missed") return num(&c->dead_after_missed);
        if (key == "stop_grace_s") return seconds(&c->stop_grace);
        if (key == "start_timeout_s") return seconds(&c->start_timeout);
        if (key == "agent_rpc_timeout_s") return seconds(&c->agent_rpc_timeout);
        if (key == "forget_dead_after_s") return seconds(&c->forget_dead_after);
        if (key == "max_nodes") return num(&c->max_nodes);
        if (key == "max_slots_per_node") return num(&c->max_slots_per_node);
        if (key == "machine_list") return str(&c->machine_list);
        if (key == "check_job_files") return num(&c->check_job_files);
        if (key == "tls_ca") return str(&c->tls.ca);
        if (key == "tls_cert") return str(&c->tls.cert);
        if (key == "tls_key") return str(&c->tls.key);
        if (key == "tokens_file") return str(&c->tokens_file);
        if (key == "allow_insecure") return num(&c->allow_insecure);
        if (key == "http_allow_remote") return num(&c->http_allow_remote);
        if (key == "morph_save_timeout_s") return seconds(&c->morph_save_timeout);
        if (key == "morph_coalesce_s") return seconds(&c->morph_coalesce);
        if (key == "scale_up_delay_s") return seconds(&c->scale_up_delay);
        if (key == "max_morphs") return num(&c->max_morphs);
        if (key == "morph_window_s") return seconds(&c->morph_window);
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": unknown key '", key,
            "' (known: listen, http_listen, http_allow_remote, state_dir, heartbeat_period_s, "
            "suspect_after_missed, "
            "dead_after_missed, stop_grace_s, start_timeout_s, agent_rpc_timeout_s, "
            "forget_dead_after_s, max_nodes, max_slots_per_node, machine_list, check_job_files, "
            "tls_ca, tls_cert, tls_key, tokens_file, allow_insecure, morph_save_timeout_s, "
            "morph_coalesce_s, scale_up_delay_s, max_morphs, morph_window_s)"));
      });
}

Manager::Manager(ManagerConfig config, Clock* clock, StateStore* store, AgentClientPool* agents,
                 Post post)
    : config_(std::move(config)),
      clock_(clock),
      store_(store),
      agents_(agents),
      post_(std::move(post)),
      nodes_(config_, clock, store, this),
      last_flush_(clock->Now()) {}

bool Manager::Active(v1::JobState s) {
  return s == v1::STARTING || s == v1::RUNNING || s == v1::RECONFIGURING || s == v1::CANCELLING;
}

bool Manager::Terminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

std::string Manager::Now() const {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", clock_->Now(), absl::UTCTimeZone());
}

void Manager::Persist(Job& job) {
  absl::Status s = store_->SaveJob(job.rec);
  // Losing the state database is not something to run on through.
  CHECK(s.ok()) << "cannot persist job " << job.info().id() << ": " << s.message();
  job.progress_dirty = false;
}

absl::Status Manager::Recover() {
  RETURN_IF_ERROR(nodes_.Load());
  const absl::Time now = clock_->Now();
  ASSIGN_OR_RETURN(std::vector<v1::JobRecord> jobs, store_->LoadJobs());
  for (auto& rec : jobs) {
    Job job;
    job.rec = rec;
    auto spec = ParseJobSpec(rec.spec_yaml());
    if (!spec.ok()) {
      return absl::DataLossError(
          absl::StrCat("state database: job ", rec.info().id(),
                       " has an unreadable spec: ", spec.status().message()));
    }
    job.spec = *spec;
    job.gen.starting_since = now;
    job.gen.running_since = now;
    job.last_trigger = now;
    job.cause_priority = 3;
    job.cancelling_since = now;
    job.last_stop_sent = absl::InfinitePast();
    next_seq_ = std::max(next_seq_, rec.seq() + 1);
    const std::string id = rec.info().id();
    if (!rec.request_id().empty()) by_request_[rec.request_id()] = id;
    order_.push_back(id);
    jobs_[id] = std::move(job);
  }
  int active = 0;
  for (auto& [id, job] : jobs_) {
    if (!Active(job.info().state())) continue;
    ++active;
    LOG(INFO) << JobWho(job.info()) << " recovered in state "
              << v1::JobState_Name(job.info().state());
    job.gen.newest_step = job.info().step();
    for (const auto& e : job.rec.exits()) {
      if ((e.exit_code() != 0 || e.signal() != 0) && MorphAllowed(job) && !job.morphing() &&
          e.exit_code() != kExitBadInput) {
        // A failure recorded just before the restart: the morph it should have started.
        const std::string id = job.info().id();
        const std::string reason = absl::StrCat(
            "rank ", e.rank(), " exited with ",
            e.signal() != 0 ? SignalName(e.signal()) : absl::StrCat("code ", e.exit_code()));
        post_([this, id, reason] {
          auto it = jobs_.find(id);
          if (it == jobs_.end()) return;
          Cause c;
          c.reason = reason;
          c.priority = 2;
          Trigger(it->second, c);
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
        SendSaveRequests(job, !job.rec.morph().graceful());
        break;
      case v1::MorphState::STOPPING:
        SendStops(job);
        break;
      case v1::MorphState::LAUNCHING:
        SendLaunches(job);
        break;
      default:
        break;
    }
  }
  ASSIGN_OR_RETURN(std::vector<v1::Profile> profiles, store_->LoadProfiles());
  for (auto& p : profiles) profiles_[absl::StrCat(p.model_key(), "\n", p.precision())] = p;
  ASSIGN_OR_RETURN(std::vector<v1::Event> events, store_->LoadEvents(10000));
  for (auto& e : events) {
    next_event_seq_ = std::max(next_event_seq_, e.seq() + 1);
    events_.push_back(std::move(e));
  }
  Emit("manager_started", "", "",
       absl::StrCat("recovered ", jobs_.size(), " jobs, ", nodes_.all().size(), " nodes"));
  LOG(INFO) << "recovered " << nodes_.all().size() << " nodes and " << jobs_.size() << " jobs ("
            << active << " active) from " << config_.state_dir;
  return absl::OkStatus();
}

// ---- nodes ------------------------------------------------------------------------------

absl::StatusOr<v1::RegisterResponse> Manager::Register(const v1::RegisterRequest& req) {
  const auto used = UsedSlots();
  RETURN_IF_ERROR(nodes_
                      .Register(req,
                                [&used](const std::string& n) {
                                  auto it = used.find(n);
                                  return it == used.end() ? 0 : it->second;
                                })
                      .status());
  v1::RegisterResponse resp;
  resp.set_heartbeat_period_ms(absl::ToInt64Milliseconds(config_.heartbeat_period));
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> Manager::Heartbeat(const v1::HeartbeatRequest& req) {
  ASSIGN_OR_RETURN(Node * found, nodes_.Heartbeat(req.name()));
  if (metrics_ && req.last_rtt_s() > 0 && std::isfinite(req.last_rtt_s())) {
    metrics_->OnHeartbeat(req.name(), req.last_rtt_s());
  }
  Node& node = *found;
  if (req.has_preemption() && !node.rec.has_preemption()) {
    const std::string name = node.rec.name();
    const v1::PreemptionNotice notice = req.preemption();
    post_([this, name, notice] { Preempt(name, notice).IgnoreError(); });
  }
  v1::HeartbeatResponse resp;
  resp.set_heartbeat_period_ms(absl::ToInt64Milliseconds(config_.heartbeat_period));
  std::set<std::pair<std::string, int>> stop, release;
  std::set<std::pair<std::string, int>> reported;  // (job, rank) of current generations
  int other_running = 0;
  for (const v1::WorkerStatus& w : req.workers()) {
    const bool running = w.state() == v1::WORKER_RUNNING;
    auto jit = jobs_.find(w.job_id());
    const bool current = jit != jobs_.end() && w.generation() == jit->second.info().generation() &&
                         Active(jit->second.info().state());
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
    Job& job = jit->second;
    // Note [Peer limits] (node_table.cc): a node speaks only for the ranks placed on it; anything
    // else is a confused or hostile agent and is ignored (it must not fail, finish or advance a
    // job).
    if (!PlacedOn(job, node.rec.name(), w.rank())) {
      LOG(WARNING) << "node=" << node.rec.name() << " reported rank " << w.rank() << " of "
                   << JobWho(job.info()) << ", which is not placed there; ignored";
      continue;
    }
    reported.insert({w.job_id(), w.rank()});
    // The agent repeats the profile on every heartbeat; it is handled once per generation.
    if (!w.profile_json().empty() && !job.gen.profile_handled) {
      job.gen.profile_handled = true;
      StoreProfile(job, w.profile_json());
    }
    const v1::StepMetrics& p = w.progress();
    v1::JobInfo& info = job.info();
    RecordSteps(job, w);
    NoteWorkerReport(job, w);
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
    if (!running) RecordExit(job, w.rank(), w.exit_code(), w.signal(), node.rec.name());
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
  return resp;
}

v1::NodeInfo Manager::Describe(const Node& n) const {
  const auto used = UsedSlots();
  auto it = used.find(n.rec.name());
  return nodes_.Describe(n, it == used.end() ? 0 : it->second);
}

std::vector<v1::NodeInfo> Manager::ListNodes() const {
  const auto used = UsedSlots();  // once, not per node: 1,000 nodes made this quadratic
  std::vector<v1::NodeInfo> out;
  out.reserve(nodes_.all().size());
  for (const auto& [name, n] : nodes_.all()) {
    auto it = used.find(name);
    out.push_back(nodes_.Describe(n, it == used.end() ? 0 : it->second));
  }
  return out;
}

absl::StatusOr<v1::NodeInfo> Manager::Drain(const std::string& name, bool undo) {
  ASSIGN_OR_RETURN(Node * n, nodes_.Drain(name, undo));
  return Describe(*n);
}

absl::StatusOr<v1::NodeInfo> Manager::Preempt(const std::string& name,
                                              const v1::PreemptionNotice& notice) {
  ASSIGN_OR_RETURN(Node * n, nodes_.Preempt(name, notice));
  return Describe(*n);
}

// ---- what the node table tells the job controller (NodeTable::Listener) ------------------

void Manager::OnNodeLeaving(const std::string& node, const std::string& why) {
  OnNodeLeaving(node, why, absl::ZeroDuration(), /*graceful=*/true);
}

void Manager::OnNodeJoined(const std::string& node, const std::string& how) {
  Emit("node_joined", "", node, how);
  NoteJoined(node);
}

void Manager::OnNodeEvent(const std::string& kind, const std::string& node,
                          const std::string& message) {
  Emit(kind, "", node, message);
}

void Manager::OnSlotsChanged() {
  post_([this] { Schedule(); });
}

void Manager::OnNodeLost(const Node& node, absl::Duration silent) {
  Emit("node_lost", "", node.rec.name(),
       absl::StrCat("no heartbeat for ",
                    absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(100)))));
  for (auto& [id, job] : jobs_) {
    if (!Active(job.info().state())) continue;
    std::vector<int> ranks;
    for (const auto& p : job.info().placement()) {
      if (p.node() == node.rec.name()) ranks.push_back(p.rank());
    }
    if (ranks.empty()) continue;
    if (job.info().state() == v1::CANCELLING) {
      for (int r : ranks) RecordExit(job, r, 0, SIGKILL, node.rec.name());
      continue;
    }
    if (MorphAllowed(job)) {
      Cause c;
      c.reason = absl::StrCat("node ", node.rec.name(), " lost (no heartbeat for ",
                              absl::FormatDuration(absl::Trunc(silent, absl::Seconds(1))),
                              "; it ran ", RanksOn(job, node.rec.name()), ")");
      c.leaving = {node.rec.name()};
      c.detect = silent;
      c.priority = 3;
      Trigger(job, c);
      AdvanceMorph(job);
      continue;
    }
    // Until morphing lands, losing a node fails the job (ARCHITECTURE "Morph" is next).
    Fail(job,
         absl::StrCat("node ", node.rec.name(), " lost (no heartbeat for ",
                      absl::FormatDuration(absl::Trunc(silent, absl::Seconds(1))), "; it ran ",
                      RanksOn(job, node.rec.name()), ")",
                      job.gen.pending_failure.empty() ? "" : "; then ", job.gen.pending_failure));
  }
}

void Manager::Tick() {
  const absl::Time now = clock_->Now();
  const auto used = UsedSlots();
  nodes_.Tick([&used](const std::string& n) {
    auto it = used.find(n);
    return it == used.end() ? 0 : it->second;
  });
  for (auto& [id, job] : jobs_) {
    const v1::JobState s = job.info().state();
    if (s == v1::STARTING && now - job.gen.starting_since > config_.start_timeout) {
      Fail(job, absl::StrCat("workers did not start within ",
                             absl::FormatDuration(config_.start_timeout), " (no answer from ",
                             absl::StrJoin(job.gen.launch_pending, ","), ")"));
    } else if ((s == v1::STARTING || s == v1::RUNNING) && !job.gen.pending_failure.empty() &&
               now >= job.gen.fail_at) {
      SettleFailure(job);
    } else if (s == v1::CANCELLING && now - job.last_stop_sent > absl::Seconds(5)) {
      SendStops(job);  // in case a Stop was lost; agents ignore repeats
    } else if (s == v1::RECONFIGURING && job.rec.morph().phase() == v1::MorphState::LAUNCHING &&
               now - job.gen.starting_since > config_.start_timeout) {
      Cause c;
      c.reason = absl::StrCat("the relaunch did not start within ",
                              absl::FormatDuration(config_.start_timeout), " (no answer from ",
                              absl::StrJoin(job.gen.launch_pending, ","), ")");
      c.leaving = job.gen.launch_pending;
      c.priority = 3;
      Trigger(job, c);
    } else if (s == v1::RUNNING && job.rec.morph().phase() == v1::MorphState::RESUMING &&
               now - job.gen.running_since > config_.start_timeout) {
      // Workers that never write the ready line (a user program): record what is known.
      FinishMorph(job);
    }
    AdvanceMorph(job);
  }
  if (now - last_flush_ >= absl::Seconds(10)) {
    last_flush_ = now;
    for (auto& [id, job] : jobs_) {
      if (job.progress_dirty) Persist(job);
    }
  }
  Schedule();
  CheckGrowth();
  if (metrics_ && now - metrics_refreshed_ >= absl::Seconds(1)) RefreshMetrics();
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
  for (const auto& [id, job] : jobs_) jobs[v1::JobState_Name(job.info().state())] += 1;
  metrics_->SetJobs(jobs);
}

// ---- jobs -------------------------------------------------------------------------------

absl::StatusOr<v1::JobInfo> Manager::Submit(const v1::SubmitRequest& req, const std::string& user) {
  if (req.request_id().size() > 128) {
    return absl::InvalidArgumentError("submit: request_id is longer than 128 characters");
  }
  if (!req.request_id().empty()) {
    auto it = by_request_.find(req.request_id());
    if (it != by_request_.end()) return jobs_.at(it->second).info();  // a repeat
  }
  ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(req.spec_yaml()));
  RETURN_IF_ERROR(spec.ValidateShape());
  if (req.profile() && !spec.entrypoint.empty()) {
    return absl::InvalidArgumentError(
        "a profile job runs varuna-worker's profiler: remove the job's entrypoint");
  }
  if (!spec.env_file.empty()) {
    return absl::InvalidArgumentError(
        "job spec: env_file must be resolved by the submitter (varunactl merges it into env)");
  }
  Job job;
  job.spec = spec;
  job.rec.set_seq(next_seq_++);
  job.rec.set_spec_yaml(req.spec_yaml());
  job.rec.set_request_id(req.request_id());
  v1::JobInfo& info = job.info();
  info.set_id(absl::StrCat(job.rec.seq()));
  info.set_name(spec.name);
  info.set_state(v1::PENDING);
  info.set_total_steps(static_cast<int32_t>(spec.train.steps));
  info.set_submitted_at(Now());
  info.set_reason("waiting for slots");
  info.set_submitted_by(user);
  info.set_profile_job(req.profile());
  job.last_stop_sent = absl::InfinitePast();
  Persist(job);
  const std::string id = info.id();
  LOG(INFO) << "job=" << id << " submitted name=" << spec.name
            << (user.empty() ? "" : absl::StrCat(" by=", user));
  if (!req.request_id().empty()) by_request_[req.request_id()] = id;
  order_.push_back(id);
  jobs_[id] = std::move(job);
  post_([this] { Schedule(); });
  return jobs_.at(id).info();
}

std::vector<v1::JobInfo> Manager::ListJobs() const {
  std::vector<v1::JobInfo> out;
  for (const auto& id : order_) out.push_back(jobs_.at(id).info());
  return out;
}

absl::StatusOr<v1::JobInfo> Manager::GetJob(const std::string& id) const {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job with id '", id, "'"));
  return it->second.info();
}

absl::StatusOr<v1::JobInfo> Manager::Cancel(const std::string& id, const std::string& user) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job with id '", id, "'"));
  Job& job = it->second;
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
      Persist(job);
      SendStops(job);
      CheckAllExited(job);
      break;
    default:
      break;  // CANCELLING or finished: cancelling again changes nothing
  }
  return job.info();
}

bool Manager::Reserving(const Job& job) {
  const auto phase = job.rec.morph().phase();
  return job.info().state() == v1::RECONFIGURING &&
         (phase == v1::MorphState::SAVING || phase == v1::MorphState::STOPPING ||
          phase == v1::MorphState::PLANNING);
}

std::map<std::string, int> Manager::UsedSlots() const {
  std::map<std::string, int> used;
  for (const auto& [id, job] : jobs_) {
    if (!Active(job.info().state())) continue;
    // A job between generations keeps its slots: queued jobs must not take what it frees
    // while it saves and re-plans.
    const bool reserving = Reserving(job);
    std::set<int> exited;
    for (const auto& e : job.rec.exits()) exited.insert(e.rank());
    for (const auto& p : job.info().placement()) {
      if (reserving || !exited.count(p.rank())) ++used[p.node()];
    }
  }
  for (const auto& [name, n] : nodes_.all()) used[name] += n.other_running;
  return used;
}

void Manager::Schedule() {
  std::map<std::string, int> used = UsedSlots();
  for (const std::string& id : order_) {
    Job& job = jobs_.at(id);
    if (job.info().state() != v1::PENDING) continue;
    std::vector<FreeSlots> free;
    for (const auto& [name, n] : nodes_.all()) {
      if (!nodes_.Schedulable(n)) continue;
      const int f = n.rec.slots() - used[name];
      if (f > 0) free.push_back({name, f});
    }
    auto plan = Plan(job, free);
    if (!plan.ok()) {
      const std::string reason = absl::StrCat("waiting for slots: ", plan.status().message());
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

const v1::Profile* Manager::FindProfile(const JobSpec& spec) const {
  auto it = profiles_.find(absl::StrCat(ModelKey(spec.model), "\n", spec.train.precision));
  return it == profiles_.end() ? nullptr : &it->second;
}

absl::StatusOr<JobPlan> Manager::Plan(const Job& job, std::vector<FreeSlots> free) const {
  if (job.info().profile_job()) {
    // A profile job measures links between every slot it gets: one stage per slot.
    JobSpec spec = job.spec;
    spec.parallel.stages = 1;
    spec.parallel.micro_batch = 1;
    spec.parallel.schedule = "varuna";
    spec.parallel.pipelines.clear();
    int total = 0;
    for (const auto& f : free) total += f.free;
    const int cap =
        spec.resources.max_slots > 0 ? std::min(total, spec.resources.max_slots) : total;
    spec.parallel.replicas = std::max(1, cap);
    spec.train.global_batch = spec.parallel.replicas;
    auto plan = ::varuna::PlanJob(spec, std::move(free));
    if (plan.ok()) plan->source = "profile job";
    return plan;
  }
  return PlanWithProfile(job.spec, std::move(free), FindProfile(job.spec));
}

void Manager::SetPlan(v1::JobInfo& info, const JobPlan& plan) {
  info.set_schedule(plan.schedule);
  info.clear_boundaries();
  for (int b : plan.boundaries) info.add_boundaries(b);
  info.set_predicted_step_s(plan.predicted_step_s);
  info.set_plan_source(plan.source);
  info.set_pipelines(plan.pipelines);
  info.set_slots(static_cast<int>(plan.ranks.size()));
}

void Manager::StoreProfile(Job& job, const std::string& json) {
  if (!job.info().profile_job()) return;
  auto parsed = ParseProfileJson(json);
  absl::Status st = parsed.ok() ? CheckProfileFor(*parsed, job.spec) : parsed.status();
  if (!st.ok()) {
    LOG(WARNING) << JobWho(job.info()) << " reported an unusable profile: " << st.message();
    if (job.gen.worker_error.empty()) {
      job.gen.worker_error = absl::StrCat("unusable profile: ", st.message()).substr(0, 500);
    }
    return;
  }
  const std::string key = absl::StrCat(parsed->model_key(), "\n", parsed->precision());
  auto it = profiles_.find(key);
  if (it != profiles_.end() && it->second.created_at() == parsed->created_at() &&
      it->second.host() == parsed->host()) {
    job.gen.profile_stored = true;  // a repeat of the same report (after a manager restart)
    return;
  }
  if (absl::Status s = store_->SaveProfile(*parsed); !s.ok()) {
    LOG(ERROR) << "cannot store the profile of " << parsed->model_key() << ": " << s.message();
    return;
  }
  profiles_[key] = *parsed;
  job.gen.profile_stored = true;
  Emit("profile_stored", job.info().id(), "",
       absl::StrCat("profile of ", parsed->model_key(), " (", parsed->precision(), ", ",
                    parsed->segments_size(), " segments) stored; jobs of this model plan with it"));
}

absl::StatusOr<v1::PlanJobResponse> Manager::PlanJob(const v1::PlanJobRequest& req) const {
  ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(req.spec_yaml()));
  // Every alive, schedulable slot (busy or not): the shape the job would get on this cluster.
  v1::PlanJobResponse resp;
  PlanRequest pr;
  pr.all = req.all();
  pr.heterogeneous = true;
  for (const auto& [name, n] : nodes_.all()) {
    if (!nodes_.Schedulable(n) || n.rec.slots() <= 0) continue;
    pr.slots_per_node.push_back(n.rec.slots());
    resp.add_slots_per_node(n.rec.slots());
  }
  const v1::Profile* stored = FindProfile(spec);
  absl::StatusOr<v1::Profile> builtin;
  const v1::Profile* profile = stored;
  if (profile == nullptr) {
    builtin = BuiltinProfile(spec);
    if (!builtin.ok()) return builtin.status();
    profile = &*builtin;
  }
  ASSIGN_OR_RETURN(v1::PlanSet set, PlanShapes(spec, *profile, pr));
  if (stored == nullptr) {
    set.add_notes(absl::StrCat("no stored profile of '", ModelKey(spec.model),
                               "': jobs of this model run under the placement rule until one "
                               "is stored (varunactl profile JOB.yaml)"));
  }
  *resp.mutable_plans() = std::move(set);
  return resp;
}

v1::GetProfileResponse Manager::GetProfile(const v1::GetProfileRequest& req) const {
  v1::GetProfileResponse resp;
  auto it = profiles_.find(absl::StrCat(req.model_key(), "\n", req.precision()));
  if (it != profiles_.end()) {
    resp.set_found(true);
    *resp.mutable_profile() = it->second;
  }
  return resp;
}

void Manager::StartJob(Job& job, const JobPlan& plan) {
  CHECK_EQ(job.info().state(), v1::PENDING);
  v1::JobInfo& info = job.info();
  info.set_state(v1::STARTING);
  info.set_generation(info.generation() + 1);
  info.set_reason("");
  info.set_stages(plan.stages);
  info.set_replicas(plan.replicas);
  info.set_micro_batch(plan.micro_batch);
  info.set_stage_to_rank_map(plan.stage_to_rank_map);
  SetPlan(info, plan);
  info.clear_placement();
  for (const auto& p : plan.ranks) *info.add_placement() = p;
  const Node& first = *nodes_.Find(plan.ranks[0].node());
  info.set_master(absl::StrCat(HostOf(first.rec.address()), ":0"));
  info.set_started_at(Now());
  NewGeneration(job);
  Persist(job);
  Emit("job_state", info.id(), "",
       absl::StrCat("STARTING ",
                    plan.pipelines.empty() ? absl::StrCat(plan.stages, "x", plan.replicas)
                                           : absl::StrCat("pipelines ", plan.pipelines),
                    " mb", plan.micro_batch));
  std::set<std::string> used_nodes;
  for (const auto& p : plan.ranks) used_nodes.insert(p.node());
  LOG(INFO) << JobWho(info) << " STARTING stages=" << plan.stages << " replicas=" << plan.replicas
            << " micro_batch=" << plan.micro_batch << " map=" << plan.stage_to_rank_map
            << " pipelines=" << plan.pipelines << " nodes=" << absl::StrJoin(used_nodes, ",");
  SendLaunches(job);
}

v1::LaunchRequest Manager::MakeLaunch(const Job& job, const std::string& node) const {
  const v1::JobInfo& info = job.info();
  v1::LaunchRequest req;
  req.set_job_id(info.id());
  req.set_generation(info.generation());
  req.set_job_name(info.name());
  req.set_spec_yaml(job.rec.spec_yaml());
  req.set_world_size(info.slots());
  auto hp = SplitHostPort(info.master());
  req.set_master_addr(hp.ok() ? hp->first : "");
  req.set_master_port(hp.ok() ? hp->second : 0);
  req.set_stage_to_rank_map(info.stage_to_rank_map());
  req.set_pipelines(info.pipelines());
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
  req.set_schedule(info.schedule());
  for (int b : info.boundaries()) req.add_stage_boundaries(b);
  req.set_profile(info.profile_job());
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
void Manager::SendLaunches(Job& job) {
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
    const Node* nit = nodes_.Find(node_name);
    if (nit == nullptr) continue;
    auto client = agents_->For(nit->rec.address());
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

void Manager::OnLaunchDone(const std::string& job_id, int generation, const std::string& node,
                           absl::StatusOr<v1::LaunchResponse> r) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  v1::JobInfo& info = job.info();
  const bool relaunch =
      info.state() == v1::RECONFIGURING && job.rec.morph().phase() == v1::MorphState::LAUNCHING;
  if (info.generation() != generation || (info.state() != v1::STARTING && !relaunch)) return;
  if (!r.ok()) {
    const std::string reason =
        absl::StrCat("launch on node ", node, " failed: ", r.status().message());
    const auto code = r.status().code();
    if (MorphAllowed(job) && (code == absl::StatusCode::kUnavailable ||
                              code == absl::StatusCode::kDeadlineExceeded || relaunch)) {
      nodes_.MarkUnreachable(node);
      Cause c;  // the node is unreachable: re-plan without it
      c.reason = reason;
      c.leaving = {node};
      c.priority = 3;
      Trigger(job, c);
      return;
    }
    Fail(job, reason);
    return;
  }
  const bool first = SplitHostPort(info.master()).value_or(std::make_pair("", 0)).second == 0;
  job.gen.launch_pending.erase(node);
  if (first) {
    info.set_master(absl::StrCat(HostOf(info.master()), ":", r->master_port()));
    Persist(job);
    SendLaunches(job);  // the rest, now that the port is known (a repeat here is harmless)
  }
  if (job.gen.launch_pending.empty()) MarkRunning(job);
}

void Manager::MarkRunning(Job& job) {
  const bool relaunch = job.info().state() == v1::RECONFIGURING &&
                        job.rec.morph().phase() == v1::MorphState::LAUNCHING;
  if (job.info().state() != v1::STARTING && !relaunch) return;
  job.info().set_state(v1::RUNNING);
  job.gen.running_since = clock_->Now();
  if (relaunch) SetPhase(job, v1::MorphState::RESUMING);
  LOG(INFO) << JobWho(job.info()) << " RUNNING master=" << job.info().master();
  Persist(job);
  Emit("job_state", job.info().id(), "",
       absl::StrCat("RUNNING generation ", job.info().generation(), " (", job.info().stages(), "x",
                    job.info().replicas(), ")"));
  CheckAllExited(job);  // a job can finish before its last launch was acknowledged
}

void Manager::SendStops(Job& job) {
  job.last_stop_sent = clock_->Now();
  std::set<std::string> nodes;
  for (const auto& p : job.info().placement()) nodes.insert(p.node());
  for (const std::string& name : nodes) {
    const Node* nit = nodes_.Find(name);
    if (nit == nullptr || nit->dead) continue;
    v1::StopRequest req;
    req.set_job_id(job.info().id());
    req.set_generation(job.info().generation());
    req.set_grace_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(config_.stop_grace)));
    const std::string who = JobWho(job.info());
    agents_->For(nit->rec.address())->Stop(req, [who, name](absl::StatusOr<v1::StopResponse> r) {
      if (!r.ok()) LOG(WARNING) << who << " stop on node " << name << ": " << r.status();
    });
  }
}

void Manager::RecordExit(Job& job, int rank, int exit_code, int signal, const std::string& node) {
  for (const auto& e : job.rec.exits()) {
    if (e.rank() == rank) return;  // already known
  }
  v1::RankExit* e = job.rec.add_exits();
  e->set_rank(rank);
  e->set_exit_code(exit_code);
  e->set_signal(signal);
  const v1::JobState s = job.info().state();
  const bool live = s == v1::STARTING || s == v1::RUNNING || s == v1::RECONFIGURING;
  if (live && signal == 0 && exit_code == kExitBadInput) {
    // Its input is wrong: no restart can fix that, so no morph (common/launch/exit_codes.h).
    Fail(job, absl::StrCat(
                  "rank ", rank, " on node ", node, " cannot run the job: ",
                  job.gen.worker_error.empty() ? "bad input (see its log)" : job.gen.worker_error));
    return;
  }
  if (live && MorphAllowed(job)) {
    Persist(job);
    const auto phase = job.rec.morph().phase();
    if (phase == v1::MorphState::SAVING || phase == v1::MorphState::STOPPING) {
      AdvanceMorph(job);  // an exit the morph waits for
      return;
    }
    const std::string who = absl::StrCat("rank ", rank, " on node ", node);
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
      Trigger(job, c);
    } else if (job.gen.stopped_after > 0 && job.gen.stopped_after < job.spec.train.steps) {
      Cause c;
      c.reason =
          absl::StrCat("workers stopped on request (SIGUSR1) after step ", job.gen.stopped_after);
      c.graceful = true;
      c.priority = 2;
      Trigger(job, c);
    } else {
      CheckAllExited(job);
    }
    AdvanceMorph(job);
    return;
  }
  if ((s == v1::STARTING || s == v1::RUNNING) && (exit_code != 0 || signal != 0)) {
    if (job.gen.pending_failure.empty()) {
      job.gen.pending_failure =
          absl::StrCat("rank ", rank, " on node ", node, " ",
                       signal != 0 ? absl::StrCat("was killed by ", SignalName(signal))
                                   : absl::StrCat("exited with code ", exit_code));
      job.gen.fail_at = clock_->Now() + 2 * config_.heartbeat_period;
    }
    Persist(job);
    return;
  }
  Persist(job);
  CheckAllExited(job);
}

// A rank the job placed on this node that its agent no longer reports, neither running nor
// exited: the agent restarted (its workers died with it) or lost track of them. Without
// this the job would wait for that rank forever. Launches are acknowledged only after the
// workers exist, so a RUNNING job's ranks are in every heartbeat built after the ack; the
// two-period allowance covers a heartbeat that was already in flight, and a rank reported
// again later (a heartbeat slower than that) withdraws the charge. A CANCELLING job only
// waits for its ranks to be gone, so an unreported rank counts as killed.
void Manager::CheckUnreported(const Node& node,
                              const std::set<std::pair<std::string, int>>& reported) {
  const absl::Time now = clock_->Now();
  const std::string& name = node.rec.name();
  for (auto& [id, job] : jobs_) {
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
    if (now - since < 2 * config_.heartbeat_period) continue;
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
      for (int r : missing) RecordExit(job, r, 0, SIGKILL, name);
      continue;
    }
    job.gen.unreported = {name, missing.front()};
    const std::string reason = UnreportedReason(*job.gen.unreported);
    LOG(WARNING) << JobWho(job.info()) << " " << reason;
    if (MorphAllowed(job)) {
      Cause c;
      c.reason = reason;
      c.priority = 3;
      Trigger(job, c);
      continue;
    }
    if (job.gen.pending_failure.empty()) {
      job.gen.pending_failure = reason;
      job.gen.fail_at = now + 2 * config_.heartbeat_period;
    }
  }
}

bool Manager::PlacedOn(const Job& job, const std::string& node, int rank) {
  for (const auto& p : job.info().placement()) {
    if (p.rank() == rank) return p.node() == node;
  }
  return false;
}

std::string Manager::RanksOn(const Job& job, const std::string& node) const {
  std::vector<int> ranks;
  for (const auto& p : job.info().placement()) {
    if (p.node() == node) ranks.push_back(p.rank());
  }
  return absl::StrCat("rank", ranks.size() > 1 ? "s " : " ", absl::StrJoin(ranks, ","));
}

void Manager::SettleFailure(Job& job) {
  const absl::Time now = clock_->Now();
  std::set<std::string> job_nodes;
  for (const auto& p : job.info().placement()) job_nodes.insert(p.node());
  for (const std::string& name : job_nodes) {
    const Node* it = nodes_.Find(name);
    if (it == nullptr) continue;
    const absl::Duration silent = now - it->last_seen;
    if (it->dead || silent >= 1.5 * config_.heartbeat_period) {
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

void Manager::CheckAllExited(Job& job) {
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

void Manager::Succeed(Job& job) {
  if (job.info().state() != v1::RUNNING) return;
  job.info().set_state(v1::SUCCEEDED);
  job.info().set_reason("");
  job.info().set_finished_at(Now());
  LOG(INFO) << JobWho(job.info()) << " SUCCEEDED at step " << job.info().step();
  job.rec.clear_morph();
  Persist(job);
  Emit("job_state", job.info().id(), "", absl::StrCat("SUCCEEDED at step ", job.info().step()));
  post_([this] { Schedule(); });
}

void Manager::Fail(Job& job, const std::string& reason) {
  if (Terminal(job.info().state())) return;
  const bool had_workers = Active(job.info().state());
  job.info().set_state(v1::FAILED);
  job.info().set_reason(reason);
  job.info().set_finished_at(Now());
  job.gen.launch_pending.clear();
  job.rec.clear_morph();
  LOG(WARNING) << JobWho(job.info()) << " FAILED: " << reason;
  Persist(job);
  Emit("job_state", job.info().id(), "", absl::StrCat("FAILED: ", reason));
  if (had_workers) SendStops(job);
  post_([this] { Schedule(); });
}

void Manager::MarkCancelled(Job& job, const std::string& reason) {
  const v1::JobState s = job.info().state();
  if (s != v1::PENDING && s != v1::CANCELLING) return;
  job.info().set_state(v1::CANCELLED);
  job.info().set_reason(reason);
  job.info().set_finished_at(Now());
  LOG(INFO) << JobWho(job.info()) << " CANCELLED";
  Persist(job);
  Emit("job_state", job.info().id(), "", absl::StrCat("CANCELLED: ", reason));
  post_([this] { Schedule(); });
}

void Manager::GetLogs(const v1::GetLogsRequest& req,
                      std::function<void(absl::StatusOr<v1::GetLogsResponse>)> done) {
  auto it = jobs_.find(req.job_id());
  if (it == jobs_.end()) {
    done(absl::NotFoundError(absl::StrCat("no job with id '", req.job_id(), "'")));
    return;
  }
  const Job& job = it->second;
  std::string node_name;
  for (const auto& p : job.info().placement()) {
    if (p.rank() == req.rank()) node_name = p.node();
  }
  if (node_name.empty()) {
    if (job.info().placement_size() == 0) {
      done(absl::FailedPreconditionError(absl::StrCat("job ", req.job_id(), " is ",
                                                      v1::JobState_Name(job.info().state()),
                                                      " and has never run: no logs")));
    } else {
      done(absl::NotFoundError(absl::StrCat("job ", req.job_id(), " has no rank ", req.rank(),
                                            " (ranks 0..", job.info().placement_size() - 1, ")")));
    }
    return;
  }
  const Node* nit = nodes_.Find(node_name);
  if (nit == nullptr) {
    done(absl::UnavailableError(absl::StrCat("node ", node_name, " is unknown")));
    return;
  }
  v1::FetchLogsRequest fetch;
  fetch.set_job_id(req.job_id());
  fetch.set_rank(req.rank());
  fetch.set_offset(req.offset());
  fetch.set_max_bytes(req.max_bytes());
  const bool finished = Terminal(job.info().state());
  agents_->For(nit->rec.address())
      ->FetchLogs(fetch, [done = std::move(done), node_name,
                          finished](absl::StatusOr<v1::FetchLogsResponse> r) {
        if (!r.ok()) {
          done(absl::Status(r.status().code(), absl::StrCat("logs from node ", node_name, ": ",
                                                            r.status().message())));
          return;
        }
        v1::GetLogsResponse resp;
        resp.set_data(r->data());
        resp.set_next_offset(r->next_offset());
        resp.set_node(node_name);
        resp.set_job_finished(finished);
        done(std::move(resp));
      });
}

}  // namespace varuna

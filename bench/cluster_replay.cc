// Replays a job-arrival trace through the manager's own components (docs/benchmarks.md (o)):
// the job and morph controllers, with the allocator (manager/sharing) or without, on a
// simulated clock, with fake agents whose workers progress at the rate AutoConfig's simulator
// gives their shape and pay a morph's measured cost at each resize.
//
// Usage: cluster_replay --trace FILE.csv --slots N --policy queue|static|allocator
//                       [--mapping FILE] [--slots_per_node 8] [--dt_s 10] [--morph_cost_s 2]
//                       [--load 1]
// --load F divides every arrival time by F: the same jobs arrive F times as often, the way
// Pollux's sensitivity study varies the load on one cluster.
// The last line printed is one JSON object: policy, jobs, avg_jct_s, p99_jct_s, makespan_s,
// utilization (allocated slot-seconds over available slot-seconds up to the makespan).
//
// Policies, on the same jobs: queue (the manager without a sharing: block: submission order,
// each job what AutoConfig wants of the free slots up to 2x its request, never resized),
// static (each job at exactly its requested width, in submission order with backfill, never
// resized), allocator (a sharing: block; every job elastic in [1, 2x its request]). Each job
// is its own user (the trace has none), so fair share is between jobs.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/launch/exit_codes.h"
#include "common/planner/autoconfig.h"
#include "common/planner/profile.h"
#include "manager/jobs/event_log.h"
#include "manager/jobs/job_admission.h"
#include "manager/jobs/job_controller.h"
#include "manager/jobs/job_table.h"
#include "manager/jobs/profile_store.h"
#include "manager/jobs/step_series.h"
#include "manager/manager_config.h"
#include "manager/morph/morph_controller.h"
#include "manager/nodes/node_table.h"
#include "manager/reconciler.h"
#include "manager/sharing/sharing_controller.h"
#include "manager/state/state_store.h"
#include "tests/testing/fake_agents.h"
#include "tests/testing/fake_clock.h"

namespace varuna {
namespace {

using testing::FakeAgentPool;
using testing::FakeClock;
using testing::PostQueue;

struct App {
  int layers = 0, d_model = 0, heads = 0, seq_len = 0;
  int64_t samples = 0;  // the work of one job
};

struct TraceJob {
  std::string name, app;
  double time = 0;
  int replicas = 1;
  // Filled as it runs.
  std::string id;
  double samples_done = 0;
  int last_generation = 0;
  bool done = false;
  double finished_at = -1;
};

struct Options {
  std::string trace, mapping, policy;
  int slots = 0, per_node = 8;
  double dt = 10, morph_cost = 2;
  double load = 1;  // arrivals come this many times as often (times divided by it)
};

[[noreturn]] void Die(const std::string& why) {
  std::cerr << "cluster_replay: " << why << "\n";
  std::exit(2);
}

std::vector<std::vector<std::string>> ReadCsv(const std::string& path) {
  std::ifstream in(path);
  if (!in) Die(absl::StrCat("cannot read ", path));
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    rows.push_back(absl::StrSplit(line, ','));
  }
  if (rows.size() < 2) Die(absl::StrCat(path, ": no rows"));
  return rows;
}

int Int(const std::string& s, const std::string& what) {
  int v = 0;
  if (!absl::SimpleAtoi(s, &v)) Die(absl::StrCat(what, ": '", s, "' is not a number"));
  return v;
}

class Replay final : public NodeTable::Listener {
 public:
  explicit Replay(Options o) : o_(std::move(o)) {
    for (const auto& row : ReadCsv(o_.mapping)) {
      if (row[0] == "application") continue;
      if (row.size() != 6) Die("mapping: want application,layers,d_model,heads,seq_len,samples");
      App a{Int(row[1], "layers"), Int(row[2], "d_model"), Int(row[3], "heads"),
            Int(row[4], "seq_len"), Int(row[5], "samples")};
      apps_[row[0]] = a;
    }
    for (const auto& row : ReadCsv(o_.trace)) {
      if (row[0] == "name") continue;
      if (row.size() < 4) Die("trace: want name,time,application,num_replicas[,...]");
      TraceJob j;
      j.name = row[0];
      j.time = Int(row[1], "time") / o_.load;
      j.app = row[2];
      j.replicas = std::max(1, std::min(Int(row[3], "num_replicas"), o_.slots));
      if (!apps_.count(j.app)) Die(absl::StrCat("trace: application '", j.app, "' not mapped"));
      jobs_.push_back(j);
    }
    std::sort(jobs_.begin(), jobs_.end(),
              [](const TraceJob& a, const TraceJob& b) { return a.time < b.time; });
    Build();
  }
  ~Replay() override {
    reconciler_.reset();
    sharing_.reset();
    morph_.reset();
    jobs_ctl_.reset();
    store_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);  // the manager's state of this replay
  }

  void Run() {
    for (int i = 0; i * o_.per_node < o_.slots; ++i) {
      v1::RegisterRequest req;
      req.set_name(absl::StrCat("n", i));
      req.set_address(absl::StrCat("n", i, ":7071"));
      req.set_slots(std::min(o_.per_node, o_.slots - i * o_.per_node));
      if (!reconciler_->Register(req).ok()) Die("register failed");
    }
    size_t next = 0, finished = 0;
    double used_slot_s = 0;
    const double limit = 30 * 86400;
    for (t_ = 0; finished < jobs_.size() && t_ < limit; t_ += o_.dt) {
      for (; next < jobs_.size() && jobs_[next].time <= t_; ++next) Submit(jobs_[next]);
      Settle();
      int used = 0;
      for (TraceJob& j : jobs_) {
        if (j.id.empty() || j.done) continue;
        const Job* job = jobs_table_->Find(j.id);
        const v1::JobState s = job->info().state();
        if (Terminal(s)) {
          if (s != v1::SUCCEEDED)
            Die(absl::StrCat(j.name, " ended ", v1::JobState_Name(s), ": ", job->info().reason()));
          j.done = true;
          j.finished_at = t_;
          ++finished;
          continue;
        }
        if (s == v1::PENDING) continue;
        used += job->info().slots();
        if (s != v1::RUNNING || job->morphing()) continue;
        const double rate = Rate(*job);
        if (job->info().generation() != j.last_generation) {
          if (j.last_generation > 0) j.samples_done -= o_.morph_cost * rate;  // the resize's cost
          j.last_generation = job->info().generation();
        }
        j.samples_done += rate * o_.dt;
      }
      used_slot_s += used * o_.dt;
      if (static_cast<int64_t>(t_) % 3600 == 0) {
        std::cerr << "cluster_replay: " << o_.policy << " t=" << t_ / 3600 << "h submitted=" << next
                  << " finished=" << finished << " slots in use=" << used << "\n";
      }
      clock_.Advance(absl::Seconds(o_.dt));
    }
    if (finished < jobs_.size()) Die("the trace did not finish within 30 simulated days");
    std::vector<double> jct;
    double makespan = 0;
    for (const TraceJob& j : jobs_) {
      jct.push_back(j.finished_at - j.time);
      makespan = std::max(makespan, j.finished_at);
    }
    std::sort(jct.begin(), jct.end());
    double sum = 0;
    for (double v : jct) sum += v;
    const double p99 = jct[std::min(jct.size() - 1, static_cast<size_t>(0.99 * jct.size()))];
    std::printf(
        "{\"policy\": \"%s\", \"jobs\": %zu, \"avg_jct_s\": %.0f, \"p99_jct_s\": %.0f, "
        "\"makespan_s\": %.0f, \"utilization\": %.3f, \"slots\": %d, \"morphs\": %d, "
        "\"load\": %g}\n",
        o_.policy.c_str(), jct.size(), sum / jct.size(), p99, makespan,
        used_slot_s / (o_.slots * std::max(1.0, makespan)), o_.slots, Morphs(), o_.load);
  }

 private:
  void Build() {
    dir_ = std::filesystem::temp_directory_path() / absl::StrCat("replay-", getpid());
    std::filesystem::create_directories(dir_);
    config_.state_dir = dir_.string();
    config_.morph_in_place = false;  // the fakes follow the relaunch path's phases
    config_.morph_coalesce = absl::ZeroDuration();
    config_.scale_up_delay = absl::ZeroDuration();
    config_.max_morphs = 1000000;
    config_.max_pending_jobs_per_user = 1000000;
    config_.dead_after_missed = 1000000;  // the fakes heartbeat only when something changed
    config_.suspect_after_missed = 999999;
    if (o_.policy == "allocator") {
      config_.sharing.enabled = true;
      config_.sharing.period = absl::Seconds(60);
      config_.sharing.min_interval = absl::Seconds(300);
      config_.sharing.morph_cost_s = o_.morph_cost;
    }
    auto store = StateStore::Open(config_.state_dir);
    if (!store.ok()) Die(std::string(store.status().message()));
    store_ = *std::move(store);
    nodes_ = std::make_unique<NodeTable>(config_.node_options(), &clock_, store_.get(), this);
    jobs_table_ = std::make_unique<JobTable>(store_.get(), nodes_.get());
    events_ = std::make_unique<EventLog>(&clock_, store_.get());
    steps_ = std::make_unique<StepSeries>(store_.get());
    profiles_ = std::make_unique<ProfileStore>(store_.get());
    jobs_ctl_ = std::make_unique<JobController>(config_.job_options(), &clock_, jobs_table_.get(),
                                                nodes_.get(), &agents_, loop_.poster(),
                                                events_.get(), profiles_.get(), steps_.get());
    morph_ = std::make_unique<MorphController>(config_.morph_options(), &clock_, jobs_table_.get(),
                                               nodes_.get(), &agents_, loop_.poster(),
                                               events_.get(), profiles_.get(), jobs_ctl_.get());
    if (config_.sharing.enabled) {
      sharing_ = std::make_unique<SharingController>(config_.sharing, &clock_, jobs_table_.get(),
                                                     nodes_.get(), events_.get(), profiles_.get(),
                                                     morph_.get());
    }
    jobs_ctl_->set_morph(morph_.get(), sharing_.get());
    reconciler_ =
        std::make_unique<HeartbeatReconciler>(config_, &clock_, jobs_table_.get(), nodes_.get(),
                                              jobs_ctl_.get(), morph_.get(), loop_.poster());
  }

  // NodeTable::Listener, as Manager wires it (no node comes or goes in a replay).
  void OnNodeGone(const NodeTable::Gone& gone) override { jobs_ctl_->OnNodeGone(gone); }
  void OnNodeJoined(const std::string& node, const std::string&) override {
    morph_->NoteJoined(node);
  }
  void OnNodeEvent(const std::string&, const std::string&, const std::string&) override {}
  void OnSlotsChanged() override {}

  std::string SpecOf(const TraceJob& j) const {
    const App& a = apps_.at(j.app);
    // 96 samples a step: every width the trace asks for (1-32) and 2x it divides them.
    const int64_t batch = 96;
    std::string parallel, resources;
    if (o_.policy == "static") {
      parallel = absl::StrCat("{stages: 1, replicas: ", j.replicas, "}");
      resources = "morphing: false\n";
    } else {
      parallel = "{stages: 1}";
      resources = absl::StrCat("resources: {min_slots: 1, max_slots: ", 2 * j.replicas,
                               "}\ncheckpoint: {dir: /nonexistent/ckpt}\n");
    }
    return absl::StrCat("name: ", j.name, "\nmodel: {kind: gpt, layers: ", a.layers,
                        ", d_model: ", a.d_model, ", heads: ", a.heads, ", seq_len: ", a.seq_len,
                        ", vocab: 50304}\ndata: {kind: tokens, path: /nonexistent/data}\n",
                        "train: {global_batch: ", batch,
                        ", steps: ", (a.samples + batch - 1) / batch,
                        ", precision: bf16}\nparallel: ", parallel, "\n", resources);
  }

  void Submit(TraceJob& j) {
    v1::SubmitRequest req;
    req.set_spec_yaml(SpecOf(j));
    auto spec = JobAdmission::Admit(req);
    if (!spec.ok()) Die(absl::StrCat(j.name, ": ", spec.status().message()));
    auto info = jobs_ctl_->Submit(req, *std::move(spec), j.name);
    if (!info.ok()) Die(absl::StrCat(j.name, ": ", info.status().message()));
    j.id = info->id();
    loop_.Run();
  }

  // Samples per second of the job's current shape, from AutoConfig's simulator (cached).
  double Rate(const Job& job) {
    const v1::JobInfo& info = job.info();
    const std::string key = absl::StrCat(ModelKey(job.spec.model), "/", info.stages(), "x",
                                         info.replicas(), "/", info.micro_batch());
    auto it = rates_.find(key);
    if (it != rates_.end()) return it->second;
    auto profile = BuiltinProfile(job.spec);
    PlanRequest req;
    for (int left = info.slots(); left > 0; left -= o_.per_node) {
      req.slots_per_node.push_back(std::min(left, o_.per_node));
    }
    auto plan = profile.ok()
                    ? SimulateShape(job.spec, *profile, info.stages(), info.replicas(),
                                    std::max(1, info.micro_batch()), SchedulePolicy::kVaruna, req)
                    : absl::StatusOr<v1::Plan>(profile.status());
    const double rate = plan.ok() && plan->samples_per_s() > 0 ? plan->samples_per_s() : 1;
    rates_[key] = rate;
    std::cerr << "cluster_replay: " << key << " runs at " << rate << " samples/s\n";
    return rate;
  }

  // Heartbeats from every node with what its workers do, and the agents' answers, until the
  // manager's state stops changing (a morph runs all its phases within one tick).
  void Settle() {
    for (int round = 0; round < 20; ++round) {
      const std::string before = Fingerprint();
      for (const auto& [name, n] : nodes_->all()) Beat(name);
      loop_.Run();
      agents_.AnswerLaunches();
      agents_.AnswerCheckpoints();
      while (!agents_.stops.empty()) {
        auto c = std::move(agents_.stops.front());
        agents_.stops.pop_front();
        c.done(v1::StopResponse());
      }
      loop_.Run();
      nodes_->Tick([](const std::string&) { return 0; });
      jobs_ctl_->Tick();
      jobs_ctl_->Schedule();
      morph_->CheckGrowth();
      loop_.Run();
      if (Fingerprint() == before && agents_.launches.empty() && agents_.checkpoints.empty()) {
        return;
      }
    }
  }

  std::string Fingerprint() const {
    std::string fp;
    for (const std::string& id : jobs_table_->order()) {
      const Job& j = *jobs_table_->Find(id);
      absl::StrAppend(&fp, id, j.info().state(), ":", j.info().generation(), ":",
                      j.rec.morph().phase(), ":", j.rec.exits_size(), ";");
    }
    return fp;
  }

  void Beat(const std::string& node) {
    v1::HeartbeatRequest req;
    req.set_name(node);
    for (const TraceJob& t : jobs_) {
      if (t.id.empty()) continue;
      const Job& job = *jobs_table_->Find(t.id);
      const v1::JobInfo& info = job.info();
      if (!Active(info.state())) continue;
      const int64_t step =
          std::min<int64_t>(info.total_steps(), static_cast<int64_t>(t.samples_done / 96));
      const bool finished = t.samples_done >= apps_.at(t.app).samples;
      const auto phase = job.rec.morph().phase();
      const bool saving = info.state() == v1::CANCELLING ||
                          (job.morphing() &&
                           (phase == v1::MorphState::SAVING || phase == v1::MorphState::STOPPING));
      for (const auto& p : info.placement()) {
        if (p.node() != node) continue;
        v1::WorkerStatus* w = req.add_workers();
        w->set_job_id(t.id);
        w->set_generation(info.generation());
        w->set_rank(p.rank());
        if (finished || saving) {
          w->set_state(v1::WORKER_EXITED);
          w->set_exit_code(finished ? 0 : kExitRescued);
          w->set_saved_step(step);
          w->mutable_progress()->set_step(finished ? info.total_steps() : step);
          continue;
        }
        w->set_state(v1::WORKER_RUNNING);
        const int64_t from =
            std::max<int64_t>(0, job.gen.resumed_from >= 0 ? job.gen.resumed_from : info.step());
        w->set_resumed_from(from);
        const int64_t now = std::max(step, from + 1);
        // One step record per generation (what ends its morph): storing every step of 160
        // jobs would make the replay a benchmark of the step store.
        if (job.gen.newest_step <= from) w->add_steps()->set_step(now);
        w->mutable_progress()->set_step(now);
      }
    }
    auto resp = reconciler_->Heartbeat(req);
    if (!resp.ok()) Die(absl::StrCat("heartbeat of ", node, ": ", resp.status().message()));
  }

  int Morphs() const {
    int n = 0;
    for (const auto& [id, job] : jobs_table_->all()) n += job.info().morphs_size();
    return n;
  }

  const Options o_;
  std::map<std::string, App> apps_;
  std::vector<TraceJob> jobs_;
  std::map<std::string, double> rates_;
  double t_ = 0;
  std::filesystem::path dir_;
  ManagerConfig config_;
  FakeClock clock_;
  FakeAgentPool agents_;
  PostQueue loop_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<NodeTable> nodes_;
  std::unique_ptr<JobTable> jobs_table_;
  std::unique_ptr<EventLog> events_;
  std::unique_ptr<StepSeries> steps_;
  std::unique_ptr<ProfileStore> profiles_;
  std::unique_ptr<JobController> jobs_ctl_;
  std::unique_ptr<MorphController> morph_;
  std::unique_ptr<SharingController> sharing_;
  std::unique_ptr<HeartbeatReconciler> reconciler_;
};

}  // namespace
}  // namespace varuna

int main(int argc, char** argv) {
  varuna::Options o;
  o.mapping = std::string(VARUNA_SOURCE_DIR) + "/bench/cluster_replay_mapping.csv";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--trace")
      o.trace = v;
    else if (k == "--slots")
      o.slots = std::atoi(v.c_str());
    else if (k == "--policy")
      o.policy = v;
    else if (k == "--mapping")
      o.mapping = v;
    else if (k == "--slots_per_node")
      o.per_node = std::atoi(v.c_str());
    else if (k == "--dt_s")
      o.dt = std::atof(v.c_str());
    else if (k == "--morph_cost_s")
      o.morph_cost = std::atof(v.c_str());
    else if (k == "--load")
      o.load = std::atof(v.c_str());
    else
      varuna::Die(absl::StrCat("unknown flag ", k));
  }
  if (o.trace.empty() || o.slots < 1 || o.per_node < 1 || !(o.dt > 0) || !(o.load > 0) ||
      (o.policy != "queue" && o.policy != "static" && o.policy != "allocator")) {
    varuna::Die(
        "usage: cluster_replay --trace FILE.csv --slots N --policy queue|static|allocator "
        "[--mapping FILE] [--slots_per_node 8] [--dt_s 10] [--morph_cost_s 2] [--load 1]");
  }
  varuna::Replay(o).Run();
  return 0;
}

#pragma once

// The manager's components built by hand around an in-memory world: a fake clock, fake
// agents (tests/testing/fake_agents.h), the loop as a queue the test drains, and a state
// database in a temporary directory. Tests call the components directly; nothing sleeps,
// nothing polls. The listener below forwards node changes the way Manager wires them.

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "manager/jobs/event_log.h"
#include "manager/jobs/job_controller.h"
#include "manager/jobs/job_table.h"
#include "manager/jobs/profile_store.h"
#include "manager/jobs/step_series.h"
#include "manager/manager_config.h"
#include "manager/morph/morph_controller.h"
#include "manager/nodes/node_table.h"
#include "manager/reconciler.h"
#include "manager/state/state_store.h"
#include "tests/testing/fake_agents.h"
#include "tests/testing/fake_clock.h"

namespace varuna::testing {

class ControllerFixture : public ::testing::Test, public NodeTable::Listener {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/ctl_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    data_ = dir_ + "/corpus.txt";
    config_.state_dir = dir_ + "/state";
    config_.heartbeat_period = absl::Seconds(1);
    config_.suspect_after_missed = 3;
    config_.dead_after_missed = 10;
    config_.stop_grace = absl::Seconds(5);
    config_.start_timeout = absl::Seconds(120);
    config_.morph_save_timeout = absl::Seconds(60);
    config_.morph_coalesce = absl::Seconds(1);
    config_.scale_up_delay = absl::Seconds(10);
    // The relaunch path's phases, step by step against fakes; the in-place path (the default)
    // needs real workers: tests/e2e/in_place_e2e.py.
    config_.morph_in_place = false;
    Build();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // (Re)builds every component on the same state directory: a manager restart.
  void Build() {
    reconciler_.reset();
    morph_.reset();
    jobs_ctl_.reset();
    profiles_.reset();
    steps_.reset();
    events_.reset();
    jobs_.reset();
    nodes_.reset();
    store_.reset();
    std::filesystem::create_directories(config_.state_dir);
    auto store = StateStore::Open(config_.state_dir);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    nodes_ = std::make_unique<NodeTable>(config_.node_options(), &clock_, store_.get(), this);
    jobs_ = std::make_unique<JobTable>(store_.get(), nodes_.get());
    events_ = std::make_unique<EventLog>(&clock_, store_.get());
    steps_ = std::make_unique<StepSeries>(store_.get());
    profiles_ = std::make_unique<ProfileStore>(store_.get());
    jobs_ctl_ = std::make_unique<JobController>(config_.job_options(), &clock_, jobs_.get(),
                                                nodes_.get(), &agents_, loop_.poster(),
                                                events_.get(), profiles_.get(), steps_.get());
    morph_ = std::make_unique<MorphController>(config_.morph_options(), &clock_, jobs_.get(),
                                               nodes_.get(), &agents_, loop_.poster(),
                                               events_.get(), profiles_.get(), jobs_ctl_.get());
    jobs_ctl_->set_morph(morph_.get());
    reconciler_ = std::make_unique<HeartbeatReconciler>(
        config_, &clock_, jobs_.get(), nodes_.get(), jobs_ctl_.get(), morph_.get(), loop_.poster());
  }

  // NodeTable::Listener, wired as Manager wires it; every call is also recorded.
  void OnNodeGone(const NodeTable::Gone& gone) override {
    node_events_.push_back((gone.kind == "lost" ? "lost " : "leaving ") + gone.node);
    jobs_ctl_->OnNodeGone(gone);
  }
  void OnNodeJoined(const std::string& node, const std::string& how) override {
    node_events_.push_back("joined " + node);
    morph_->NoteJoined(node);
  }
  void OnNodeEvent(const std::string& kind, const std::string& node,
                   const std::string& message) override {
    node_events_.push_back(kind + " " + node);
  }
  void OnSlotsChanged() override {}

  void AddNode(const std::string& name, int slots) {
    v1::RegisterRequest req;
    req.set_name(name);
    req.set_address(name + ":7071");
    req.set_slots(slots);
    ASSERT_TRUE(reconciler_->Register(req).ok());
    Beat(name, {});
  }

  // A heartbeat from `name` reporting `workers`; returns the manager's answer.
  v1::HeartbeatResponse Beat(const std::string& name, const std::vector<v1::WorkerStatus>& w) {
    v1::HeartbeatRequest req;
    req.set_name(name);
    for (const auto& s : w) *req.add_workers() = s;
    auto resp = reconciler_->Heartbeat(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    loop_.Run();
    return resp.ok() ? *resp : v1::HeartbeatResponse();
  }

  // A worker of `job`'s current generation, as its agent reports it.
  v1::WorkerStatus Worker(const std::string& job_id, int rank, bool running, int exit_code = 0,
                          int signal = 0) {
    v1::WorkerStatus w;
    w.set_job_id(job_id);
    w.set_generation(Job(job_id).info().generation());
    w.set_rank(rank);
    w.set_state(running ? v1::WORKER_RUNNING : v1::WORKER_EXITED);
    w.set_exit_code(exit_code);
    w.set_signal(signal);
    w.set_resumed_from(-1);
    return w;
  }

  // Every rank of `job` on `node` reported with the same state.
  std::vector<v1::WorkerStatus> RanksOn(const std::string& job_id, const std::string& node,
                                        bool running, int exit_code = 0) {
    std::vector<v1::WorkerStatus> out;
    for (const auto& p : Job(job_id).info().placement()) {
      if (p.node() == node) out.push_back(Worker(job_id, p.rank(), running, exit_code));
    }
    return out;
  }

  std::string Spec(const std::string& extra = "parallel: {stages: 2}") const {
    return absl::StrCat(
        "name: t\nmodel: {kind: gpt, layers: 4, d_model: 32, heads: 2, "
        "seq_len: 8, vocab: 256}\ndata: {kind: text, path: ",
        data_, "}\ntrain: {global_batch: 8, steps: 20}\n", extra, "\n");
  }
  // A job that can morph (checkpoint.dir set).
  std::string MorphSpec(const std::string& extra = "parallel: {stages: 2}") const {
    return Spec(absl::StrCat(extra, "\ncheckpoint: {dir: ", dir_, "/ckpt}"));
  }

  std::string Submit(const std::string& yaml, const std::string& request_id = "",
                     const std::string& user = "") {
    v1::SubmitRequest req;
    req.set_spec_yaml(yaml);
    req.set_request_id(request_id);
    auto spec = JobAdmission::Admit(req);
    EXPECT_TRUE(spec.ok()) << spec.status();
    if (!spec.ok()) return "";
    auto info = jobs_ctl_->Submit(req, *std::move(spec), user);
    EXPECT_TRUE(info.ok()) << info.status();
    loop_.Run();  // Schedule
    return info.ok() ? info->id() : "";
  }

  const ::varuna::Job& Job(const std::string& id) {
    const ::varuna::Job* job = jobs_->Find(id);
    EXPECT_NE(job, nullptr) << id;
    return *job;
  }
  v1::JobState State(const std::string& id) { return Job(id).info().state(); }
  v1::MorphState::Phase Phase(const std::string& id) { return Job(id).rec.morph().phase(); }

  // The manager's Tick, in Manager's order.
  void Tick() {
    nodes_->Tick([](const std::string&) { return 0; });
    jobs_ctl_->Tick();
    jobs_ctl_->Schedule();
    morph_->CheckGrowth();
    loop_.Run();
  }
  void Advance(absl::Duration d) { clock_.Advance(d); }

  // Answers the launches, twice if needed (rank 0's node first, then the rest).
  void AnswerLaunches() {
    for (int i = 0; i < 3 && agents_.AnswerLaunches() > 0; ++i) loop_.Run();
  }

  std::string dir_, data_;
  ManagerConfig config_;
  FakeClock clock_;
  FakeAgentPool agents_;
  PostQueue loop_;
  std::vector<std::string> node_events_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<NodeTable> nodes_;
  std::unique_ptr<JobTable> jobs_;
  std::unique_ptr<EventLog> events_;
  std::unique_ptr<StepSeries> steps_;
  std::unique_ptr<ProfileStore> profiles_;
  std::unique_ptr<JobController> jobs_ctl_;
  std::unique_ptr<MorphController> morph_;
  std::unique_ptr<HeartbeatReconciler> reconciler_;
};

}  // namespace varuna::testing

// The control plane over loopback gRPC: morphing on loss, notice, machine_list and restart
// (fixture: control_plane_fixture.h).

#include "tests/manager/control_plane_fixture.h"

namespace varuna {
namespace {

// docs/morphing.md: a node lost without notice -> RECONFIGURING, the survivors are asked to
// save (SIGUSR2), the job relaunches as generation 2 on what is left, resuming from the
// newest checkpoint, and the morph is recorded with its phases and steps lost.
TEST_F(ControlPlaneTest, LostNodeMorphsTheJobOntoTheNodesLeft) {
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  const std::string ckpt = dir_ + "/ckpt";
  auto job = Submit(Spec(absl::StrCat("parallel: {stages: 2}\ncheckpoint: {dir: ", ckpt, "}")));
  ASSERT_THAT(job.status(), IsOk());
  const std::string id = job->id();
  ASSERT_TRUE(WaitState(id, v1::RUNNING));
  ASSERT_EQ(Get(id).replicas(), 2);
  auto append = [](const std::string& path, const std::string& line) {
    std::ofstream(path, std::ios::app) << line << "\n";
  };
  const std::string p1 = agents_[0]->launcher.procs()[0].spec.env.at("VARUNA_PROGRESS_FILE");
  append(p1, R"({"ready": true, "resumed_from": 0, "t": 1})");
  for (int s = 1; s <= 5; ++s) {
    append(p1, absl::StrCat(R"({"step": )", s, R"(, "loss": )", 10 - s, "}"));
  }
  BeatAll();
  EXPECT_EQ(Get(id).step(), 5);

  // a2 goes silent; a1 keeps beating until a2 is DEAD.
  for (int i = 0; i < 11; ++i) {
    clock_.Advance(absl::Seconds(1));
    EXPECT_THAT(agents_[0]->server->HeartbeatOnce(), IsOk());
    Tick();
  }
  EXPECT_EQ(NodeStates()["a2"], v1::DEAD);
  v1::JobInfo info = Get(id);
  EXPECT_EQ(info.state(), v1::RECONFIGURING) << info.DebugString();
  EXPECT_THAT(info.reason(), ::testing::HasSubstr("node a2 lost"));
  // The survivors were told to abort the step and save (SIGUSR2); they do and exit 75.
  ASSERT_TRUE(Eventually([&] {
    for (const auto& p : agents_[0]->launcher.procs()) {
      if (std::find(p.signals.begin(), p.signals.end(), SIGUSR2) == p.signals.end()) return false;
    }
    return true;
  }));
  for (const auto& p : agents_[0]->launcher.procs()) {
    agents_[0]->launcher.Exit(p.pid, kExitRescued);
  }
  EXPECT_THAT(agents_[0]->server->HeartbeatOnce(), IsOk());
  clock_.Advance(absl::Seconds(2));  // past morph_coalesce
  Tick();
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return Get(id).state() == v1::RUNNING;
  })) << Get(id).DebugString();
  info = Get(id);
  EXPECT_EQ(info.generation(), 2);
  EXPECT_EQ(info.stages(), 2);
  EXPECT_EQ(info.replicas(), 1);
  for (const auto& p : info.placement()) EXPECT_EQ(p.node(), "a1");
  // Generation 2 resumes from the newest complete checkpoint.
  const auto procs = agents_[0]->launcher.procs();
  ASSERT_EQ(procs.size(), 4u);
  const auto& argv = procs.back().spec.argv;
  EXPECT_NE(std::find(argv.begin(), argv.end(), "--resume_step=auto"), argv.end());

  // It reports ready (resumed after step 4: one step lost) and steps on.
  const std::string p2 = procs.back().spec.env.at("VARUNA_PROGRESS_FILE");
  append(p2, R"({"ready": true, "resumed_from": 4, "t": 1})");
  const std::string p3 = procs[2].spec.env.at("VARUNA_PROGRESS_FILE");
  append(p3, R"({"ready": true, "resumed_from": 4, "t": 1})");
  append(p2, R"({"step": 5, "loss": 4.5})");
  append(p2, R"({"step": 6, "loss": 3.5})");
  EXPECT_THAT(agents_[0]->server->HeartbeatOnce(), IsOk());
  info = Get(id);
  ASSERT_EQ(info.morphs_size(), 1) << info.DebugString();
  const v1::MorphRecord& m = info.morphs(0);
  EXPECT_EQ(m.from().replicas(), 2);
  EXPECT_EQ(m.to().replicas(), 1);
  EXPECT_EQ(m.steps_lost(), 1);
  EXPECT_EQ(m.resumed_from(), 4);
  EXPECT_FALSE(m.graceful());
  for (const char* phase :
       {"detect", "save", "stop", "plan", "launch", "rendezvous", "first_step", "total"}) {
    EXPECT_TRUE(m.phases().count(phase)) << phase << " " << m.DebugString();
  }

  // Every step once; step 5 as generation 2 ran it.
  grpc::ClientContext ctx;
  v1::GetMetricsRequest mreq;
  mreq.set_job_id(id);
  v1::GetMetricsResponse mresp;
  ASSERT_TRUE(jobs_->GetMetrics(&ctx, mreq, &mresp).ok());
  ASSERT_EQ(mresp.steps_size(), 6);
  EXPECT_EQ(mresp.steps(4).generation(), 2);
  EXPECT_DOUBLE_EQ(mresp.steps(4).loss(), 4.5);
  EXPECT_EQ(mresp.steps(3).generation(), 1);

  grpc::ClientContext ectx;
  v1::ListEventsRequest ereq;
  v1::ListEventsResponse eresp;
  ASSERT_TRUE(jobs_->ListEvents(&ectx, ereq, &eresp).ok());
  std::set<std::string> kinds;
  for (const auto& e : eresp.events()) kinds.insert(e.kind());
  for (const char* k : {"node_lost", "morph_begin", "morph_relaunch", "morph_done"}) {
    EXPECT_TRUE(kinds.count(k)) << k;
  }
}

// A worker that exits with kExitBadInput fails the job at once: no morph, no retry.
TEST_F(ControlPlaneTest, BadInputExitFailsTheJobWithoutMorphing) {
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  auto job = Submit(Spec(absl::StrCat("parallel: {stages: 2}\ncheckpoint: {dir: ", dir_, "/c}")));
  ASSERT_THAT(job.status(), IsOk());
  ASSERT_TRUE(WaitState(job->id(), v1::RUNNING));
  const auto p = agents_[1]->launcher.procs()[0];
  std::ofstream(p.spec.env.at("VARUNA_PROGRESS_FILE"))
      << R"({"error": "data.path is not a regular file", "bad_input": true})"
      << "\n";
  agents_[1]->launcher.Exit(p.pid, kExitBadInput);
  BeatAll();
  const v1::JobInfo info = Get(job->id());
  EXPECT_EQ(info.state(), v1::FAILED);
  EXPECT_THAT(info.reason(), ::testing::HasSubstr("data.path is not a regular file"));
  EXPECT_EQ(info.generation(), 1);
  EXPECT_EQ(info.morphs_size(), 0);
}

// A preemption notice by hand: graceful (SIGUSR1), the node is DRAINING, and with
// morphing: false the old behaviour stays (a lost node fails the job).
TEST_F(ControlPlaneTest, PreemptionNoticeAsksForACheckpointAndDrainsTheNode) {
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  auto job = Submit(Spec(absl::StrCat("parallel: {stages: 2}\ncheckpoint: {dir: ", dir_, "/c}")));
  ASSERT_THAT(job.status(), IsOk());
  ASSERT_TRUE(WaitState(job->id(), v1::RUNNING));
  grpc::ClientContext ctx;
  v1::PreemptNodeRequest req;
  req.set_node("a2");
  req.set_in_ms(30000);
  v1::PreemptNodeResponse resp;
  ASSERT_TRUE(jobs_->PreemptNode(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.node().state(), v1::DRAINING);
  EXPECT_EQ(Get(job->id()).state(), v1::RECONFIGURING);
  ASSERT_TRUE(Eventually([&] {
    for (auto& a : agents_) {
      for (const auto& p : a->launcher.procs()) {
        if (std::find(p.signals.begin(), p.signals.end(), SIGUSR1) == p.signals.end()) {
          return false;
        }
      }
    }
    return true;
  }));
  grpc::ClientContext ctx2;
  v1::PreemptNodeRequest bad;
  bad.set_node("nope");
  EXPECT_EQ(jobs_->PreemptNode(&ctx2, bad, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ControlPlaneTest, MorphBudgetAndMaxWaitFailTheJobWithTheHistory) {
  max_morphs_ = 1;
  manager_->Shutdown();
  StartManager();
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  auto job = Submit(Spec(absl::StrCat("parallel: {stages: 2}\ncheckpoint: {dir: ", dir_,
                                      "/c}\nresources: {min_slots: 4, max_wait_s: 5}")));
  ASSERT_THAT(job.status(), IsOk());
  const std::string id = job->id();
  ASSERT_TRUE(WaitState(id, v1::RUNNING));
  auto crash_then_save = [&] {
    bool first = true;
    for (auto& a : agents_) {
      for (const auto& p : a->launcher.procs()) {
        if (!p.alive) continue;
        a->launcher.Exit(p.pid, first ? 1 : kExitRescued);
        first = false;
      }
    }
    BeatAll();
    clock_.Advance(absl::Seconds(2));
    return Eventually([&] {
      Tick();
      BeatAll();
      return Get(id).state() == v1::RUNNING || Get(id).state() == v1::FAILED;
    });
  };
  // The first crash is morphed away (same shape, generation 2).
  ASSERT_TRUE(crash_then_save());
  EXPECT_EQ(Get(id).state(), v1::RUNNING) << Get(id).DebugString();
  EXPECT_EQ(Get(id).generation(), 2);
  // The second exceeds max_morphs=1: FAILED, the reason carries the history.
  ASSERT_TRUE(crash_then_save());
  v1::JobInfo info = Get(id);
  EXPECT_EQ(info.state(), v1::FAILED);
  EXPECT_THAT(info.reason(), ::testing::HasSubstr("not morphing again: 1 morphs within"));
  EXPECT_THAT(info.reason(), ::testing::HasSubstr("exited with code 1"));
}

TEST_F(ControlPlaneTest, TooFewSlotsAfterALossWaitsThenFailsAfterMaxWait) {
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  auto job = Submit(Spec(absl::StrCat("parallel: {stages: 2}\ncheckpoint: {dir: ", dir_,
                                      "/c}\nresources: {min_slots: 4, max_wait_s: 5}")));
  ASSERT_THAT(job.status(), IsOk());
  const std::string id = job->id();
  ASSERT_TRUE(WaitState(id, v1::RUNNING));
  {
    grpc::ClientContext ctx;
    v1::DrainNodeRequest req;
    req.set_node("a2");
    v1::DrainNodeResponse resp;
    ASSERT_TRUE(jobs_->DrainNode(&ctx, req, &resp).ok());  // 2 slots left < min_slots
  }
  for (auto& a : agents_) {
    for (const auto& p : a->launcher.procs()) a->launcher.Exit(p.pid, 0);
  }
  BeatAll();
  clock_.Advance(absl::Seconds(2));
  Tick();
  v1::JobInfo info = Get(id);
  EXPECT_EQ(info.state(), v1::RECONFIGURING) << info.DebugString();
  EXPECT_THAT(info.reason(), ::testing::HasSubstr("waiting for slots"));
  clock_.Advance(absl::Seconds(6));
  BeatAll();
  Tick();
  info = Get(id);
  EXPECT_EQ(info.state(), v1::FAILED);
  EXPECT_THAT(info.reason(), ::testing::HasSubstr("resources.max_wait_s"));
}

// A whole Slurm allocation preempted (docs/operations.md "Slurm"): every node of the job
// gets a notice, its workers save and exit, and the job waits for machines. When the same
// nodes come back as new agents (the requeued allocation), the waiting morph plans on them
// again: they are no longer the nodes it lost.
TEST_F(ControlPlaneTest, EveryNodePreemptedThenBackResumesOnThem) {
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  auto job = Submit(Spec(absl::StrCat("parallel: {stages: 2}\ncheckpoint: {dir: ", dir_, "/c}")));
  ASSERT_THAT(job.status(), IsOk());
  const std::string id = job->id();
  ASSERT_TRUE(WaitState(id, v1::RUNNING));
  for (const char* node : {"a1", "a2"}) {
    grpc::ClientContext ctx;
    v1::PreemptNodeRequest req;
    req.set_node(node);
    req.set_in_ms(30000);
    v1::PreemptNodeResponse resp;
    ASSERT_TRUE(jobs_->PreemptNode(&ctx, req, &resp).ok());
  }
  for (auto& a : agents_) {
    for (const auto& p : a->launcher.procs()) a->launcher.Exit(p.pid, 0);  // saved, exited
  }
  BeatAll();
  clock_.Advance(absl::Seconds(2));
  Tick();
  v1::JobInfo info = Get(id);
  ASSERT_EQ(info.state(), v1::RECONFIGURING) << info.DebugString();
  EXPECT_THAT(info.reason(), ::testing::HasSubstr("waiting for slots"));
  // The allocation is requeued: new agents under the same names register.
  agents_.clear();
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(Eventually([&] {
    Tick();
    BeatAll();
    return Get(id).state() == v1::RUNNING;
  })) << Get(id).DebugString();
  EXPECT_EQ(Get(id).generation(), 2);
  EXPECT_EQ(Get(id).slots(), 4);
}

TEST_F(ControlPlaneTest, AMorphInProgressSurvivesAManagerRestart) {
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  auto job = Submit(Spec(absl::StrCat("parallel: {stages: 2}\ncheckpoint: {dir: ", dir_, "/c}")));
  ASSERT_THAT(job.status(), IsOk());
  const std::string id = job->id();
  ASSERT_TRUE(WaitState(id, v1::RUNNING));
  const int crashed = agents_[0]->launcher.procs()[0].pid;
  agents_[0]->launcher.Exit(crashed, 1);
  BeatAll();
  ASSERT_EQ(Get(id).state(), v1::RECONFIGURING);
  manager_->Shutdown();
  manager_.reset();
  StartManager();
  EXPECT_EQ(Get(id).state(), v1::RECONFIGURING) << "the morph is in the state database";
  for (auto& a : agents_) {
    for (const auto& p : a->launcher.procs()) {
      if (p.alive) a->launcher.Exit(p.pid, kExitRescued);
    }
  }
  ASSERT_TRUE(Eventually([&] {
    BeatAll();
    clock_.Advance(absl::Milliseconds(500));
    Tick();
    return Get(id).state() == v1::RUNNING;
  })) << Get(id).DebugString();
  EXPECT_EQ(Get(id).generation(), 2);
  EXPECT_EQ(TotalAlive(), 4);
}

// Varuna's machine_list: a node taken out of the file is left gracefully (checkpoint at the
// next step boundary), a node put back makes the job grow after scale_up_delay.
TEST_F(ControlPlaneTest, MachineListChangesMorphTheJob) {
  manager_->Shutdown();
  manager_.reset();
  machine_list_ = dir_ + "/machine_list";
  std::ofstream(machine_list_) << "a1\na2\n";
  StartManager();
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  Tick();
  auto job = Submit(Spec(absl::StrCat("parallel: {stages: 2}\ncheckpoint: {dir: ", dir_, "/c}")));
  ASSERT_THAT(job.status(), IsOk());
  const std::string id = job->id();
  ASSERT_TRUE(WaitState(id, v1::RUNNING));
  ASSERT_EQ(Get(id).replicas(), 2);
  std::ofstream(machine_list_, std::ios::trunc) << "a1\n";
  std::filesystem::last_write_time(
      machine_list_, std::filesystem::last_write_time(machine_list_) + std::chrono::seconds(5));
  clock_.Advance(absl::Seconds(3));
  BeatAll();
  Tick();
  v1::JobInfo info = Get(id);
  EXPECT_EQ(info.state(), v1::RECONFIGURING) << info.DebugString();
  EXPECT_THAT(info.reason(), HasSubstr("node a2 removed from machine_list"));
  ASSERT_TRUE(Eventually([&] {
    for (auto& a : agents_) {
      for (const auto& p : a->launcher.procs()) {
        if (std::find(p.signals.begin(), p.signals.end(), SIGUSR1) == p.signals.end()) {
          return false;
        }
      }
    }
    return true;
  })) << "a graceful save: SIGUSR1";
}

// While a job saves and re-plans, a queued job must not take the slots it frees.
TEST_F(ControlPlaneTest, AMorphingJobKeepsItsSlotsFromQueuedJobs) {
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  AddAgent("a3", 2);
  auto a = Submit(
      Spec(absl::StrCat("parallel: {stages: 2, replicas: 2}\ncheckpoint: {dir: ", dir_, "/c}")));
  ASSERT_THAT(a.status(), IsOk());
  ASSERT_TRUE(WaitState(a->id(), v1::RUNNING));
  auto b = Submit(Spec("parallel: {stages: 2, replicas: 2}"));  // needs 4; 2 are free
  ASSERT_THAT(b.status(), IsOk());
  Tick();
  ASSERT_EQ(Get(b->id()).state(), v1::PENDING);
  // A node of job a crashes a rank: a saves and re-plans on the same 4 slots.
  for (auto& ag : agents_) {
    for (const auto& p : ag->launcher.procs()) {
      if (p.alive) ag->launcher.Exit(p.pid, kExitRescued);
    }
  }
  BeatAll();
  Tick();
  EXPECT_EQ(Get(b->id()).state(), v1::PENDING) << "b must not take a's slots mid-morph";
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return Get(a->id()).state() == v1::RUNNING;
  }));
  EXPECT_EQ(Get(a->id()).generation(), 2);
  EXPECT_EQ(Get(a->id()).slots(), 4);
  EXPECT_EQ(Get(b->id()).state(), v1::PENDING);
}

TEST_F(ControlPlaneTest, MorphingFalseKeepsFailOnLoss) {
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  auto job = Submit(Spec(
      absl::StrCat("parallel: {stages: 2}\ncheckpoint: {dir: ", dir_, "/c}\nmorphing: false")));
  ASSERT_THAT(job.status(), IsOk());
  ASSERT_TRUE(WaitState(job->id(), v1::RUNNING));
  agents_[1]->launcher.Exit(agents_[1]->launcher.procs()[0].pid, 1);
  BeatAll();
  clock_.Advance(absl::Seconds(3));
  Tick();
  EXPECT_EQ(Get(job->id()).state(), v1::FAILED);
  EXPECT_EQ(Get(job->id()).generation(), 1);
}

}  // namespace
}  // namespace varuna

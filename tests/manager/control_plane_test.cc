// The control plane over loopback gRPC: nodes, the job lifecycle, failures, restarts,
// idempotence (fixture: control_plane_fixture.h).

#include "tests/manager/control_plane_fixture.h"

namespace varuna {
namespace {

TEST_F(ControlPlaneTest, NodesGoSuspectThenDeadByMissedHeartbeatsAndComeBack) {
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  EXPECT_EQ(NodeStates()["a1"], v1::ALIVE);
  clock_.Advance(absl::Milliseconds(3500));
  agents_[1]->server->HeartbeatOnce().IgnoreError();
  Tick();
  EXPECT_EQ(NodeStates()["a1"], v1::SUSPECT);
  EXPECT_EQ(NodeStates()["a2"], v1::ALIVE);
  clock_.Advance(absl::Seconds(7));
  Tick();
  EXPECT_EQ(NodeStates()["a1"], v1::DEAD);
  EXPECT_EQ(NodeStates()["a2"], v1::SUSPECT);
  BeatAll();
  EXPECT_EQ(NodeStates()["a1"], v1::ALIVE);
  EXPECT_EQ(NodeStates()["a2"], v1::ALIVE);
}

// Note [Forgotten while leaving] in agent/heartbeat_sender.cc: an agent the manager forgot
// registers again, unless it is leaving (it has a preemption notice): then it stays forgotten.
TEST_F(ControlPlaneTest, AForgottenAgentRegistersAgainUnlessItIsLeaving) {
  forget_dead_after_ = absl::Seconds(20);
  manager_->Shutdown();
  StartManager();
  AddAgent("stays", 1);
  AddAgent("leaves", 1);
  v1::PreemptionNotice notice;
  notice.set_source("slurm");
  agents_[1]->server->PostNotice(notice);
  BeatAll();
  clock_.Advance(absl::Seconds(30));  // both DEAD, then forgotten (idle)
  Tick();
  Tick();
  EXPECT_TRUE(NodeStates().empty());
  for (auto& a : agents_) {
    EXPECT_EQ(a->server->HeartbeatOnce().code(), absl::StatusCode::kNotFound);
  }
  EXPECT_THAT(agents_[0]->server->HeartbeatOnce(), IsOk());
  const absl::Status again = agents_[1]->server->HeartbeatOnce();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(again.message()), HasSubstr("forgotten"));
  EXPECT_EQ(NodeStates(), (std::map<std::string, v1::NodeState>{{"stays", v1::ALIVE}}));
}

TEST_F(ControlPlaneTest, DrainStopsNewPlacementsAndUndoRestoresThem) {
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  grpc::ClientContext ctx;
  v1::DrainNodeRequest req;
  req.set_node("a2");
  v1::DrainNodeResponse resp;
  ASSERT_TRUE(jobs_->DrainNode(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.node().state(), v1::DRAINING);
  auto job = Submit(Spec());  // 2 stages: fits on a1 alone as 2x1
  ASSERT_THAT(job.status(), IsOk());
  ASSERT_TRUE(WaitState(job->id(), v1::RUNNING));
  const v1::JobInfo info = Get(job->id());
  EXPECT_EQ(info.replicas(), 1);
  for (const auto& p : info.placement()) EXPECT_EQ(p.node(), "a1");
  grpc::ClientContext ctx2;
  req.set_undo(true);
  ASSERT_TRUE(jobs_->DrainNode(&ctx2, req, &resp).ok());
  EXPECT_EQ(resp.node().state(), v1::ALIVE);
  grpc::ClientContext ctx3;
  req.set_node("nope");
  EXPECT_EQ(jobs_->DrainNode(&ctx3, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ControlPlaneTest, JobRunsToSucceededWithVarunaLaunchArgumentsAndProgress) {
  const std::string id = RunningJob();
  v1::JobInfo info = Get(id);
  EXPECT_EQ(info.stages(), 2);
  EXPECT_EQ(info.replicas(), 2);
  EXPECT_EQ(info.stage_to_rank_map(), "0,2;1,3;");
  EXPECT_EQ(info.generation(), 1);
  // Pipeline neighbours 0-1 and 2-3 share a node.
  ASSERT_EQ(info.placement_size(), 4);
  EXPECT_EQ(info.placement(0).node(), info.placement(1).node());
  EXPECT_EQ(info.placement(2).node(), info.placement(3).node());
  EXPECT_NE(info.placement(0).node(), info.placement(2).node());

  std::set<std::string> ports;
  for (auto& a : agents_) {
    auto procs = a->launcher.procs();
    ASSERT_EQ(procs.size(), 2u);
    for (const auto& p : procs) {
      const auto& env = p.spec.env;
      ports.insert(env.at("MASTER_PORT"));
      EXPECT_EQ(env.at("WORLD_SIZE"), "4");
      EXPECT_EQ(env.at("VARUNA_GENERATION"), "1");
      EXPECT_THAT(p.spec.argv, ::testing::Contains("--stage_to_rank_map=0,2;1,3;"));
      EXPECT_THAT(p.spec.argv, ::testing::Contains("--batch-size=4"));
      EXPECT_THAT(p.spec.argv, ::testing::Contains(absl::StrCat("--rank=", env.at("RANK"))));
      EXPECT_EQ(p.spec.argv[0], "/bin/true");
    }
  }
  EXPECT_EQ(ports.size(), 1u) << "every rank must rendezvous on the same port";
  EXPECT_NE(*ports.begin(), "0");

  // Progress: a worker writes its progress file; the next heartbeat carries it.
  const auto procs = agents_[0]->launcher.procs();
  std::ofstream(procs[0].spec.env.at("VARUNA_PROGRESS_FILE"))
      << R"({"step": 7, "loss": 2.5, "step_time_s": 0.1, "samples_per_s": 80})"
      << "\n";
  BeatAll();
  info = Get(id);
  EXPECT_EQ(info.step(), 7);
  EXPECT_DOUBLE_EQ(info.loss(), 2.5);
  EXPECT_DOUBLE_EQ(info.samples_per_s(), 80);

  for (auto& a : agents_) {
    for (const auto& p : a->launcher.procs()) a->launcher.Exit(p.pid, 0);
  }
  BeatAll();
  EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);
  // The manager released the exited workers; agents forget them.
  BeatAll();
  for (auto& a : agents_) {
    EXPECT_EQ(a->server->loop()
                  .RunSync([&] { return a->server->agent().BuildHeartbeat(); })
                  .workers_size(),
              0);
  }
}

TEST_F(ControlPlaneTest, WorkersStoppedOnRequestBeforeTheLastStepFailTheJobSayingSo) {
  const std::string id = RunningJob();
  for (auto& a : agents_) {
    for (const auto& p : a->launcher.procs()) {
      std::ofstream(p.spec.env.at("VARUNA_PROGRESS_FILE"))
          << R"({"step": 7, "loss": 2.5, "stopped": true})"
          << "\n";
      a->launcher.Exit(p.pid, 0);
    }
  }
  BeatAll();
  const v1::JobInfo info = Get(id);
  EXPECT_EQ(info.state(), v1::FAILED);
  EXPECT_EQ(info.step(), 7);
  EXPECT_THAT(info.reason(),
              HasSubstr("stopped on request (SIGUSR1) after step 7 of 20; the job has no "
                        "checkpoint.dir, so nothing was saved"));

  // Stopped at the last step: training is complete.
  const std::string done = Submit(Spec()).value().id();
  ASSERT_TRUE(WaitState(done, v1::RUNNING));
  for (auto& a : agents_) {
    for (const auto& p : a->launcher.procs()) {
      if (p.spec.env.at("VARUNA_JOB_ID") != done) continue;
      std::ofstream(p.spec.env.at("VARUNA_PROGRESS_FILE")) << R"({"step": 20, "stopped": true})"
                                                           << "\n";
      a->launcher.Exit(p.pid, 0);
    }
  }
  BeatAll();
  EXPECT_EQ(Get(done).state(), v1::SUCCEEDED);
}

TEST_F(ControlPlaneTest, WorkerFailureFailsTheJobNamingRankNodeAndCodeAndStopsTheRest) {
  const std::string id = RunningJob();
  const v1::JobInfo info = Get(id);
  const std::string node_of_2 = info.placement(2).node();
  AgentUnderTest* owner = nullptr;
  int pid = 0;
  for (auto& a : agents_) {
    for (const auto& p : a->launcher.procs()) {
      if (p.spec.env.at("RANK") == "2") {
        owner = a.get();
        pid = p.pid;
      }
    }
  }
  ASSERT_NE(owner, nullptr);
  owner->launcher.Exit(pid, 4);
  BeatAll();
  EXPECT_EQ(Get(id).state(), v1::RUNNING) << "held briefly to attribute the failure";
  clock_.Advance(absl::Seconds(1));
  BeatAll();
  clock_.Advance(absl::Seconds(1));
  BeatAll();
  Tick();
  const v1::JobInfo failed = Get(id);
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_THAT(failed.reason(), HasSubstr("rank 2 on node " + node_of_2));
  EXPECT_THAT(failed.reason(), HasSubstr("exited with code 4"));
  EXPECT_TRUE(Eventually([&] { return TotalAlive() == 0; })) << "survivors must be stopped";
}

TEST_F(ControlPlaneTest, CancelStopsWorkersAndEndsCancelledAndIsSafeToRepeat) {
  const std::string id = RunningJob();
  for (auto& a : agents_) a->launcher.set_exit_on_sigterm(false);  // stubborn workers
  EXPECT_EQ(Cancel(id).state(), v1::CANCELLING);
  EXPECT_EQ(Cancel(id).state(), v1::CANCELLING);  // a repeat changes nothing
  ASSERT_TRUE(Eventually([&] {
    for (auto& a : agents_) {
      for (const auto& p : a->launcher.procs()) {
        if (p.signals.empty()) return false;
      }
    }
    return true;
  }));
  // A repeated stop did not restart the grace period: one SIGTERM per worker.
  for (auto& a : agents_) {
    for (const auto& p : a->launcher.procs()) EXPECT_EQ(p.signals, std::vector<int>{SIGTERM});
  }
  clock_.Advance(absl::Seconds(6));  // past the 5 s grace
  for (auto& a : agents_) a->server->Tick();
  EXPECT_EQ(TotalAlive(), 0);
  BeatAll();
  EXPECT_EQ(Get(id).state(), v1::CANCELLED);
  EXPECT_EQ(Cancel(id).state(), v1::CANCELLED);

  // Cancelling a job that never started ends it at once.
  auto big = Submit(Spec("parallel: {stages: 8}"));  // more slots than exist: PENDING
  ASSERT_THAT(big.status(), IsOk());
  Tick();
  EXPECT_EQ(Get(big->id()).state(), v1::PENDING);
  EXPECT_THAT(Get(big->id()).reason(), HasSubstr("needs 8 slots"));
  EXPECT_EQ(Cancel(big->id()).state(), v1::CANCELLED);
}

TEST_F(ControlPlaneTest, LostNodeFailsItsJobWithinTheHeartbeatTimeout) {
  const std::string id = RunningJob();
  const std::string lost = agents_[1]->server->agent().config().name;
  // The lost node's workers died with it; a surviving rank fails first (a gloo error).
  const auto survivor = agents_[0]->launcher.procs()[0];
  agents_[0]->launcher.Exit(survivor.pid, 1);
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(absl::Seconds(1));
    agents_[0]->server->HeartbeatOnce().IgnoreError();
    Tick();
  }
  const v1::JobInfo info = Get(id);
  EXPECT_EQ(info.state(), v1::FAILED);
  EXPECT_THAT(info.reason(), HasSubstr("node " + lost + " lost"));
  EXPECT_THAT(info.reason(), HasSubstr("exited with code 1"));
  EXPECT_EQ(NodeStates()[lost], v1::DEAD);
}

TEST_F(ControlPlaneTest, AgentRestartedWithoutItsWorkersFailsTheJob) {
  const std::string id = RunningJob();
  const std::string name = agents_[1]->server->agent().config().name;
  // The agent process goes away and its workers with it; it comes back at once, well
  // before the node could be declared dead, and reports no workers.
  agents_.erase(agents_.begin() + 1);
  AddAgent(name, 2);
  clock_.Advance(absl::Seconds(2));
  BeatAll();
  EXPECT_EQ(Get(id).state(), v1::RUNNING) << "held briefly to attribute the failure";
  clock_.Advance(absl::Seconds(2));
  BeatAll();
  Tick();
  const v1::JobInfo info = Get(id);
  EXPECT_EQ(info.state(), v1::FAILED);
  EXPECT_THAT(info.reason(), HasSubstr("on node " + name + " is no longer known to its agent"));
  EXPECT_TRUE(Eventually([&] { return TotalAlive() == 0; })) << "survivors must be stopped";
}

TEST_F(ControlPlaneTest, CancelEndsWhenAnAgentRestartedAndLostItsWorkers) {
  const std::string id = RunningJob();
  const std::string name = agents_[1]->server->agent().config().name;
  agents_.erase(agents_.begin() + 1);  // its workers are gone with it
  EXPECT_EQ(Cancel(id).state(), v1::CANCELLING);
  AddAgent(name, 2);  // back at once, reporting no workers
  ASSERT_TRUE(Eventually([&] { return TotalAlive() == 0; })) << "the other agent stops its ranks";
  clock_.Advance(absl::Seconds(2));
  BeatAll();
  Tick();
  const v1::JobInfo info = Get(id);
  EXPECT_EQ(info.state(), v1::CANCELLED) << info.DebugString();
}

TEST_F(ControlPlaneTest, ALateHeartbeatWithoutTheRanksDoesNotFailTheJob) {
  const std::string id = RunningJob();
  const std::string name = agents_[1]->server->agent().config().name;
  clock_.Advance(absl::Seconds(2));
  {
    // A heartbeat the agent built before its workers existed, delivered late.
    grpc::ClientContext ctx;
    v1::HeartbeatRequest req;
    req.set_name(name);
    v1::HeartbeatResponse resp;
    ASSERT_TRUE(registry_->Heartbeat(&ctx, req, &resp).ok());
  }
  BeatAll();  // the current heartbeat reports them again
  clock_.Advance(absl::Seconds(3));
  BeatAll();
  Tick();
  EXPECT_EQ(Get(id).state(), v1::RUNNING) << Get(id).reason();
}

TEST_F(ControlPlaneTest, HeartbeatRepliesCarryThePeriod) {
  AddAgent("a1", 2);
  grpc::ClientContext ctx;
  v1::HeartbeatRequest req;
  req.set_name("a1");
  v1::HeartbeatResponse resp;
  ASSERT_TRUE(registry_->Heartbeat(&ctx, req, &resp).ok());
  EXPECT_GT(resp.heartbeat_period_ms(), 0);
}

TEST_F(ControlPlaneTest, RepeatedRpcsAreSafe) {
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  // Submit with one request id twice: one job.
  auto first = Submit(Spec(), "req-1");
  auto second = Submit(Spec(), "req-1");
  ASSERT_THAT(first.status(), IsOk());
  ASSERT_THAT(second.status(), IsOk());
  EXPECT_EQ(first->id(), second->id());
  ASSERT_TRUE(WaitState(first->id(), v1::RUNNING));
  grpc::ClientContext ctx;
  v1::ListJobsResponse list;
  ASSERT_TRUE(jobs_->ListJobs(&ctx, v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 1);

  // Launch repeated straight at an agent: no second process per rank.
  auto agent_api = v1::AgentApi::NewStub(MakeChannel(agents_[0]->server->address()));
  v1::LaunchRequest launch;
  launch.set_job_id("77");
  launch.set_generation(1);
  launch.set_spec_yaml(Spec());
  launch.set_world_size(1);
  launch.set_master_addr("127.0.0.1");
  launch.add_ranks()->set_rank(0);
  v1::LaunchResponse lr1, lr2;
  grpc::ClientContext c1, c2;
  ASSERT_TRUE(agent_api->Launch(&c1, launch, &lr1).ok());
  ASSERT_TRUE(agent_api->Launch(&c2, launch, &lr2).ok());
  EXPECT_EQ(lr1.master_port(), lr2.master_port());
  int procs_of_77 = 0;
  for (const auto& p : agents_[0]->launcher.procs()) {
    procs_of_77 += p.spec.env.at("VARUNA_JOB_ID") == "77" ? 1 : 0;
  }
  EXPECT_EQ(procs_of_77, 1);

  // Stop repeated: the second signals nobody.
  v1::StopRequest stop;
  stop.set_job_id("77");
  v1::StopResponse s1, s2;
  grpc::ClientContext c3, c4;
  agents_[0]->launcher.set_exit_on_sigterm(false);
  ASSERT_TRUE(agent_api->Stop(&c3, stop, &s1).ok());
  ASSERT_TRUE(agent_api->Stop(&c4, stop, &s2).ok());
  EXPECT_EQ(s1.signalled(), 1);
  EXPECT_EQ(s2.signalled(), 0);

  // A heartbeat repeated with the same exit does not count it twice.
  const v1::JobInfo info = Get(first->id());
  v1::HeartbeatRequest hb;
  hb.set_name(info.placement(0).node());
  v1::WorkerStatus* w = hb.add_workers();
  w->set_job_id(first->id());
  w->set_generation(1);
  w->set_rank(info.placement(0).rank());
  w->set_state(v1::WORKER_EXITED);
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext c;
    v1::HeartbeatResponse r;
    ASSERT_TRUE(registry_->Heartbeat(&c, hb, &r).ok());
  }
  EXPECT_EQ(Get(first->id()).state(), v1::RUNNING);
  clock_.Advance(absl::Seconds(6));  // let the stubborn worker of job 77 be killed
  agents_[0]->server->Tick();
  EXPECT_EQ(agents_[0]->launcher.alive(), 2);
  agents_[0]->launcher.set_exit_on_sigterm(true);
}

TEST_F(ControlPlaneTest, StaleGenerationsAreRefusedAndStopped) {
  const std::string id = RunningJob();
  auto agent_api = v1::AgentApi::NewStub(MakeChannel(agents_[0]->server->address()));
  // The agent has generation 1 of the job; a delayed generation-0 launch is refused.
  v1::LaunchRequest launch;
  launch.set_job_id(id);
  launch.set_generation(1);
  launch.set_spec_yaml(Spec());
  launch.set_world_size(4);
  launch.add_ranks()->set_rank(0);
  v1::LaunchRequest newer = launch;
  newer.set_job_id("88");
  newer.set_generation(3);
  v1::LaunchResponse lr;
  grpc::ClientContext c0;
  ASSERT_TRUE(agent_api->Launch(&c0, newer, &lr).ok());
  v1::LaunchRequest older = newer;
  older.set_generation(2);
  grpc::ClientContext c1;
  grpc::Status s = agent_api->Launch(&c1, older, &lr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("stale"));

  // The manager tells agents to stop workers of a generation it is not running, and of
  // jobs it does not know ("88" above).
  v1::HeartbeatRequest hb;
  hb.set_name("a1");
  v1::WorkerStatus* w = hb.add_workers();
  w->set_job_id(id);
  w->set_generation(0);
  w->set_rank(0);
  w->set_state(v1::WORKER_RUNNING);
  v1::WorkerStatus* x = hb.add_workers();
  x->set_job_id(id);
  x->set_generation(0);
  x->set_rank(1);
  x->set_state(v1::WORKER_EXITED);
  x->set_exit_code(1);
  grpc::ClientContext c2;
  v1::HeartbeatResponse r;
  ASSERT_TRUE(registry_->Heartbeat(&c2, hb, &r).ok());
  ASSERT_EQ(r.stop_size(), 1);
  EXPECT_EQ(r.stop(0).generation(), 0);
  ASSERT_EQ(r.release_size(), 1);
  EXPECT_EQ(Get(id).state(), v1::RUNNING) << "an old generation's exit must not fail the job";

  BeatAll();  // the agent reports job 88's worker; the manager answers "stop"
  EXPECT_TRUE(Eventually([&] {
    agents_[0]->server->Tick();
    for (const auto& p : agents_[0]->launcher.procs()) {
      if (p.spec.env.at("VARUNA_JOB_ID") == "88") return !p.alive;
    }
    return false;
  }));
}

TEST_F(ControlPlaneTest, RestartedManagerKnowsTheJobAndSeesItSucceed) {
  const std::string id = RunningJob();
  manager_->Shutdown();
  manager_.reset();
  // Workers keep running while the manager is away; heartbeats fail.
  for (auto& a : agents_) EXPECT_FALSE(a->server->HeartbeatOnce().ok());
  EXPECT_EQ(TotalAlive(), 4);
  StartManager();
  v1::JobInfo info = Get(id);
  EXPECT_EQ(info.state(), v1::RUNNING);
  EXPECT_EQ(info.placement_size(), 4);
  EXPECT_EQ(NodeStates()["a1"], v1::SUSPECT);  // unconfirmed until it heartbeats
  BeatAll();
  EXPECT_EQ(NodeStates()["a1"], v1::ALIVE);
  for (auto& a : agents_) {
    for (const auto& p : a->launcher.procs()) a->launcher.Exit(p.pid, 0);
  }
  BeatAll();
  EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);
}

TEST_F(ControlPlaneTest, BadSpecsAreRefusedAtSubmitAndNothingIsQueued) {
  AddAgent("a1", 2);
  EXPECT_THAT(Submit(Spec("parallel: {stagez: 2}")),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown key 'parallel.stagez'"));
  EXPECT_THAT(Submit("name: [unclosed"),
              StatusIs(absl::StatusCode::kInvalidArgument, "malformed YAML"));
  EXPECT_THAT(Submit(absl::StrReplaceAll(Spec(), {{"steps: 20", "steps: 20, lr: -1"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, "train.lr"));
  EXPECT_THAT(Submit(absl::StrReplaceAll(Spec(), {{data_, dir_ + "/missing.txt"}})),
              StatusIs(absl::StatusCode::kNotFound, "missing.txt"));
  grpc::ClientContext ctx;
  v1::ListJobsResponse list;
  ASSERT_TRUE(jobs_->ListJobs(&ctx, v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);
}

TEST_F(ControlPlaneTest, CheckpointSignalsTheJobsCurrentWorkersOnlyAndIsSafeToRepeat) {
  const std::string id = RunningJob();
  auto& a = *agents_[0];
  // A second job's worker on the same agent must not be signalled.
  v1::LaunchRequest other;
  other.set_job_id("77");
  other.set_generation(1);
  other.set_spec_yaml(Spec());
  other.set_world_size(1);
  other.add_ranks()->set_rank(0);
  auto agent_api = v1::AgentApi::NewStub(MakeChannel(a.server->address()));
  v1::LaunchResponse lr;
  grpc::ClientContext c0;
  ASSERT_TRUE(agent_api->Launch(&c0, other, &lr).ok());

  auto checkpoint = [&](int generation) {
    v1::CheckpointRequest req;
    req.set_job_id(id);
    req.set_generation(generation);
    v1::CheckpointResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(agent_api->Checkpoint(&ctx, req, &resp).ok());
    return resp.signalled();
  };
  EXPECT_EQ(checkpoint(2), 0) << "a generation the agent does not run";
  EXPECT_EQ(checkpoint(1), 2);
  EXPECT_EQ(checkpoint(1), 2) << "a repeat asks again; the worker's flag is idempotent";
  for (const auto& p : a.launcher.procs()) {
    if (p.spec.env.at("VARUNA_JOB_ID") == id) {
      EXPECT_THAT(p.signals, ::testing::ElementsAre(SIGUSR1, SIGUSR1));
      EXPECT_TRUE(p.alive) << "SIGUSR1 asks; the worker decides when to exit";
    } else {
      EXPECT_THAT(p.signals, ::testing::IsEmpty());
    }
  }
  EXPECT_EQ(Get(id).state(), v1::RUNNING);
}

TEST_F(ControlPlaneTest, MachineListGivesWorkOnlyToListedHostsAndIsReReadWhenItChanges) {
  manager_->Shutdown();
  manager_.reset();
  machine_list_ = dir_ + "/machine_list";
  std::ofstream(machine_list_) << "# hosts that may run work\na1\n\n";
  StartManager();
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  Tick();
  EXPECT_EQ(NodeStates()["a1"], v1::ALIVE);
  EXPECT_EQ(NodeStates()["a2"], v1::DRAINING);
  {
    grpc::ClientContext ctx;
    v1::ListNodesResponse resp;
    ASSERT_TRUE(jobs_->ListNodes(&ctx, v1::ListNodesRequest(), &resp).ok());
    for (const auto& n : resp.nodes()) {
      if (n.name() == "a2") EXPECT_THAT(n.reason(), HasSubstr("not in machine_list"));
    }
  }
  auto job = Submit(Spec());  // fits on a1 alone as 2x1
  ASSERT_THAT(job.status(), IsOk());
  ASSERT_TRUE(WaitState(job->id(), v1::RUNNING));
  const v1::JobInfo info = Get(job->id());
  for (const auto& p : info.placement()) EXPECT_EQ(p.node(), "a1");

  // Edited (by name or by host address): a2 becomes schedulable once the manager looks again.
  std::ofstream(machine_list_) << "a1\n127.0.0.1\n";
  std::filesystem::last_write_time(
      machine_list_, std::filesystem::last_write_time(machine_list_) + std::chrono::seconds(5));
  clock_.Advance(absl::Seconds(2));
  BeatAll();
  Tick();
  EXPECT_EQ(NodeStates()["a2"], v1::ALIVE);

  // Gone: nothing is schedulable; running work is left alone.
  std::filesystem::remove(machine_list_);
  clock_.Advance(absl::Seconds(2));
  BeatAll();
  Tick();
  EXPECT_EQ(NodeStates()["a1"], v1::DRAINING);
  EXPECT_EQ(NodeStates()["a2"], v1::DRAINING);
  EXPECT_EQ(Get(job->id()).state(), v1::RUNNING);
}

TEST_F(ControlPlaneTest, UnregisteredHeartbeatIsToldToRegister) {
  v1::HeartbeatRequest hb;
  hb.set_name("ghost");
  grpc::ClientContext ctx;
  v1::HeartbeatResponse r;
  EXPECT_EQ(registry_->Heartbeat(&ctx, hb, &r).error_code(), grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace varuna

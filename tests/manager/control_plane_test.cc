// The control plane in one process: a real manager and real agents talking gRPC on
// 127.0.0.1:0, with a fake clock (heartbeats and ticks are driven by the test) and fake
// launchers (no processes; the test decides when workers exit).

#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "agent/agent_server.h"
#include "common/launch/exit_codes.h"
#include "common/net/rpc.h"
#include "common/planner/profile.h"
#include "common/spec/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "manager/manager_server.h"
#include "tests/testing/eventually.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_launcher.h"
#include "tests/testing/status_matchers.h"
#include "varuna/v1/control.grpc.pb.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;
using ::varuna::testing::Eventually;
using ::varuna::testing::FakeClock;
using ::varuna::testing::FakeLauncher;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "/cp_XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) std::abort();
  return tmpl;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

class ControlPlaneTest : public ::testing::Test {
 protected:
  struct AgentUnderTest {
    FakeLauncher launcher;
    std::unique_ptr<AgentServer> server;
  };

  void SetUp() override {
    dir_ = MakeTempDir();
    data_ = dir_ + "/corpus.txt";
    std::ofstream(data_) << std::string(4096, 'x');
    // A fixed port so agents find a restarted manager.
    manager_address_ = absl::StrCat("127.0.0.1:", FreePort());
    StartManager();
  }

  void TearDown() override {
    agents_.clear();
    if (manager_) manager_->Shutdown();
    std::filesystem::remove_all(dir_);
  }

  void StartManager() {
    ManagerConfig config;
    config.listen = manager_address_;
    config.state_dir = dir_ + "/state";
    config.heartbeat_period = absl::Seconds(1);
    config.suspect_after_missed = 3;
    config.dead_after_missed = 10;
    config.stop_grace = absl::Seconds(5);
    config.machine_list = machine_list_;
    config.max_morphs = max_morphs_;
    manager_ =
        std::make_unique<ManagerServer>(config, &clock_, MakeGrpcAgentClientPool(absl::Seconds(5)),
                                        ManagerServer::Options{absl::ZeroDuration()});
    ASSERT_THAT(manager_->Start(), IsOk());
    jobs_ = v1::JobApi::NewStub(MakeChannel(manager_address_));
    registry_ = v1::AgentRegistry::NewStub(MakeChannel(manager_address_));
  }

  AgentUnderTest& AddAgent(const std::string& name, int slots) {
    auto a = std::make_unique<AgentUnderTest>();
    AgentConfig config;
    config.name = name;
    config.manager = manager_address_;
    config.listen = "127.0.0.1:0";
    config.slots = slots;
    config.work_dir = dir_ + "/" + name;
    config.worker_binary = "/bin/true";
    config.stop_grace = absl::Seconds(5);
    a->server = std::make_unique<AgentServer>(
        config, &clock_, &a->launcher, MakeGrpcManagerClient(manager_address_, absl::Seconds(5)),
        AgentServer::Options{false, absl::ZeroDuration()});
    EXPECT_THAT(a->server->Start(), IsOk());
    EXPECT_THAT(a->server->HeartbeatOnce(), IsOk());
    agents_.push_back(std::move(a));
    return *agents_.back();
  }

  void BeatAll() {
    for (auto& a : agents_) EXPECT_THAT(a->server->HeartbeatOnce(), IsOk());
  }
  void Tick() { manager_->Tick(); }

  std::string Spec(const std::string& extra = "parallel: {stages: 2}") const {
    return absl::StrCat(
        "name: t\nmodel: {kind: gpt, layers: 4, d_model: 32, heads: 2, "
        "seq_len: 8, vocab: 256}\ndata: {kind: text, path: ",
        data_, "}\ntrain: {global_batch: 8, steps: 20}\n", extra, "\n");
  }

  absl::StatusOr<v1::JobInfo> Submit(const std::string& yaml, const std::string& request_id = "") {
    grpc::ClientContext ctx;
    v1::SubmitRequest req;
    req.set_spec_yaml(yaml);
    req.set_request_id(request_id);
    v1::SubmitResponse resp;
    grpc::Status s = jobs_->Submit(&ctx, req, &resp);
    if (!s.ok()) return FromGrpcStatus(s);
    return resp.job();
  }
  v1::JobInfo Get(const std::string& id) {
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::GetJobResponse resp;
    EXPECT_TRUE(jobs_->GetJob(&ctx, req, &resp).ok());
    return resp.job();
  }
  v1::JobInfo Cancel(const std::string& id) {
    grpc::ClientContext ctx;
    v1::CancelJobRequest req;
    req.set_job_id(id);
    v1::CancelJobResponse resp;
    EXPECT_TRUE(jobs_->CancelJob(&ctx, req, &resp).ok());
    return resp.job();
  }
  std::map<std::string, v1::NodeState> NodeStates() {
    grpc::ClientContext ctx;
    v1::ListNodesResponse resp;
    EXPECT_TRUE(jobs_->ListNodes(&ctx, v1::ListNodesRequest(), &resp).ok());
    std::map<std::string, v1::NodeState> out;
    for (const auto& n : resp.nodes()) out[n.name()] = n.state();
    return out;
  }
  bool WaitState(const std::string& id, v1::JobState state) {
    return Eventually([&] { return Get(id).state() == state; });
  }
  int TotalAlive() {
    int n = 0;
    for (auto& a : agents_) n += a->launcher.alive();
    return n;
  }
  // Submits a 2-stage job on two 2-slot agents and waits until it runs.
  std::string RunningJob() {
    if (agents_.empty()) {
      AddAgent("a1", 2);
      AddAgent("a2", 2);
    }
    auto job = Submit(Spec());
    EXPECT_THAT(job.status(), IsOk());
    EXPECT_TRUE(WaitState(job->id(), v1::RUNNING)) << Get(job->id()).DebugString();
    return job->id();
  }

  FakeClock clock_;
  std::string dir_, data_, manager_address_, machine_list_;
  int max_morphs_ = 20;
  std::unique_ptr<ManagerServer> manager_;
  std::vector<std::unique_ptr<AgentUnderTest>> agents_;
  std::unique_ptr<v1::JobApi::Stub> jobs_;
  std::unique_ptr<v1::AgentRegistry::Stub> registry_;
};

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

namespace varuna {
namespace {

// docs/autoconfig.md: a profile job stores the profile its rank 0 measured; later jobs of the
// same model are planned by AutoConfig with it (schedule and stage boundaries in the launch,
// the predicted step time in status). Before that, the placement rule, said in status.
TEST_F(ControlPlaneTest, AProfileJobStoresAProfileThatPlansLaterJobs) {
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  const std::string auto_spec =
      Spec("parallel: {stages: auto, replicas: auto, micro_batch: auto, schedule: auto}");
  auto plain = Submit(auto_spec);
  ASSERT_THAT(plain.status(), IsOk());
  ASSERT_TRUE(WaitState(plain->id(), v1::RUNNING));
  EXPECT_THAT(Get(plain->id()).plan_source(), HasSubstr("placement rule (no profile of 'gpt"));
  EXPECT_EQ(Get(plain->id()).predicted_step_s(), 0);
  Cancel(plain->id());
  BeatAll();
  ASSERT_TRUE(WaitState(plain->id(), v1::CANCELLED));

  grpc::ClientContext ctx;
  v1::SubmitRequest req;
  req.set_spec_yaml(auto_spec);
  req.set_profile(true);
  v1::SubmitResponse resp;
  ASSERT_TRUE(jobs_->Submit(&ctx, req, &resp).ok());
  const std::string pid = resp.job().id();
  ASSERT_TRUE(WaitState(pid, v1::RUNNING)) << Get(pid).DebugString();
  EXPECT_TRUE(Get(pid).profile_job());
  EXPECT_EQ(Get(pid).slots(), 4);  // one replica per slot: links between all of them

  // Rank 0 writes the profile where the agent told it to and says so in its progress file.
  auto spec = ParseJobSpec(auto_spec);
  ASSERT_THAT(spec.status(), IsOk());
  auto profile = BuiltinProfile(*spec);
  ASSERT_THAT(profile.status(), IsOk());
  profile->set_device("cpu");
  profile->set_host("test");
  bool wrote = false;
  for (auto& a : agents_) {
    for (const auto& p : a->launcher.procs()) {
      if (p.spec.env.at("VARUNA_JOB_ID") != pid) continue;
      std::string out;
      for (const auto& arg : p.spec.argv) {
        if (absl::StartsWith(arg, "--profile_out=")) out = arg.substr(strlen("--profile_out="));
      }
      ASSERT_FALSE(out.empty()) << absl::StrJoin(p.spec.argv, " ");
      if (p.spec.env.at("RANK") != "0") continue;
      ASSERT_THAT(WriteProfileFile(out, *profile), IsOk());
      std::ofstream(p.spec.env.at("VARUNA_PROGRESS_FILE"))
          << "{\"profile\": \"" << out << "\"}\n{\"stopped\": true}\n";
      wrote = true;
    }
  }
  ASSERT_TRUE(wrote);
  BeatAll();
  for (auto& a : agents_) {
    for (const auto& p : a->launcher.procs()) {
      if (p.spec.env.at("VARUNA_JOB_ID") == pid) a->launcher.Exit(p.pid, 0);
    }
  }
  BeatAll();
  ASSERT_TRUE(WaitState(pid, v1::SUCCEEDED)) << Get(pid).DebugString();

  auto job = Submit(auto_spec);
  ASSERT_THAT(job.status(), IsOk());
  ASSERT_TRUE(WaitState(job->id(), v1::RUNNING));
  const v1::JobInfo info = Get(job->id());
  EXPECT_THAT(info.plan_source(), HasSubstr("profile of gpt layers=4"));
  EXPECT_GT(info.predicted_step_s(), 0);
  ASSERT_EQ(info.boundaries_size(), info.stages() + 1);
  const std::string bounds = absl::StrJoin(info.boundaries(), ",");
  int launched = 0;
  for (auto& a : agents_) {
    for (const auto& p : a->launcher.procs()) {
      if (p.spec.env.at("VARUNA_JOB_ID") != job->id()) continue;
      ++launched;
      EXPECT_THAT(p.spec.argv, ::testing::Contains(absl::StrCat("--schedule=", info.schedule())));
      EXPECT_THAT(p.spec.argv, ::testing::Contains(absl::StrCat("--stage_boundaries=", bounds)));
    }
  }
  EXPECT_EQ(launched, info.slots());

  // varunactl plan's RPCs: the stored profile, and a plan for the slots now.
  grpc::ClientContext c2;
  v1::GetProfileRequest gr;
  gr.set_model_key(ModelKey(spec->model));
  gr.set_precision("fp32");
  v1::GetProfileResponse got;
  ASSERT_TRUE(jobs_->GetProfile(&c2, gr, &got).ok());
  EXPECT_TRUE(got.found());
  EXPECT_EQ(got.profile().host(), "test");
  grpc::ClientContext c3;
  v1::PlanJobRequest pr;
  pr.set_spec_yaml(auto_spec);
  v1::PlanJobResponse planned;
  ASSERT_TRUE(jobs_->PlanJob(&c3, pr, &planned).ok());
  EXPECT_THAT(planned.plans().cost_source(), HasSubstr("profile of"));
}

// A damaged profile from a worker is refused with the reason and stored nowhere.
TEST_F(ControlPlaneTest, ADamagedProfileIsNotStored) {
  AddAgent("a1", 2);
  grpc::ClientContext ctx;
  v1::SubmitRequest req;
  req.set_spec_yaml(Spec("parallel: {stages: auto}"));
  req.set_profile(true);
  v1::SubmitResponse resp;
  ASSERT_TRUE(jobs_->Submit(&ctx, req, &resp).ok());
  const std::string pid = resp.job().id();
  ASSERT_TRUE(WaitState(pid, v1::RUNNING));
  for (const auto& p : agents_[0]->launcher.procs()) {
    if (p.spec.env.at("RANK") != "0") continue;
    std::string out;
    for (const auto& arg : p.spec.argv) {
      if (absl::StartsWith(arg, "--profile_out=")) out = arg.substr(strlen("--profile_out="));
    }
    std::ofstream(out) << "{\"version\": 1, \"segments\": [";
    std::ofstream(p.spec.env.at("VARUNA_PROGRESS_FILE")) << "{\"profile\": \"" << out << "\"}\n";
    // A path other than the one the agent chose is never read.
    std::ofstream(p.spec.env.at("VARUNA_PROGRESS_FILE"), std::ios::app)
        << "{\"profile\": \"/etc/passwd\"}\n";
  }
  BeatAll();
  grpc::ClientContext c2;
  v1::GetProfileRequest gr;
  gr.set_model_key("gpt layers=4 d_model=32 heads=2 seq_len=8 vocab=256");
  gr.set_precision("fp32");
  v1::GetProfileResponse got;
  ASSERT_TRUE(jobs_->GetProfile(&c2, gr, &got).ok());
  EXPECT_FALSE(got.found());
  // The job fails with the reason even though its workers exit 0.
  for (const auto& p : agents_[0]->launcher.procs()) agents_[0]->launcher.Exit(p.pid, 0);
  BeatAll();
  ASSERT_TRUE(WaitState(pid, v1::FAILED));
  EXPECT_THAT(Get(pid).reason(), HasSubstr("no profile stored: unusable profile"));

  // A profile job runs varuna-worker's profiler: an entrypoint is refused at submit.
  grpc::ClientContext c3;
  v1::SubmitRequest bad;
  bad.set_spec_yaml(Spec("parallel: {stages: auto}\nentrypoint: [/bin/true]"));
  bad.set_profile(true);
  v1::SubmitResponse r3;
  const grpc::Status st = jobs_->Submit(&c3, bad, &r3);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("remove the job's entrypoint"));
}

}  // namespace
}  // namespace varuna

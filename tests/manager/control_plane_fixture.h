#pragma once

// The control plane in one process, shared by the control_plane_*_test.cc files: a real
// manager and real agents talking gRPC on 127.0.0.1:0, with a fake clock (heartbeats and ticks
// are driven by the test) and fake launchers (no processes; the test decides when workers
// exit). One fixture class for the three files (gtest requires it), so it is not in an
// anonymous namespace.

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
#include "manager/api/manager_server.h"
#include "tests/testing/eventually.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_launcher.h"
#include "tests/testing/status_matchers.h"
#include "varuna/v1/control.grpc.pb.h"

namespace varuna {

using ::testing::HasSubstr;
using ::varuna::testing::Eventually;
using ::varuna::testing::FakeClock;
using ::varuna::testing::FakeLauncher;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

inline std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "/cp_XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) std::abort();
  return tmpl;
}

inline int FreePort() {
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
    config.check_job_files = true;  // the option's path (off by default: docs/operations.md)
    config.heartbeat_period = absl::Seconds(1);
    config.suspect_after_missed = 3;
    config.dead_after_missed = 10;
    config.stop_grace = absl::Seconds(5);
    config.machine_list = machine_list_;
    config.max_morphs = max_morphs_;
    config.forget_dead_after = forget_dead_after_;
    config.morph_in_place = false;  // the relaunch path (in place: tests/e2e/in_place_e2e.py)
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
  absl::Duration forget_dead_after_ = absl::Hours(24);
  std::unique_ptr<ManagerServer> manager_;
  std::vector<std::unique_ptr<AgentUnderTest>> agents_;
  std::unique_ptr<v1::JobApi::Stub> jobs_;
  std::unique_ptr<v1::AgentRegistry::Stub> registry_;
};

}  // namespace varuna

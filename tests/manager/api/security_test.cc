// Hardening of the control plane, through the RPC surface a hostile peer would use: mutual
// TLS (only agents with a cluster certificate register, only the manager calls agents),
// bearer tokens for varunactl, limits on what a peer can make the manager keep, and file
// checks that cannot stall the manager's or the agent's loop.

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/agent_server.h"
#include "common/net/http_request.h"
#include "common/net/rpc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "manager/api/manager_api.h"
#include "manager/api/manager_server.h"
#include "manager/api/tokens.h"
#include "manager/state/state_store.h"
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

constexpr char kAliceToken[] = "alice-0123456789abcdef";

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "/sec_XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) std::abort();
  return tmpl;
}

void MakeCerts(const std::string& dir, const std::string& names) {
  const std::string cmd =
      absl::StrCat(VARUNA_SOURCE_DIR, "/scripts/make_certs.sh ", dir, " ", names, " > /dev/null");
  ASSERT_EQ(system(cmd.c_str()), 0) << cmd;
}

TlsConfig Tls(const std::string& dir, const std::string& name) {
  TlsFiles f{dir + "/ca.pem", name.empty() ? "" : dir + "/" + name + ".pem",
             name.empty() ? "" : dir + "/" + name + ".key"};
  auto t = LoadTls(f, !name.empty(), "test");
  EXPECT_THAT(t.status(), IsOk());
  return t.value_or(TlsConfig{});
}

// Trusts the cluster CA but presents a certificate from another one: what a machine that is
// not part of the cluster would do.
TlsConfig ForeignCert(const std::string& cluster, const std::string& other,
                      const std::string& name) {
  TlsConfig t = Tls(cluster, "");
  TlsConfig o = Tls(other, name);
  t.cert_pem = o.cert_pem;
  t.key_pem = o.key_pem;
  return t;
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    certs_ = dir_ + "/certs";
    other_ = dir_ + "/other";
    MakeCerts(certs_, "varuna-manager=127.0.0.1 node0=127.0.0.1 node1=127.0.0.1");
    MakeCerts(other_, "node0=127.0.0.1");  // the same name, another CA
    data_ = dir_ + "/corpus.txt";
    std::ofstream(data_) << std::string(4096, 'x');
    std::ofstream(dir_ + "/tokens") << "# name token\nalice " << kAliceToken << "\n";
    ManagerConfig config;
    config.listen = "127.0.0.1:0";
    config.state_dir = dir_ + "/state";
    config.tls = TlsFiles{certs_ + "/ca.pem", certs_ + "/varuna-manager.pem",
                          certs_ + "/varuna-manager.key"};
    config.tokens_file = dir_ + "/tokens";
    manager_ = std::make_unique<ManagerServer>(
        config, &clock_, MakeGrpcAgentClientPool(absl::Seconds(5), Tls(certs_, "varuna-manager")),
        ManagerServer::Options{absl::ZeroDuration()});
    ASSERT_THAT(manager_->Start(), IsOk());
    address_ = manager_->address();
  }
  void TearDown() override {
    agents_.clear();
    if (manager_) manager_->Shutdown();
    std::filesystem::remove_all(dir_);
  }

  // An agent that trusts the cluster CA and holds a certificate from `cert_dir` (the
  // cluster's or another CA's).
  AgentServer& AddAgent(const std::string& name, const std::string& cert_dir, absl::Status* beat) {
    AgentConfig c;
    c.name = name;
    c.manager = address_;
    c.listen = "127.0.0.1:0";
    c.slots = 2;
    c.work_dir = dir_ + "/" + name;
    c.worker_binary = "/bin/true";
    c.tls = TlsFiles{certs_ + "/ca.pem", cert_dir + "/" + name + ".pem",
                     cert_dir + "/" + name + ".key"};
    launchers_.push_back(std::make_unique<FakeLauncher>());
    agents_.push_back(std::make_unique<AgentServer>(
        c, &clock_, launchers_.back().get(),
        MakeGrpcManagerClient(address_, absl::Seconds(5), ForeignCert(certs_, cert_dir, name)),
        AgentServer::Options{false, absl::ZeroDuration()}));
    EXPECT_THAT(agents_.back()->Start(), IsOk());
    *beat = agents_.back()->HeartbeatOnce();
    return *agents_.back();
  }

  std::unique_ptr<v1::JobApi::Stub> Jobs(const TlsConfig& tls) {
    return v1::JobApi::NewStub(MakeChannel(address_, tls));
  }
  grpc::Status Submit(v1::JobApi::Stub* stub, const std::string& token, v1::JobInfo* job) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(5));
    if (!token.empty()) ctx.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    v1::SubmitRequest req;
    req.set_spec_yaml(Spec());
    v1::SubmitResponse resp;
    grpc::Status s = stub->Submit(&ctx, req, &resp);
    if (job != nullptr) *job = resp.job();
    return s;
  }
  std::string Spec() const {
    return absl::StrCat(
        "name: t\nmodel: {kind: gpt, layers: 4, d_model: 32, heads: 2, seq_len: 8}\n",
        "data: {kind: text, path: ", data_, "}\ntrain: {global_batch: 8, steps: 5}\n",
        "parallel: {stages: 2, replicas: 1}\n");
  }

  FakeClock clock_;
  std::string dir_, certs_, other_, data_, address_;
  std::unique_ptr<ManagerServer> manager_;
  std::vector<std::unique_ptr<FakeLauncher>> launchers_;
  std::vector<std::unique_ptr<AgentServer>> agents_;
};

TEST_F(SecurityTest, TokensDecideWhoMayUseTheJobApiAndAreRecordedOnTheJob) {
  auto jobs = Jobs(Tls(certs_, ""));
  v1::JobInfo job;
  grpc::Status none = Submit(jobs.get(), "", nullptr);
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.error_message(), HasSubstr("no token"));
  grpc::Status wrong = Submit(jobs.get(), "mallory-0123456789abcdef", nullptr);
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(wrong.error_message(), HasSubstr("not in the manager's tokens file"));
  {
    grpc::ClientContext ctx;  // reads need a token too
    v1::ListJobsResponse resp;
    EXPECT_EQ(jobs->ListJobs(&ctx, v1::ListJobsRequest(), &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  ASSERT_TRUE(Submit(jobs.get(), kAliceToken, &job).ok());
  EXPECT_EQ(job.submitted_by(), "alice");
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kAliceToken));
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  v1::CancelJobResponse resp;
  ASSERT_TRUE(jobs->CancelJob(&ctx, cancel, &resp).ok());
  EXPECT_EQ(resp.job().cancelled_by(), "alice");
  EXPECT_EQ(resp.job().state(), v1::CANCELLED);
}

TEST_F(SecurityTest, PlaintextClientIsRefused) {
  auto plain = Jobs(TlsConfig{});
  grpc::Status s = Submit(plain.get(), kAliceToken, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

TEST_F(SecurityTest, OnlyAgentsWithAClusterCertificateRegister) {
  absl::Status good, bad;
  AddAgent("node0", certs_, &good);
  EXPECT_THAT(good, IsOk());
  // Trusting the cluster CA but holding a certificate from another CA: the manager refuses
  // the handshake.
  AddAgent("node0", other_, &bad);
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kUnavailable, ""));
  // TLS with the right CA but no client certificate (what varunactl has): refused.
  auto registry = v1::AgentRegistry::NewStub(MakeChannel(address_, Tls(certs_, "")));
  grpc::ClientContext ctx;
  v1::RegisterRequest req;
  req.set_name("intruder");
  req.set_address("127.0.0.1:1");
  req.set_slots(1);
  v1::RegisterResponse resp;
  grpc::Status s = registry->Register(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // node1's certificate cannot register (or heartbeat) as node0: no impersonation.
  auto as_node1 = v1::AgentRegistry::NewStub(MakeChannel(address_, Tls(certs_, "node1")));
  grpc::ClientContext ctx2;
  req.set_name("node0");
  grpc::Status spoof = as_node1->Register(&ctx2, req, &resp);
  EXPECT_EQ(spoof.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(spoof.error_message(), HasSubstr("certificate names 'node1'"));
  auto nodes = manager_->loop().RunSync([&] { return manager_->api().ListNodes(); });
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].name(), "node0");
  EXPECT_NE(nodes[0].address(), "127.0.0.1:1");
}

TEST_F(SecurityTest, OnlyTheManagerCanLaunchOnAnAgent) {
  absl::Status beat;
  AgentServer& agent = AddAgent("node0", certs_, &beat);
  ASSERT_THAT(beat, IsOk());
  v1::LaunchRequest launch;
  launch.set_job_id("evil");
  launch.set_generation(1);
  launch.set_spec_yaml("x: 1");
  launch.set_world_size(1);
  launch.add_ranks()->set_rank(0);
  launch.add_entrypoint("/bin/sh");
  auto try_launch = [&](const TlsConfig& tls) {
    auto stub = v1::AgentApi::NewStub(MakeChannel(agent.address(), tls));
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(5));
    v1::LaunchResponse resp;
    return stub->Launch(&ctx, launch, &resp);
  };
  // Another agent's certificate (same CA): the handshake passes, the call does not.
  grpc::Status peer = try_launch(Tls(certs_, "node1"));
  EXPECT_EQ(peer.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(peer.error_message(), HasSubstr("only the manager"));
  EXPECT_NE(try_launch(Tls(certs_, "")).error_code(), grpc::StatusCode::OK);  // no client cert
  EXPECT_NE(try_launch(TlsConfig{}).error_code(), grpc::StatusCode::OK);      // plaintext
  EXPECT_NE(try_launch(ForeignCert(certs_, other_, "node0")).error_code(),
            grpc::StatusCode::OK);  // a certificate from another CA
  EXPECT_TRUE(launchers_[0]->procs().empty());
  // The manager itself launches: a submitted job's ranks start on the agent.
  absl::Status beat1;
  AddAgent("node1", certs_, &beat1);
  ASSERT_THAT(beat1, IsOk());
  auto jobs = Jobs(Tls(certs_, ""));
  v1::JobInfo job;
  ASSERT_TRUE(Submit(jobs.get(), kAliceToken, &job).ok());
  EXPECT_TRUE(Eventually(
      [&] { return launchers_[0]->procs().size() + launchers_[1]->procs().size() == 2; }));
}

// The manager checks an agent's certificate against the node's name, not the address the node
// claimed, so a node registered under another's address gets nothing run on the victim (Note
// [Agent identity] in manager/nodes/agent_client.cc).
TEST_F(SecurityTest, TheManagerChecksTheAgentsCertificateIsThatNode) {
  absl::Status beat;
  AgentServer& node1 = AddAgent("node1", certs_, &beat);
  ASSERT_THAT(beat, IsOk());
  auto pool = MakeGrpcAgentClientPool(absl::Seconds(5), Tls(certs_, "varuna-manager"));
  auto fetch = [&](const std::string& node) {
    v1::FetchLogsRequest req;
    req.set_job_id("none");
    std::promise<absl::Status> got;
    pool->For(node, node1.address())->FetchLogs(req, [&](absl::StatusOr<v1::FetchLogsResponse> r) {
      got.set_value(r.status());
    });
    return got.get_future().get();
  };
  // node1's own name: the handshake passes (the call itself may fail for other reasons).
  EXPECT_NE(fetch("node1").code(), absl::StatusCode::kUnavailable);
  // node0 "living" at node1's address: node1's certificate does not name node0.
  EXPECT_EQ(fetch("node0").code(), absl::StatusCode::kUnavailable);
}

TEST_F(SecurityTest, DaemonsRefuseNonLoopbackWithoutTls) {
  ManagerConfig config;
  config.listen = "0.0.0.0:0";
  config.state_dir = dir_ + "/state2";
  EXPECT_THAT(config.Validate(), StatusIs(absl::StatusCode::kFailedPrecondition, "without TLS"));
  config.tls =
      TlsFiles{certs_ + "/ca.pem", certs_ + "/varuna-manager.pem", certs_ + "/varuna-manager.key"};
  // TLS alone is not enough beyond loopback: the job API needs tokens.
  EXPECT_THAT(config.Validate(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "without --tokens_file"));
  config.tokens_file = dir_ + "/tokens";
  EXPECT_THAT(config.Validate(), IsOk());
  config.tls = TlsFiles{};
  config.tokens_file.clear();
  config.allow_insecure = true;
  EXPECT_THAT(config.Validate(), IsOk());
  AgentConfig ac;
  ac.name = "n";
  ac.manager = "127.0.0.1:1";
  ac.listen = "0.0.0.0:0";
  ac.work_dir = dir_ + "/n";
  FakeLauncher launcher;
  AgentServer agent(ac, &clock_, &launcher, MakeGrpcManagerClient(ac.manager, absl::Seconds(1)),
                    AgentServer::Options{false, absl::ZeroDuration()});
  EXPECT_THAT(agent.Start(), StatusIs(absl::StatusCode::kFailedPrecondition, "without TLS"));
}

// ---- limits and loops, on a plaintext loopback manager --------------------------------

class HardeningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    ManagerConfig config;
    config.listen = "127.0.0.1:0";
    config.state_dir = dir_ + "/state";
    config.check_job_files = true;  // the option's path (off by default: docs/operations.md)
    config.max_nodes = 3;
    config.forget_dead_after = absl::Minutes(10);
    manager_ =
        std::make_unique<ManagerServer>(config, &clock_, MakeGrpcAgentClientPool(absl::Seconds(5)),
                                        ManagerServer::Options{absl::ZeroDuration()});
    ASSERT_THAT(manager_->Start(), IsOk());
    jobs_ = v1::JobApi::NewStub(MakeChannel(manager_->address()));
    registry_ = v1::AgentRegistry::NewStub(MakeChannel(manager_->address()));
  }
  void TearDown() override {
    manager_->Shutdown();
    std::filesystem::remove_all(dir_);
  }
  grpc::Status Register(const std::string& name, int slots, int labels = 0) {
    grpc::ClientContext ctx;
    v1::RegisterRequest req;
    req.set_name(name);
    req.set_address(absl::StrCat("127.0.0.1:", 1 + std::hash<std::string>()(name) % 60000));
    req.set_slots(slots);
    for (int i = 0; i < labels; ++i) (*req.mutable_labels())[absl::StrCat("k", i)] = "v";
    v1::RegisterResponse resp;
    return registry_->Register(&ctx, req, &resp);
  }
  size_t Nodes() {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(2));
    v1::ListNodesResponse resp;
    EXPECT_TRUE(jobs_->ListNodes(&ctx, v1::ListNodesRequest(), &resp).ok());
    return resp.nodes_size();
  }

  FakeClock clock_;
  std::string dir_;
  std::unique_ptr<ManagerServer> manager_;
  std::unique_ptr<v1::JobApi::Stub> jobs_;
  std::unique_ptr<v1::AgentRegistry::Stub> registry_;
};

TEST_F(HardeningTest, RegisterLimitsWhatAPeerCanMakeTheManagerKeep) {
  EXPECT_EQ(Register(std::string(1 << 20, 'n'), 1).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Register("n1", 1000000000).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Register("n1", 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Register("a/b", 1).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Register("varuna-manager", 1).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Register("n1", 1, 33).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Nodes(), 0u);
  for (const char* n : {"n1", "n2", "n3"}) EXPECT_TRUE(Register(n, 2).ok());
  grpc::Status full = Register("n4", 2);
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(Register("n1", 2).ok());  // a known node may always re-register
  // Silent nodes go DEAD, and after forget_dead_after they are forgotten: room again.
  clock_.Advance(absl::Seconds(11));
  manager_->Tick();
  EXPECT_EQ(Nodes(), 3u);
  clock_.Advance(absl::Minutes(11));
  manager_->Tick();
  EXPECT_EQ(Nodes(), 0u);
  EXPECT_TRUE(Register("n4", 2).ok());
}

TEST_F(HardeningTest, SpecWhoseDataIsAFifoIsRefusedWithoutStallingTheManager) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(5));
  v1::SubmitRequest req;
  req.set_spec_yaml(absl::StrCat("data: {path: ", fifo, "}\n"));
  v1::SubmitResponse resp;
  const absl::Time t0 = absl::Now();
  grpc::Status s = jobs_->Submit(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("not a regular file"));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
  EXPECT_EQ(Nodes(), 0u);  // the loop answers
}

TEST_F(HardeningTest, HostileSpecsAreRefusedThroughSubmitAndTheManagerLives) {
  const std::string data = dir_ + "/corpus.txt";
  std::ofstream(data) << std::string(4096, 'x');
  const std::string base = absl::StrCat("data: {path: ", data, "}\n");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"? [a, b]\n: 1\n", "not a plain name"},
      {base + "env: {A: [1, 2, 3]}\n", "'env.A' must be a single value"},
      {base + "train: {lr: .inf}\n", "train.lr"},
      {base + "train: {steps: 99999999999}\n", "train.steps"},
      {base + "train: {lr: 1, lr: 2}\n", "given twice"},
      {base + "model: {layers: 100000}\n", "model.layers"},
      {base + "name: " + std::string(2 << 20, 'x') + "\n", "limit"},
  };
  for (const auto& [spec, needle] : cases) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(5));
    v1::SubmitRequest req;
    req.set_spec_yaml(spec);
    v1::SubmitResponse resp;
    grpc::Status s = jobs_->Submit(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << spec.substr(0, 60);
    EXPECT_THAT(s.error_message(), HasSubstr(needle)) << spec.substr(0, 60);
  }
  EXPECT_EQ(Nodes(), 0u);
}

// Agents that accept every launch and stop (the manager's view of a healthy cluster).
class AcceptingAgent final : public AgentClient {
 public:
  void Launch(const v1::LaunchRequest&, Done<v1::LaunchResponse> d) override {
    v1::LaunchResponse r;
    r.set_master_port(29500);
    d(r);
  }
  void Stop(const v1::StopRequest&, Done<v1::StopResponse> d) override { d(v1::StopResponse()); }
  void Checkpoint(const v1::CheckpointRequest&, Done<v1::CheckpointResponse> d) override {
    d(v1::CheckpointResponse());
  }
  void FetchLogs(const v1::FetchLogsRequest&, Done<v1::FetchLogsResponse> d) override {
    d(v1::FetchLogsResponse());
  }
};
class AcceptingPool final : public AgentClientPool {
 public:
  std::shared_ptr<AgentClient> For(const std::string&, const std::string&) override {
    return std::make_shared<AcceptingAgent>();
  }
};

TEST(PeerLimitsTest, ANodeSpeaksOnlyForItsOwnRanks) {
  const std::string dir = MakeTempDir();
  auto store = StateStore::Open(dir);
  ASSERT_THAT(store.status(), IsOk());
  FakeClock clock;
  AcceptingPool pool;
  std::deque<std::function<void()>> posted;
  ManagerConfig mc;
  mc.state_dir = dir;
  mc.check_job_files = false;
  Manager m(mc, &clock, store->get(), &pool, [&](std::function<void()> f) { posted.push_back(f); });
  ManagerApi api(&m, &pool);
  auto drain = [&] {
    while (!posted.empty()) {
      auto f = std::move(posted.front());
      posted.pop_front();
      f();
    }
  };
  for (const char* n : {"n1", "n2"}) {
    v1::RegisterRequest r;
    r.set_name(n);
    r.set_address(absl::StrCat("127.0.0.1:", n[1] - '0'));
    r.set_slots(1);
    ASSERT_THAT(m.Register(r).status(), IsOk());
  }
  v1::SubmitRequest req;
  req.set_spec_yaml(
      "data: {path: /x}\nmodel: {layers: 2, d_model: 8, heads: 2, seq_len: 4}\n"
      "train: {global_batch: 2, steps: 5}\nparallel: {stages: 1, replicas: 1}\n");
  auto spec = JobAdmission::Admit(req);
  ASSERT_THAT(spec.status(), IsOk());
  auto job = api.Submit(req, *spec);
  ASSERT_THAT(job.status(), IsOk());
  drain();
  v1::JobInfo info = *api.GetJob(job->id());
  ASSERT_EQ(info.state(), v1::RUNNING);
  ASSERT_EQ(info.placement_size(), 1);
  const std::string other = info.placement(0).node() == "n1" ? "n2" : "n1";
  // The other node reports the job's rank 0 as failed and a made-up rank 7 as done, both
  // at step 4: every one of these reports is ignored.
  v1::HeartbeatRequest hb;
  hb.set_name(other);
  for (int rank : {0, 7}) {
    v1::WorkerStatus* w = hb.add_workers();
    w->set_job_id(job->id());
    w->set_generation(info.generation());
    w->set_rank(rank);
    w->set_state(v1::WORKER_EXITED);
    w->set_exit_code(rank == 0 ? 1 : 0);
    w->mutable_progress()->set_step(4);
  }
  ASSERT_THAT(m.Heartbeat(hb).status(), IsOk());
  clock.Advance(absl::Seconds(3));
  m.Tick();
  drain();
  info = *api.GetJob(job->id());
  EXPECT_EQ(info.state(), v1::RUNNING) << info.reason();
  EXPECT_EQ(info.step(), 0);
  // The owner's own report counts (and a step past the job's end does not).
  hb.set_name(info.placement(0).node());
  hb.mutable_workers()->DeleteSubrange(1, 1);
  hb.mutable_workers(0)->set_state(v1::WORKER_RUNNING);
  hb.mutable_workers(0)->mutable_progress()->set_step(3);
  ASSERT_THAT(m.Heartbeat(hb).status(), IsOk());
  EXPECT_EQ(api.GetJob(job->id())->step(), 3);
  hb.mutable_workers(0)->mutable_progress()->set_step(1 << 30);
  ASSERT_THAT(m.Heartbeat(hb).status(), IsOk());
  EXPECT_EQ(api.GetJob(job->id())->step(), 3);
  std::filesystem::remove_all(dir);
}

TEST(AgentHardeningTest, AFifoInPlaceOfTheProgressFileOrLogDoesNotFreezeTheAgent) {
  const std::string dir = MakeTempDir();
  FakeClock clock;
  FakeLauncher launcher;
  AgentConfig c;
  c.name = "a";
  c.manager = "127.0.0.1:1";
  c.work_dir = dir;
  c.slots = 1;
  Agent agent(c, &clock, &launcher);
  v1::LaunchRequest launch;
  launch.set_job_id("7");
  launch.set_generation(1);
  launch.set_spec_yaml("x: 1");
  launch.set_world_size(1);
  launch.add_ranks()->set_rank(0);
  ASSERT_THAT(agent.Launch(launch).status(), IsOk());
  const std::string progress = launcher.procs()[0].spec.env.at("VARUNA_PROGRESS_FILE");
  ASSERT_EQ(mkfifo(progress.c_str(), 0600), 0);
  const std::string log = dir + "/jobs/7/rank0.log";
  std::filesystem::remove(log);
  ASSERT_EQ(mkfifo(log.c_str(), 0600), 0);
  const absl::Time t0 = absl::Now();
  v1::HeartbeatRequest hb = agent.BuildHeartbeat();
  ASSERT_EQ(hb.workers_size(), 1);
  EXPECT_EQ(hb.workers(0).progress().step(), 0);
  v1::FetchLogsRequest logs;
  logs.set_job_id("7");
  logs.set_rank(0);
  logs.set_max_bytes(2147483647);
  EXPECT_FALSE(agent.FetchLogs(logs).ok());
  launcher.Exit(launcher.procs()[0].pid, 1);
  agent.Tick();  // appends "exited" to the log: must not block on the FIFO
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
  std::filesystem::remove_all(dir);
}

// Note [Leader address] in manager/api/manager_role.cc: an address one daemon hands others
// (--advertise, the leader a standby names in gRPC metadata, which aborts the process on a
// value that is not printable ASCII) is checked: a manager refuses to start with a bad one.
TEST(PeerAddressTest, OnlyAddressesOthersCanDialAreAdvertised) {
  for (const char* good :
       {"10.0.0.1:7070", "mgr.example.com:7070", "[::1]:7070", "node_1:1", "m-2:65535"}) {
    EXPECT_THAT(CheckPeerAddress(good), IsOk()) << good;
  }
  const std::pair<std::string, std::string> bad[] = {
      {"mgr:0", "no port"},
      {"mgr", "no port"},
      {":7070", "no port"},
      {"mgr\xc3\xa9:7070", "mgr\\xc3\\xa9:7070"},  // named escaped
      {"a b:1", "character"},
      {"mgr\n:1", "character"},
      {"[::1]x:1", "character"},
      {"-mgr:1", "no host"},
      {std::string(300, 'a') + ":1", "too long"},
  };
  for (const auto& [address, why] : bad) {
    EXPECT_THAT(CheckPeerAddress(address), StatusIs(absl::StatusCode::kInvalidArgument, why))
        << address;
  }
  ManagerConfig config;
  config.listen = "127.0.0.1:7070";
  config.state_dir = "/var/lib/varuna-manager";
  config.advertise = "mgr\xc3\xa9:7070";
  EXPECT_THAT(config.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "--advertise"));
  config.advertise = "mgr.example.com:7070";
  EXPECT_THAT(config.Validate(), IsOk());
}

TEST(TokenTableTest, ParsesAndLooksUp) {
  auto t = TokenTable::Parse("# c\nalice 0123456789abcdef0\n\nbob  fedcba98765432100\n", "f");
  ASSERT_THAT(t.status(), IsOk());
  EXPECT_EQ(t->Lookup("0123456789abcdef0").value_or(""), "alice");
  EXPECT_FALSE(t->Lookup("0123456789abcdef").has_value());
  EXPECT_FALSE(t->Lookup("").has_value());
  EXPECT_THAT(TokenTable::Parse("alice short\n", "f").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "line 1"));
  EXPECT_THAT(TokenTable::Parse("a b c d e\n", "f").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "NAME TOKEN [USER|-] [admin|user]"));
  // A third word is the Unix user the token's jobs run as (Note [Worker user]).
  auto u = TokenTable::Parse("alice 0123456789abcdef0 alice_ml\nbob fedcba98765432100\n", "f");
  ASSERT_THAT(u.status(), IsOk());
  EXPECT_EQ(u->Find("0123456789abcdef0")->unix_user, "alice_ml");
  EXPECT_EQ(u->Find("fedcba98765432100")->unix_user, "");
  for (const char* bad : {"Root", "a;b", "-x", "0day", "averyveryveryveryverylongusername12"}) {
    EXPECT_THAT(TokenTable::Parse(absl::StrCat("a 0123456789abcdef0 ", bad, "\n"), "f").status(),
                StatusIs(absl::StatusCode::kInvalidArgument, "not a Unix user name"))
        << bad;
  }
  EXPECT_THAT(TokenTable::Parse("", "f").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_EQ(BearerToken("Bearer abc"), "abc");
  EXPECT_EQ(BearerToken("Basic abc"), "");
}

}  // namespace
}  // namespace varuna

namespace varuna {
namespace {

// code_dir (Varuna's --code_dir) is checked on the node before anything starts; a user
// entrypoint starts in it, and the resume step reaches the worker as a flag and env var.
TEST(AgentLaunchTest, CodeDirIsCheckedAndResumeStepIsPassedOn) {
  const std::string dir = MakeTempDir();
  FakeClock clock;
  FakeLauncher launcher;
  AgentConfig c;
  c.name = "a";
  c.manager = "127.0.0.1:1";
  c.work_dir = dir;
  c.slots = 2;
  c.worker_binary = "/bin/true";
  Agent agent(c, &clock, &launcher);
  v1::LaunchRequest launch;
  launch.set_job_id("7");
  launch.set_generation(2);
  launch.set_spec_yaml("x: 1");
  launch.set_world_size(2);
  launch.add_ranks()->set_rank(0);
  launch.set_code_dir(dir + "/nope");
  launch.add_entrypoint("/bin/echo");
  EXPECT_THAT(agent.Launch(launch).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "is not a directory on node a"));
  EXPECT_TRUE(launcher.procs().empty());
  launch.set_code_dir(dir);
  launch.set_resume_step("latest; rm -rf /");
  EXPECT_THAT(agent.Launch(launch).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "resume_step"));
  launch.set_resume_step("latest");
  ASSERT_THAT(agent.Launch(launch).status(), IsOk());
  ASSERT_EQ(launcher.procs().size(), 1u);
  EXPECT_EQ(launcher.procs()[0].spec.cwd, dir);
  EXPECT_EQ(launcher.procs()[0].spec.env.at("VARUNA_RESUME_STEP"), "latest");
  // The generic worker gets it as its flag.
  launch.clear_entrypoint();
  launch.set_generation(3);
  ASSERT_THAT(agent.Launch(launch).status(), IsOk());
  const std::vector<std::string> argv = launcher.procs().back().spec.argv;
  EXPECT_EQ(argv.back(), "--resume_step=latest");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace varuna

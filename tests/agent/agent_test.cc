// The agent's end of the worker protocol (Note [Worker protocol] in
// common/launch/worker_protocol.cc): commands over the control pipe with signals as the
// fallback, and progress lines of both forms through the codec.

#include "agent/agent.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/agent_metrics.h"
#include "common/base/status_macros.h"
#include "common/launch/worker_protocol.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;
using ::varuna::testing::FakeClock;
using ::varuna::testing::IsOk;

// Records what the agent asks of its processes; a process "listens" on its control FIFO
// unless the test says it ignores it (a user program that never opens it).
class RecordingLauncher final : public ProcessLauncher {
 public:
  struct Proc {
    ProcessSpec spec;
    std::vector<int> signals;
    std::vector<std::string> commands;
    bool listens = true;
  };

  absl::StatusOr<int> Launch(const ProcessSpec& spec) override {
    procs_[next_pid_].spec = spec;
    return next_pid_++;
  }
  absl::Status Signal(int pid, int sig) override {
    procs_[pid].signals.push_back(sig);
    return absl::OkStatus();
  }
  std::vector<ProcessExit> Reap() override { return std::exchange(exits_, {}); }
  absl::Status SendCommand(int pid, const std::string& line) override {
    if (!procs_[pid].listens) return absl::UnavailableError("nothing reads it");
    procs_[pid].commands.push_back(line);
    return absl::OkStatus();
  }

  std::map<int, Proc> procs_;
  std::vector<ProcessExit> exits_;  // what the next Reap returns
  int next_pid_ = 100;
};

class AgentProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/agent_test_", getpid());
    std::filesystem::remove_all(dir_);
    AgentConfig c;
    c.name = "a";
    c.manager = "127.0.0.1:1";
    c.work_dir = dir_;
    c.slots = 2;
    agent_ = std::make_unique<Agent>(c, &clock_, &launcher_);
    v1::LaunchRequest launch;
    launch.set_job_id("j");
    launch.set_generation(4);
    launch.set_spec_yaml("x: 1");
    launch.set_world_size(2);
    launch.add_ranks()->set_rank(0);
    launch.add_ranks()->set_rank(1);
    ASSERT_THAT(agent_->Launch(launch).status(), IsOk());
    ASSERT_EQ(launcher_.procs_.size(), 2u);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  RecordingLauncher::Proc& Rank(int r) { return launcher_.procs_.at(100 + r); }
  void Write(int rank, const std::string& text) {
    std::ofstream(Rank(rank).spec.env.at(kProgressFileEnv), std::ios::app) << text;
  }
  v1::WorkerStatus Beat(int rank) {
    const v1::HeartbeatRequest hb = agent_->BuildHeartbeat();
    for (const auto& w : hb.workers()) {
      if (w.rank() == rank) return w;
    }
    ADD_FAILURE() << "no rank " << rank;
    return {};
  }

  std::string dir_;
  FakeClock clock_;
  RecordingLauncher launcher_;
  std::unique_ptr<Agent> agent_;
};

TEST_F(AgentProtocolTest, EveryWorkerGetsAControlPipeAndAProgressFile) {
  for (int r : {0, 1}) {
    const ProcessSpec& spec = Rank(r).spec;
    const std::string gen = absl::StrCat(dir_, "/jobs/j/gen4");
    EXPECT_TRUE(spec.control_pipe);
    EXPECT_EQ(spec.env.count(kControlFifoEnv), 0u);
    EXPECT_EQ(spec.env.at(kProgressFileEnv), absl::StrCat(gen, "/progress.rank", r));
  }
}

TEST_F(AgentProtocolTest, SavesGoAsCommandsWithTheWorkersGeneration) {
  v1::CheckpointRequest save;
  save.set_job_id("j");
  EXPECT_EQ(agent_->Checkpoint(save).signalled(), 2);
  save.set_abort_step(true);
  EXPECT_EQ(agent_->Checkpoint(save).signalled(), 2);
  for (int r : {0, 1}) {
    EXPECT_TRUE(Rank(r).signals.empty()) << "the command arrived: no signal";
    ASSERT_EQ(Rank(r).commands.size(), 2u);
    ASSERT_OK_AND_ASSIGN(v1::AgentCommand graceful, ParseAgentCommand(Rank(r).commands[0]));
    EXPECT_TRUE(graceful.has_stop()) << "a graceful save is the worker's stop";
    EXPECT_EQ(graceful.generation(), 4);
    ASSERT_OK_AND_ASSIGN(v1::AgentCommand abort, ParseAgentCommand(Rank(r).commands[1]));
    EXPECT_TRUE(abort.has_checkpoint_now());
  }
}

TEST_F(AgentProtocolTest, AWorkerThatIgnoresTheChannelGetsTheSignal) {
  Rank(1).listens = false;
  v1::CheckpointRequest save;
  save.set_job_id("j");
  EXPECT_EQ(agent_->Checkpoint(save).signalled(), 2);
  save.set_abort_step(true);
  EXPECT_EQ(agent_->Checkpoint(save).signalled(), 2);
  EXPECT_EQ(Rank(0).commands.size(), 2u);
  EXPECT_TRUE(Rank(0).signals.empty());
  EXPECT_TRUE(Rank(1).commands.empty());
  EXPECT_EQ(Rank(1).signals, (std::vector<int>{SIGUSR1, SIGUSR2}));

  // Another generation's save reaches nobody; a stop is still SIGTERM (then SIGKILL).
  save.set_generation(3);
  EXPECT_EQ(agent_->Checkpoint(save).signalled(), 0);
  v1::StopRequest stop;
  stop.set_job_id("j");
  EXPECT_EQ(agent_->Stop(stop).signalled(), 2);
  EXPECT_EQ(Rank(0).signals, std::vector<int>{SIGTERM});
}

TEST_F(AgentProtocolTest, TypedAndFlatLinesReachTheHeartbeat) {
  // varuna-worker's typed lines on rank 0.
  auto line = [](const v1::WorkerEvent& e) { return *SerializeWorkerEvent(e) + "\n"; };
  v1::WorkerEvent ready;
  ready.set_t(10);
  ready.mutable_ready()->set_resumed_from(5);
  v1::WorkerEvent step;
  step.set_t(11);
  step.mutable_step()->set_step(6);
  step.mutable_step()->set_loss(2.25);
  Write(0, line(ready) + line(step));
  v1::WorkerStatus w = Beat(0);
  EXPECT_EQ(w.resumed_from(), 5);
  EXPECT_DOUBLE_EQ(w.ready_at(), 10);
  EXPECT_EQ(w.progress().step(), 6);
  EXPECT_DOUBLE_EQ(w.progress().at(), 11);
  ASSERT_EQ(w.steps_size(), 1);
  EXPECT_DOUBLE_EQ(w.steps(0).loss(), 2.25);

  // A command the worker refuses is logged, not taken for how it ended.
  v1::WorkerEvent refused;
  refused.mutable_error()->set_message("reconfigure is not supported yet");
  refused.mutable_error()->set_command("reconfigure");
  v1::WorkerEvent stopped;
  stopped.mutable_stopped()->set_saved_step(6);
  Write(0, line(refused) + line(stopped));
  w = Beat(0);
  EXPECT_EQ(w.error(), "");
  EXPECT_TRUE(w.progress().stopped());
  EXPECT_EQ(w.saved_step(), 6);

  // A user program's flat lines on rank 1, with bad lines between: skipped, the rest read.
  Write(1, "{\"ready\": true}\nnot json\n{\"step\": 0}\n" +
               std::string(kMaxEventLineBytes + 1, 'x') + "\n" +
               "{\"step\": 3, \"loss\": nan, \"t\": 7}\n{\"rescued\": true, \"saved_step\": 2}\n" +
               "{\"error\": \"lost a peer\"}\n{\"step\": 4");  // half a line: not yet
  w = Beat(1);
  EXPECT_EQ(w.resumed_from(), 0);
  EXPECT_EQ(w.progress().step(), 3);
  EXPECT_TRUE(std::isnan(w.progress().loss()));
  EXPECT_DOUBLE_EQ(w.progress().at(), 7);
  EXPECT_FALSE(w.progress().stopped());
  EXPECT_EQ(w.saved_step(), 2);
  EXPECT_EQ(w.error(), "lost a peer");
  Write(1, ", \"loss\": 1}\n");
  EXPECT_EQ(Beat(1).progress().step(), 4);
}

}  // namespace
}  // namespace varuna

namespace varuna {
namespace {

// Note [Heartbeat budget] (agent/heartbeat_report.cc): a program that writes huge step records
// cannot push a heartbeat past the manager's limit; every record still arrives, once, in order.
TEST_F(AgentProtocolTest, HeartbeatsStayUnderTheBudgetAndEveryStepFollows) {
  std::string stages;
  for (int i = 0; i < 1500; ++i) absl::StrAppend(&stages, i ? "," : "", "0.12345678901234");
  constexpr int kSteps = 150;
  for (int s = 1; s <= kSteps; ++s) {
    Write(0, absl::StrCat(R"({"step": )", s, R"(, "loss": 1, "stage_busy_s": [)", stages,
                          R"(], "stage_wait_s": [)", stages, "]}\n"));
  }
  // The manager is away: nothing is acknowledged, records pile up.
  size_t largest = 0;
  for (int beat = 0; beat < 60; ++beat) {
    const v1::HeartbeatRequest hb = agent_->BuildHeartbeat();
    largest = std::max(largest, hb.ByteSizeLong());
    ASSERT_LE(hb.ByteSizeLong(), kMaxHeartbeatBytes);
    for (const auto& w : hb.workers()) EXPECT_EQ(w.progress().stage_busy_s_size(), 0);
  }
  EXPECT_GT(largest, kMaxHeartbeatBytes / 2);  // the budget, not the input, bounded it
  // The manager is back: every record arrives once, in order, under the budget.
  std::vector<int64_t> seen;
  for (int beat = 0; beat < 100 && static_cast<int>(seen.size()) < kSteps; ++beat) {
    const v1::HeartbeatRequest hb = agent_->BuildHeartbeat();
    ASSERT_LE(hb.ByteSizeLong(), kMaxHeartbeatBytes);
    for (const auto& w : hb.workers()) {
      for (const auto& m : w.steps()) seen.push_back(m.step());
    }
    agent_->OnHeartbeatResponse(v1::HeartbeatResponse());
  }
  ASSERT_EQ(static_cast<int>(seen.size()), kSteps);
  for (int s = 1; s <= kSteps; ++s) EXPECT_EQ(seen[s - 1], s);
}

// Note [Morph in place] (worker/engine/regroup.cc): a survivor adopted into the next generation
// keeps its PID, gets a ReconfigureCommand, and the step records it wrote before the morph
// that the manager has not acknowledged still arrive (the new generation continues after
// them and never reports them again).
TEST_F(AgentProtocolTest, AnAdoptedSurvivorKeepsItsUnacknowledgedSteps) {
  v1::WorkerEvent step;
  step.mutable_step()->set_step(38);
  step.mutable_step()->set_loss(3.5);
  Write(0, *SerializeWorkerEvent(step) + "\n");
  ASSERT_EQ(Beat(0).steps_size(), 1);  // sent, never acknowledged (the generation moved on)

  v1::LaunchRequest next;
  next.set_job_id("j");
  next.set_generation(5);
  next.set_spec_yaml("x: 1");
  next.set_world_size(2);
  next.set_in_place(true);
  next.set_stage_to_rank_map("0,1;");
  next.set_per_replica_batch(4);
  next.set_micro_batch(2);
  next.add_ranks()->set_rank(0);
  next.add_ranks()->set_rank(1);
  v1::InPlaceRank* a = next.add_adopt();
  a->set_old_generation(4);
  a->set_old_rank(0);
  a->set_new_rank(0);
  ASSERT_THAT(agent_->Launch(next).status(), IsOk());
  std::string started;
  for (const auto& [pid, proc] : launcher_.procs_) {
    absl::StrAppend(&started, pid, ": ", absl::StrJoin(proc.spec.argv, " "), "\n");
  }
  ASSERT_EQ(launcher_.procs_.size(), 3u) << started;  // rank 1 fresh; rank 0 stays pid 100
  ASSERT_EQ(Rank(0).commands.size(), 1u);
  ASSERT_OK_AND_ASSIGN(v1::AgentCommand c, ParseAgentCommand(Rank(0).commands[0]));
  EXPECT_EQ(c.reconfigure().generation(), 5);

  const v1::HeartbeatRequest hb = agent_->BuildHeartbeat();
  bool found = false;
  for (const auto& w : hb.workers()) {
    if (w.pid() != 100 || w.generation() != 5) continue;
    found = true;
    ASSERT_EQ(w.steps_size(), 1) << w.DebugString();
    EXPECT_EQ(w.steps(0).step(), 38);
    EXPECT_DOUBLE_EQ(w.steps(0).loss(), 3.5);
  }
  EXPECT_TRUE(found) << hb.DebugString();
}

// A survivor that takes the rank of an older worker which is not adopted (lost, frozen):
// that worker is killed, not forgotten (a frozen one would stay stopped forever).
TEST_F(AgentProtocolTest, AWorkerNotAdoptedIsKilledWhenASurvivorTakesItsRank) {
  v1::LaunchRequest next;
  next.set_job_id("j");
  next.set_generation(5);
  next.set_spec_yaml("x: 1");
  next.set_world_size(1);
  next.set_in_place(true);
  next.set_stage_to_rank_map("0;");
  next.set_per_replica_batch(4);
  next.set_micro_batch(2);
  next.add_ranks()->set_rank(0);
  v1::InPlaceRank* a = next.add_adopt();  // old rank 1 becomes rank 0; old rank 0 is frozen
  a->set_old_generation(4);
  a->set_old_rank(1);
  a->set_new_rank(0);
  ASSERT_THAT(agent_->Launch(next).status(), IsOk());
  EXPECT_EQ(launcher_.procs_.size(), 2u);  // nothing new started
  EXPECT_EQ(Rank(0).signals, std::vector<int>{SIGKILL});
  EXPECT_TRUE(Rank(1).signals.empty());
  ASSERT_EQ(Rank(1).commands.size(), 1u);  // the reconfigure
}

// Which user the agent asks the launcher for (Note [Worker user]).
TEST(AgentWorkerUserTest, TokenUsersOnlyFromTheAllowListAndRootOnlyWhenAllowed) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/agent_user_test_", getpid());
  std::filesystem::remove_all(dir);
  auto launch_as = [&](AgentConfig c, const std::string& token_user,
                       uint32_t uid = 0) -> absl::StatusOr<std::string> {
    c.name = "a";
    c.manager = "127.0.0.1:1";
    c.work_dir = dir;
    c.slots = 1;
    FakeClock clock;
    RecordingLauncher launcher;
    Agent agent(c, &clock, &launcher);
    v1::LaunchRequest launch;
    launch.set_job_id("j");
    launch.set_generation(1);
    launch.set_spec_yaml("x: 1");
    launch.set_world_size(1);
    launch.add_ranks()->set_rank(0);
    launch.set_run_as_user(token_user);
    launch.set_run_as_uid(uid);
    auto r = agent.Launch(launch);
    if (!r.ok()) return r.status();
    const ProcessSpec& spec = launcher.procs_.at(100).spec;
    EXPECT_EQ(spec.owned_paths,
              (std::vector<std::string>{dir + "/jobs/j/gen1", dir + "/jobs/j/gen1/job.yaml"}));
    return spec.user + (spec.allow_root ? " (root allowed)" : "");
  };
  AgentConfig c;
  EXPECT_EQ(launch_as(c, "").value_or("?"), "varuna");
  auto refused = launch_as(c, "bob");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--allowed_worker_users"));
  c.allowed_worker_users = {"bob", "carol"};
  EXPECT_EQ(launch_as(c, "bob").value_or("?"), "bob");
  c.worker_user = "svc";
  EXPECT_EQ(launch_as(c, "").value_or("?"), "svc");
  c.allow_root_workers = true;
  EXPECT_EQ(launch_as(c, "").value_or("?"), " (root allowed)");  // as the agent itself
  EXPECT_EQ(launch_as(c, "carol").value_or("?"), "carol (root allowed)");
  std::filesystem::remove_all(dir);
}

// A tenant's uid (Note [Tenant uids] in common/launch/tenant_uid.cc) wherever the token has
// no user of its own, even with --allow_root_workers; only inside --allowed_worker_uids.
TEST(AgentWorkerUserTest, ATenantRunsAsItsOwnUidOnlyInsideTheAllowedRange) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/agent_uid_test_", getpid());
  std::filesystem::remove_all(dir);
  auto launch_as = [&](AgentConfig c, const std::string& user,
                       uint32_t uid) -> absl::StatusOr<std::string> {
    c.name = "a";
    c.manager = "127.0.0.1:1";
    c.work_dir = dir;
    c.slots = 1;
    FakeClock clock;
    RecordingLauncher launcher;
    Agent agent(c, &clock, &launcher);
    v1::LaunchRequest launch;
    launch.set_job_id("j");
    launch.set_generation(1);
    launch.set_spec_yaml("x: 1");
    launch.set_world_size(1);
    launch.add_ranks()->set_rank(0);
    launch.set_run_as_user(user);
    launch.set_run_as_uid(uid);
    ASSIGN_OR_RETURN(auto r, agent.Launch(launch));
    return launcher.procs_.at(100).spec.user;
  };
  AgentConfig c;
  EXPECT_EQ(launch_as(c, "", 1900000123).value_or("?"), "#1900000123");
  c.allow_root_workers = true;
  EXPECT_EQ(launch_as(c, "", 1900000123).value_or("?"), "#1900000123") << "never root";
  c.allowed_worker_users = {"bob"};
  EXPECT_EQ(launch_as(c, "bob", 0).value_or("?"), "bob") << "a token's user comes first";
  auto outside = launch_as(c, "", 1000);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(outside.status().message()),
              HasSubstr("uid 1000 (the tenant's; not in its --allowed_worker_uids "
                        "1900000000-1900999999"));
  c.allowed_worker_uids = "none";
  EXPECT_EQ(launch_as(c, "", 1900000123).status().code(), absl::StatusCode::kPermissionDenied);
  std::filesystem::remove_all(dir);
}

// Note [Durable step records] in agent/heartbeat_report.cc: acknowledged records stay until the
// manager says they are durable, and go again to a manager of another term.
TEST(HeartbeatReportTest, StepRecordsStayUntilDurableAndGoAgainToANewLeader) {
  HeartbeatReport report("n");
  HeartbeatReport::Steps s;
  for (int step = 1; step <= 5; ++step) {
    v1::StepMetrics m;
    m.set_step(step);
    report.Queue("j", 1, m, &s);
  }
  s.in_flight = 5;                   // one heartbeat carried them all
  report.Acknowledge(&s, 2, false);  // the manager stored them; 1-2 reached etcd
  EXPECT_TRUE(s.pending.empty());
  ASSERT_EQ(s.unconfirmed.size(), 3u);
  EXPECT_EQ(s.unconfirmed.front().step(), 3);
  report.Acknowledge(&s, 3, false);
  EXPECT_EQ(s.unconfirmed.size(), 2u);
  report.Acknowledge(&s, 9, true);  // that leader died: 4 and 5 go to the next one, whatever
                                    // the new one says it holds
  ASSERT_EQ(s.pending.size(), 2u);
  EXPECT_EQ(s.pending.front().step(), 4);
  EXPECT_TRUE(s.unconfirmed.empty());
  EXPECT_FALSE(s.empty());
  s.in_flight = 2;
  report.Acknowledge(&s, 5, false);
  EXPECT_TRUE(s.empty());
}

// Note [Job directories] in agent/agent.cc: what other uids cannot see, and how long it stays.
TEST(AgentJobDirTest, AJobsFilesAreItsOwnAndGoAfterTheRetention) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/agent_jobdir_", getpid());
  std::filesystem::remove_all(dir);
  AgentConfig c;
  c.name = "a";
  c.manager = "127.0.0.1:1";
  c.work_dir = dir;
  c.slots = 1;
  FakeClock clock;
  RecordingLauncher launcher;
  Agent agent(c, &clock, &launcher);
  v1::LaunchRequest launch;
  launch.set_job_id("7");
  launch.set_generation(1);
  launch.set_spec_yaml("env: {SECRET: x}");
  launch.set_world_size(1);
  launch.add_ranks()->set_rank(0);
  ASSERT_THAT(agent.Launch(launch), IsOk());
  const std::string job = dir + "/jobs/7", gen = job + "/gen1";
  auto mode = [](const std::string& p) {
    struct stat st {};
    EXPECT_EQ(lstat(p.c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  };
  EXPECT_EQ(mode(job), 0711u);
  EXPECT_EQ(mode(gen), 0700u);
  EXPECT_EQ(mode(gen + "/job.yaml"), 0600u);
  EXPECT_EQ(mode(job + "/rank0.log"), 0600u);
  EXPECT_EQ(launcher.procs_.at(100).spec.owned_paths,
            (std::vector<std::string>{gen, gen + "/job.yaml"}));

  // Something the job planted: a link out of its directory. The sweep removes the link only.
  const std::string outside = dir + "/outside";
  std::filesystem::create_directories(outside);
  std::ofstream(outside + "/keep") << "x";
  std::filesystem::create_directory_symlink(outside, gen + "/link");
  std::filesystem::create_directories(job + "/gen2/a/b");
  std::ofstream(job + "/gen2/a/b/f") << "y";
  const absl::Time now = absl::Now();
  using Ids = std::vector<std::string>;
  EXPECT_EQ(SweepJobDirs(dir + "/jobs", absl::Hours(24 * 7), now + absl::Hours(24), {}), Ids{});
  EXPECT_EQ(SweepJobDirs(dir + "/jobs", absl::Hours(24 * 7), now + absl::Hours(24 * 8), {"7"}),
            Ids{})
      << "a job with a running worker stays";
  EXPECT_EQ(SweepJobDirs(dir + "/jobs", absl::ZeroDuration(), now + absl::Hours(24 * 800), {}),
            Ids{})
      << "0: never";
  EXPECT_EQ(SweepJobDirs(dir + "/jobs", absl::Hours(24 * 7), now + absl::Hours(24 * 8), {}),
            Ids{"7"});
  EXPECT_FALSE(std::filesystem::exists(job));
  EXPECT_TRUE(std::filesystem::exists(outside + "/keep"));
  std::filesystem::remove_all(dir);
}

// Issue 47's lows: per-job series on an agent went on for ever; they go with the job's
// directory (Agent::ForgetJobsWithoutDirs calls ForgetJob).
TEST(AgentMetricsTest, AJobsSeriesGoWhenItIsForgotten) {
  MetricsRegistry registry;
  AgentMetrics m(registry, 2);
  m.OnWorkerStarted("7", false);
  m.OnWorkerStarted("7", true);
  m.OnWorkerExited("7", 1, 0);
  m.OnWorkerExited("7", 0, 9);
  m.OnWorkerStarted("8", false);
  m.OnWorkerExited("8", 0, 0);
  EXPECT_THAT(registry.Text(), HasSubstr("varuna_agent_worker_restarts_total{job=\"7\"}"));
  m.ForgetJob("7");
  m.ForgetJob("never-here");
  const std::string text = registry.Text();
  EXPECT_EQ(text.find("job=\"7\""), std::string::npos) << text;
  EXPECT_THAT(text, HasSubstr("varuna_agent_worker_starts_total{job=\"8\"} 1"));
  EXPECT_THAT(text, HasSubstr("varuna_agent_worker_exits_total{how=\"ok\",job=\"8\"} 1"));
}

// The wiring: a job's worker exits, its directory outlives the retention, and the sweep takes
// the job's metric series with it.
TEST(AgentJobDirTest, AJobsMetricSeriesGoWithItsDirectory) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/agent_jobseries_", getpid());
  std::filesystem::remove_all(dir);
  AgentConfig c;
  c.name = "a";
  c.manager = "127.0.0.1:1";
  c.work_dir = dir;
  c.slots = 1;
  c.standby_workers = 0;
  c.job_dir_retention = absl::Hours(1);
  FakeClock clock;
  RecordingLauncher launcher;
  Agent agent(c, &clock, &launcher);
  MetricsRegistry registry;
  AgentMetrics metrics(registry, 1);
  agent.set_metrics(&metrics);
  v1::LaunchRequest launch;
  launch.set_job_id("7");
  launch.set_generation(1);
  launch.set_spec_yaml("x: 1");
  launch.set_world_size(1);
  launch.add_ranks()->set_rank(0);
  ASSERT_THAT(agent.Launch(launch), IsOk());
  launcher.exits_.push_back({100, 0, 0});
  agent.Tick();  // reaps it; the directory is young
  EXPECT_THAT(registry.Text(), HasSubstr("varuna_agent_worker_exits_total{how=\"ok\",job=\"7\"}"));
  // The manager releases the exited worker at once: the agent holds nothing of the job but
  // its directory and series when the sweep comes.
  v1::HeartbeatResponse release;
  release.add_release()->set_job_id("7");
  agent.OnHeartbeatResponse(release);
  EXPECT_EQ(agent.BuildHeartbeat().workers_size(), 0);
  // Two hours pass for the directory (its files' times are what the sweep reads).
  const std::string job = dir + "/jobs/7";
  const auto old = std::filesystem::file_time_type::clock::now() - std::chrono::hours(2);
  for (const auto& e : std::filesystem::directory_iterator(job)) {
    std::filesystem::last_write_time(e.path(), old);
  }
  std::filesystem::last_write_time(job, old);
  clock.Advance(absl::Minutes(2));
  agent.Tick();
  EXPECT_FALSE(std::filesystem::exists(job));
  EXPECT_EQ(registry.Text().find("job=\"7\""), std::string::npos) << registry.Text();
  std::filesystem::remove_all(dir);
}

// A tensor-parallel launch: world_size counts processes, the pipelines positions, and each
// worker is told the plan's tp_size (Note [Tensor-parallel placement] in
// manager/nodes/placement.cc).
TEST(AgentTensorParallelTest, WorldCountsProcessesAndWorkersGetTheTpSize) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/agent_tp_", getpid());
  std::filesystem::remove_all(dir);
  AgentConfig c;
  c.name = "a";
  c.manager = "127.0.0.1:1";
  c.work_dir = dir;
  c.slots = 2;
  c.allow_root_workers = true;
  FakeClock clock;
  RecordingLauncher launcher;
  Agent agent(c, &clock, &launcher);
  v1::LaunchRequest launch;
  launch.set_job_id("j");
  launch.set_generation(1);
  launch.set_spec_yaml("x: 1");
  launch.set_world_size(4);
  launch.set_tp_size(2);
  launch.set_pipelines("0,6:8");  // one position: 2 processes, not 4
  launch.add_ranks()->set_rank(0);
  launch.add_ranks()->set_rank(1);
  auto bad = agent.Launch(launch);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("for world size 4"));
  launch.set_pipelines("0,6:4;0,6:4");
  launch.set_tp_size(3);
  EXPECT_THAT(std::string(agent.Launch(launch).status().message()),
              HasSubstr("tp_size 3 does not divide world_size 4"));
  launch.set_tp_size(2);
  ASSERT_THAT(agent.Launch(launch).status(), IsOk());
  ASSERT_EQ(launcher.procs_.size(), 2u);
  for (const auto& [pid, proc] : launcher.procs_) {
    EXPECT_EQ(proc.spec.env.at("WORLD_SIZE"), "4");
    EXPECT_THAT(proc.spec.argv, ::testing::Contains("--tp_size=2"));
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace varuna

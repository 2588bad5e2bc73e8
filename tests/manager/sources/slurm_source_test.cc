// The Slurm source on its own: squeue's JSON (a real 22.05 capture and 23.02's list form),
// the command lines, the policy, and the source's errors, backoff and events with fake
// commands. The real cluster: tests/e2e/slurm_e2e.py.

#include "manager/sources/slurm_source.h"

#include <pwd.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"

namespace varuna {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

std::string ReadTestdata(const std::string& name) {
  std::ifstream in(std::string(VARUNA_SOURCE_DIR) + "/tests/manager/sources/testdata/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

SlurmSourceConfig Config() {
  SlurmSourceConfig c;
  c.partition = "preemptible";
  c.max_nodes = 3;
  c.agent_command = "/opt/varuna/varuna-agent --manager 10.0.0.1:7070 --slots 1";
  c.idle_release = absl::Seconds(60);
  return c;
}

TEST(SqueueJsonTest, ReadsTheJobsOfOneNameFromARealCapture) {
  // Slurm 22.05.8: agent jobs 2-4 running on node1-3, 5 pending (Resources), 6 named "other".
  auto jobs = ParseSqueueJson(ReadTestdata("squeue_22.05.json"), "varuna-agent", "root");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 4u);
  EXPECT_EQ((*jobs)[0].id, 2);
  EXPECT_EQ((*jobs)[0].state, "RUNNING");
  EXPECT_EQ((*jobs)[0].node, "node1");
  EXPECT_EQ((*jobs)[2].node, "node3");
  EXPECT_EQ((*jobs)[3].state, "PENDING");
  EXPECT_EQ((*jobs)[3].reason, "Resources");
  EXPECT_EQ((*jobs)[3].node, "");
  auto other_user = ParseSqueueJson(ReadTestdata("squeue_22.05.json"), "varuna-agent", "alice");
  ASSERT_TRUE(other_user.ok());
  EXPECT_THAT(*other_user, IsEmpty());
}

TEST(SqueueJsonTest, ReadsTheListFormOfNewerSlurm) {
  auto jobs = ParseSqueueJson(
      R"({"jobs": [{"job_id": 7, "name": "a", "user_name": "u", "job_state": ["RUNNING",
          "COMPLETING"], "nodes": "gpu\/3", "state_reason": "None"}], "errors": []})",
      "a", "u");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].state, "RUNNING");
  EXPECT_EQ((*jobs)[0].node, "gpu/3");
}

TEST(SqueueJsonTest, RefusesWhatIsNotItsOutputAndReportsItsErrors) {
  EXPECT_THAT(std::string(ParseSqueueJson("", "a", "").status().message()),
              HasSubstr("no 'jobs' list"));
  EXPECT_FALSE(ParseSqueueJson("{\"jobs\": [", "a", "").ok());
  EXPECT_FALSE(ParseSqueueJson("slurm_load_jobs error: Unable to contact", "a", "").ok());
  // What 22.05 prints, exit status 0, when slurmctld cannot be reached.
  auto err = ParseSqueueJson(
      R"({"errors": [{"description": "Failed while looking for jobs", "error_number": -1,
          "error": "Unspecified error", "source": "slurm_load_jobs"}], "jobs": []})",
      "a", "");
  EXPECT_EQ(err.status().message(),
            "squeue could not read the queue (slurm_load_jobs: Failed while looking for jobs: "
            "Unspecified error): is slurmctld up and reachable?");
  // A job without an id or with a strange shape is skipped, not a crash.
  auto odd =
      ParseSqueueJson(R"({"jobs": [{"name": "a"}, 3, {"name": "a", "job_id": "x"}]})", "a", "");
  ASSERT_TRUE(odd.ok()) << odd.status();
  EXPECT_THAT(*odd, IsEmpty());
}

TEST(SlurmCommandLineTest, AsksForOneExclusiveRequeueableNodeRunningTheAgent) {
  SlurmSourceConfig c = Config();
  c.account = "ml";
  c.qos = "low";
  c.time_limit = "1-00:00:00";
  c.sbatch_args = {"--gres=gpu:8"};
  c.bin_dir = "/opt/slurm/bin";
  const std::string argv = absl::StrJoin(SbatchArgv(c), " | ");
  EXPECT_THAT(argv, HasSubstr("/opt/slurm/bin/sbatch | --parsable | --job-name=varuna-agent | "
                              "--partition=preemptible | --nodes=1 | --ntasks=1 | --exclusive | "
                              "--no-requeue"));
  EXPECT_THAT(argv, HasSubstr("--account=ml | --qos=low | --time=1-00:00:00 | --gres=gpu:8 | "));
  EXPECT_THAT(argv, HasSubstr("--wrap=exec /opt/varuna/varuna-agent --manager 10.0.0.1:7070 "
                              "--slots 1 --name \"$SLURMD_NODENAME\" --slurm_grace_s 30"));
  EXPECT_THAT(SqueueArgv(c, "root"),
              ElementsAre("/opt/slurm/bin/squeue", "--json", "--name=varuna-agent", "--user=root"));
  EXPECT_THAT(ScancelArgv(c, 12), ElementsAre("/opt/slurm/bin/scancel", "12"));
}

TEST(SlurmConfigTest, NamesWhatIsWrong) {
  SlurmSourceConfig c = Config();
  EXPECT_TRUE(c.Validate().ok());
  auto msg = [](SlurmSourceConfig c) { return std::string(c.Validate().message()); };
  c.max_nodes = 0;
  EXPECT_THAT(msg(c), HasSubstr("max_nodes must be >= 1"));
  c = Config();
  c.agent_command = "";
  EXPECT_THAT(msg(c), HasSubstr("agent_command is required"));
  c = Config();
  c.partition = "a b";
  EXPECT_THAT(msg(c), HasSubstr("partition 'a b' may not hold spaces"));
  c = Config();
  c.sbatch_args = {"--wrap=sleep 1"};
  EXPECT_THAT(msg(c), HasSubstr("may not give --wrap"));
  c = Config();
  c.sbatch_args = {"gpu:8"};
  EXPECT_THAT(msg(c), HasSubstr("is not an option"));
  c = Config();
  c.min_nodes = 4;
  EXPECT_THAT(msg(c), HasSubstr("min_nodes <= max_nodes"));
}

SlurmJob Job(int64_t id, const std::string& state, const std::string& node = "",
             const std::string& reason = "None") {
  return SlurmJob{id, state, node, reason};
}

SlurmView::Node Node(const std::string& name, int used, bool alive = true, bool leaving = false) {
  return SlurmView::Node{name, alive, leaving, used};
}

class SlurmPlanTest : public ::testing::Test {
 protected:
  SlurmPlan Plan(const std::vector<SlurmJob>& jobs, std::vector<SlurmView::Node> nodes,
                 int64_t wanted_slots) {
    SlurmView v;
    v.nodes = std::move(nodes);
    v.wanted_slots = wanted_slots;
    return PlanSlurm(config_, jobs, v, &memory_, now_);
  }
  SlurmSourceConfig config_ = Config();
  SlurmMemory memory_;
  absl::Time now_ = absl::FromUnixSeconds(1'800'000'000);
};

TEST_F(SlurmPlanTest, AsksForWhatJobsCanUseUpToMaxNodes) {
  EXPECT_EQ(Plan({}, {}, 0).submit, 0);
  EXPECT_EQ(Plan({}, {}, 2).submit, 2);
  EXPECT_EQ(Plan({}, {}, int64_t{1} << 40).submit, 3);  // unbounded: max_nodes
  config_.slots_per_node = 4;
  EXPECT_EQ(Plan({}, {}, 5).submit, 2);  // 5 slots: two 4-slot nodes
  config_.slots_per_node = 1;
  config_.min_nodes = 1;
  EXPECT_EQ(Plan({}, {}, 0).submit, 1);
  // Queued ones count: nothing more is asked for.
  SlurmPlan p =
      Plan({Job(5, "PENDING", "", "Resources"), Job(6, "RUNNING", "node1")}, {Node("node1", 1)}, 2);
  EXPECT_EQ(p.submit, 0);
  EXPECT_EQ(p.running, 1);
  EXPECT_EQ(p.pending, 1);
  EXPECT_EQ(p.pending_reason, "Resources");
}

TEST_F(SlurmPlanTest, AnAgentJobThatStopsRunningLosesItsNodeUnlessItGaveNotice) {
  Plan({Job(1, "RUNNING", "node1"), Job(2, "RUNNING", "node2"), Job(3, "RUNNING", "node3")},
       {Node("node1", 1), Node("node2", 1), Node("node3", 1)}, 3);
  ASSERT_EQ(memory_.node_job.size(), 3u);
  // Job 1 requeued without a notice (node1 still ALIVE): lost. Job 2 requeued after its
  // agent's notice (node2 leaving): the morph is already under way. Job 3 is gone.
  SlurmPlan p = Plan({Job(1, "PENDING", "", "BeginTime"), Job(2, "PENDING")},
                     {Node("node1", 1), Node("node2", 1, true, true), Node("node3", 1)}, 3);
  EXPECT_THAT(p.lost, ElementsAre(Pair("node1", "its Slurm job 1 is PENDING (BeginTime)"),
                                  Pair("node3", "its Slurm job 3 is gone from the queue")));
  EXPECT_THAT(memory_.node_job, IsEmpty());
  EXPECT_EQ(p.submit, 1);  // two queued (requeued), one more for the third node
  // Completing (perhaps to be requeued): no replacement yet.
  EXPECT_EQ(Plan({Job(1, "PENDING"), Job(2, "PENDING"), Job(3, "COMPLETING")}, {}, 3).submit, 0);
  // A DEAD node is lost already: nothing more to say.
  Plan({Job(4, "RUNNING", "node4")}, {Node("node4", 1)}, 1);
  p = Plan({Job(4, "NODE_FAIL", "node4")}, {Node("node4", 1, /*alive=*/false)}, 1);
  EXPECT_THAT(p.lost, IsEmpty());
}

TEST_F(SlurmPlanTest, GivesBackQueuedThenLongIdleNodesNobodyWants) {
  const std::vector<SlurmJob> jobs = {Job(1, "RUNNING", "node1"), Job(2, "RUNNING", "node2"),
                                      Job(3, "PENDING"), Job(4, "PENDING")};
  // One slot wanted: the two queued jobs go at once, the idle node2 only after idle_release.
  SlurmPlan p = Plan(jobs, {Node("node1", 1), Node("node2", 0)}, 1);
  ASSERT_EQ(p.cancel.size(), 2u);
  EXPECT_EQ(p.cancel[0].first, 4);
  EXPECT_EQ(p.cancel[1].first, 3);
  now_ += absl::Seconds(30);
  p = Plan(jobs, {Node("node1", 1), Node("node2", 0)}, 1);
  EXPECT_EQ(p.cancel.size(), 2u);  // node2 idle 30 s < 60 s
  now_ += absl::Seconds(31);
  p = Plan(jobs, {Node("node1", 1), Node("node2", 0)}, 1);
  ASSERT_EQ(p.cancel.size(), 3u);
  EXPECT_EQ(p.cancel[2].first, 2);
  EXPECT_THAT(p.cancel[2].second, HasSubstr("idle for 1m1s"));
  // Busy again: the idle clock restarts.
  p = Plan(jobs, {Node("node1", 1), Node("node2", 1)}, 1);
  EXPECT_EQ(p.cancel.size(), 2u);
  // Released, then gone from the queue: node2 is forgotten, not lost.
  memory_.released.insert(2);
  p = Plan({Job(1, "RUNNING", "node1"), Job(2, "CANCELLED", "node2")},
           {Node("node1", 1), Node("node2", 0)}, 1);
  EXPECT_THAT(p.lost, IsEmpty());
  EXPECT_THAT(p.forget, ElementsAre("node2"));
}

TEST_F(SlurmPlanTest, WarnsAboutAnAgentJobWhoseAgentNeverRegisters) {
  SlurmPlan p = Plan({Job(1, "RUNNING", "node1")}, {}, 1);
  EXPECT_EQ(p.warning, "");
  now_ += absl::Seconds(61);
  p = Plan({Job(1, "RUNNING", "node1")}, {}, 1);
  EXPECT_THAT(p.warning,
              HasSubstr("agent job 1 has run on node1 for 1m1s but no agent registered"));
  EXPECT_THAT(p.cancel, IsEmpty());  // still wanted: kept
  p = Plan({Job(1, "RUNNING", "node1")}, {}, 0);
  ASSERT_EQ(p.cancel.size(), 1u);  // not wanted: released
}

// Commands answered from a script; posts run at once (the loop and the command thread are
// the test's thread).
class FakeSlurm final : public SlurmCommands {
 public:
  absl::StatusOr<CommandResult> Run(const std::vector<std::string>& argv) override {
    calls.push_back(absl::StrJoin(argv, " "));
    const std::string& prog = argv[0];
    if (absl::EndsWith(prog, "squeue")) return squeue;
    if (absl::EndsWith(prog, "sbatch")) return sbatch;
    return CommandResult{0, "", ""};
  }
  absl::StatusOr<CommandResult> squeue = CommandResult{0, R"({"jobs": []})", ""};
  absl::StatusOr<CommandResult> sbatch = CommandResult{0, "41\n", ""};
  std::vector<std::string> calls;
};

class FakeHost final : public SlurmSource::Host {
 public:
  SlurmView View() override { return view; }
  void LoseNode(const std::string& node, const std::string& why) override {
    lost.push_back(node + ": " + why);
  }
  void ForgetNode(const std::string& node) override { forgotten.push_back(node); }
  void Event(const std::string& kind, const std::string& node,
             const std::string& message) override {
    events.push_back(kind + ": " + message);
  }
  SlurmView view;
  std::vector<std::string> lost, forgotten, events;
};

class SlurmSourceTest : public ::testing::Test {
 protected:
  SlurmSourceTest() {
    config_.poll_period = absl::Seconds(5);
    auto now = [](std::function<void()> fn) { fn(); };
    source_ = std::make_unique<SlurmSource>(config_, &clock_, &slurm_, now, now, &host_);
  }
  SlurmSourceConfig config_ = Config();
  testing::FakeClock clock_;
  FakeSlurm slurm_;
  FakeHost host_;
  std::unique_ptr<SlurmSource> source_;
};

TEST_F(SlurmSourceTest, SlurmDownIsAnErrorOnceThenBackoffThenRecovery) {
  slurm_.squeue = CommandResult{
      1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"};
  host_.view.wanted_slots = 3;
  source_->Tick();
  v1::MachineSource st = source_->Status();
  EXPECT_EQ(st.error(),
            "squeue exited with status 1: slurm_load_jobs error: Unable to contact slurm "
            "controller (connect failure)");
  EXPECT_EQ(st.failures(), 1);
  EXPECT_THAT(host_.events, ElementsAre(HasSubstr("slurm_error: squeue exited")));
  EXPECT_THAT(host_.lost, IsEmpty());  // the nodes it has are left alone
  // Backoff: 10 s after the first failure, 20 s after the second.
  clock_.Advance(absl::Seconds(9));
  source_->Tick();
  EXPECT_EQ(slurm_.calls.size(), 1u);
  clock_.Advance(absl::Seconds(1));
  source_->Tick();
  EXPECT_EQ(slurm_.calls.size(), 2u);
  EXPECT_EQ(source_->Status().failures(), 2);
  EXPECT_EQ(host_.events.size(), 1u);  // the same message is not repeated
  // A timeout (squeue hanging) reads as one too.
  slurm_.squeue = absl::DeadlineExceededError("'squeue --json' did not finish in 30s");
  clock_.Advance(absl::Seconds(20));
  source_->Tick();
  EXPECT_THAT(source_->Status().error(), HasSubstr("did not finish in 30s"));
  // Back: three agent jobs asked for, the error cleared.
  slurm_.squeue = CommandResult{0, R"({"jobs": []})", ""};
  clock_.Advance(absl::Seconds(40));
  source_->Tick();
  st = source_->Status();
  EXPECT_EQ(st.error(), "");
  EXPECT_EQ(st.failures(), 0);
  EXPECT_EQ(st.wanted(), 3);
  EXPECT_EQ(st.pending(), 3);
  EXPECT_THAT(host_.events, ::testing::Contains(HasSubstr("slurm_ok: Slurm answers again")));
  EXPECT_THAT(host_.events,
              ::testing::Contains(HasSubstr("slurm_requested: asked for 3 node(s) on partition "
                                            "preemptible: agent job(s) 41,41,41")));
}

TEST_F(SlurmSourceTest, SbatchRefusedIsNamedAndRetriedLater) {
  slurm_.sbatch = CommandResult{1, "", "sbatch: error: invalid partition specified: preemptible\n"};
  host_.view.wanted_slots = 2;
  source_->Tick();
  EXPECT_EQ(source_->Status().error(),
            "sbatch --partition=preemptible exited with status 1: sbatch: error: invalid "
            "partition specified: preemptible");
  EXPECT_EQ(std::count_if(slurm_.calls.begin(), slurm_.calls.end(),
                          [](const std::string& c) { return absl::StartsWith(c, "sbatch"); }),
            1);  // stops at the first refusal
  slurm_.sbatch = CommandResult{0, "not a number\n", ""};
  clock_.Advance(absl::Seconds(10));
  source_->Tick();
  EXPECT_THAT(source_->Status().error(), HasSubstr("printed 'not a number', not a job id"));
}

TEST_F(SlurmSourceTest, NamesTheAgentJobOfEachNodeAndLosesItWhenSlurmEndsIt) {
  const std::string me = getpwuid(geteuid())->pw_name;
  auto queue = [&](const std::string& state) {
    return CommandResult{0,
                         absl::StrCat(R"({"jobs": [{"job_id": 9, "name": "varuna-agent", )",
                                      R"("user_name": ")", me, R"(", "job_state": ")", state,
                                      R"(", "nodes": "node1", "state_reason": "None"}]})"),
                         ""};
  };
  slurm_.squeue = queue("RUNNING");
  host_.view.nodes = {Node("node1", 1)};
  host_.view.wanted_slots = 1;
  source_->Tick();
  EXPECT_EQ(source_->Status().running(), 1);
  EXPECT_EQ(source_->SourceOf("node1"), "slurm job 9");
  EXPECT_EQ(source_->SourceOf("node2"), "");
  slurm_.squeue = queue("NODE_FAIL");
  clock_.Advance(absl::Seconds(5));
  source_->Tick();
  EXPECT_THAT(host_.lost, ElementsAre("node1: its Slurm job 9 is NODE_FAIL"));
  EXPECT_EQ(source_->SourceOf("node1"), "");
}

}  // namespace
}  // namespace varuna

// The straggler ladder (Note [Straggler ladder] in manager/stragglers/straggler_controller.cc) on
// its own, synchronously: fake clock and agents, step records with chosen per-rank times. The e2e
// (tests/e2e/straggler_e2e.py) runs it with real workers where cgroups can slow a node.

#include "manager/stragglers/straggler_controller.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/manager/controller_fixture.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;

class StragglerControllerTest : public testing::ControllerFixture {
 protected:
  void SetUp() override {
    ControllerFixture::SetUp();
    ladder_ = std::make_unique<StragglerController>(
        config_.straggler_options(), &clock_, jobs_.get(), nodes_.get(), &agents_, loop_.poster(),
        events_.get(), profiles_.get(), morph_.get());
    jobs_ctl_->set_on_steps(
        [this](::varuna::Job& job, const v1::WorkerStatus& w) { ladder_->OnSteps(job, w); });
  }

  // Four one-slot nodes running 4 replicas of one stage (2 samples each), `steps` long.
  std::string RunningJob(const std::string& stragglers, int steps) {
    for (const std::string n : {"a", "b", "c", "d"}) AddNode(n, 1);
    std::string yaml = MorphSpec(absl::StrCat("parallel: {stages: 1}\nstragglers: ", stragglers));
    const std::string train = "train: {global_batch: 8, steps: 20}";
    yaml.replace(yaml.find(train), train.size(),
                 absl::StrCat("train: {global_batch: 8, steps: ", steps, "}"));
    const std::string id = Submit(yaml);
    AnswerLaunches();
    EXPECT_EQ(State(id), v1::RUNNING);
    EXPECT_EQ(Job(id).info().slots(), 4);
    return id;
  }

  // Steps [from, to] as every rank reports them, node `slow`'s rank `factor` times as busy.
  void Steps(const std::string& id, int from, int to, const std::string& slow, double factor) {
    const auto& placement = Job(id).info().placement();
    for (const std::string n : {"a", "b", "c", "d"}) {
      std::vector<v1::WorkerStatus> ws = RanksOn(id, n, true);
      for (auto& w : ws) {
        w.set_resumed_from(0);
        for (int s = from; s <= to; ++s) {
          v1::StepMetrics* m = w.add_steps();
          m->set_step(s);
          m->set_step_time_s(0.1 * factor);
          for (const auto& p : placement) {
            m->add_rank_busy_s(p.node() == slow ? 0.1 * factor : 0.1);
            m->add_rank_wait_s(p.node() == slow ? 0 : 0.1 * (factor - 1));
          }
        }
        w.mutable_progress()->set_step(to);
      }
      Beat(n, ws);
    }
  }

  std::string Events(const std::string& id) {
    v1::ListEventsRequest req;
    req.set_job_id(id);
    std::string out;
    const v1::ListEventsResponse resp = events_->List(req);
    for (const auto& e : resp.events()) out += e.kind() + ": " + e.message() + "\n";
    return out;
  }

  std::unique_ptr<StragglerController> ladder_;
};

// A node at a quarter of its peers' speed on a long job: detected after the window, and the
// simulator's better option runs as a graceful morph of kind straggler with the speeds.
TEST_F(StragglerControllerTest, ASlowNodeOnALongJobIsActedOn) {
  const std::string id = RunningJob("{policy: auto, window_steps: 3}", 5000);
  Steps(id, 1, 2, "d", 4);
  EXPECT_FALSE(Job(id).morphing());  // the window is not full yet
  Steps(id, 3, 3, "d", 4);
  ASSERT_TRUE(Job(id).morphing()) << Events(id);
  const v1::MorphRecord& r = Job(id).rec.morph().record();
  EXPECT_EQ(r.kind(), "straggler");
  EXPECT_TRUE(r.graceful());
  EXPECT_THAT(r.reason(), HasSubstr("node d at 0.25x"));
  bool found = false;
  for (const auto& s : r.speeds()) {
    if (s.node() == "d") {
      found = true;
      EXPECT_NEAR(s.speed(), 0.25, 1e-9);
    }
  }
  EXPECT_TRUE(found) << r.DebugString();
  const v1::StragglerState& st = Job(id).rec.stragglers();
  if (absl::StrContains(r.reason(), "evict")) {
    ASSERT_EQ(st.evicted_size(), 1);
    EXPECT_EQ(st.evicted(0).node(), "d");
    EXPECT_GT(st.evicted(0).probe_after(), 0);
    EXPECT_THAT(Job(id).rec.morph().lost_nodes(), ::testing::Contains("d"));
  } else {
    ASSERT_EQ(st.speeds_size(), 1) << r.reason();
    EXPECT_EQ(st.speeds(0).node(), "d");
  }
  EXPECT_THAT(Events(id), HasSubstr("straggler_action"));
  // varunactl nodes: d's speed and why.
  std::vector<v1::NodeInfo> nodes(1);
  nodes[0].set_name("d");
  ladder_->Annotate(&nodes);
  EXPECT_NEAR(nodes[0].relative_speed(), 0.25, 1e-9);
  EXPECT_THAT(nodes[0].speed_note(), HasSubstr("job " + id));
}

// The same node on a job with few steps left: moving costs more than it saves; tolerated,
// once, with the predictions in the event.
TEST_F(StragglerControllerTest, AMorphThatDoesNotPayIsNotMade) {
  const std::string id = RunningJob("{policy: auto, window_steps: 3}", 8);
  Steps(id, 1, 6, "d", 4);
  EXPECT_FALSE(Job(id).morphing());
  const std::string events = Events(id);
  EXPECT_THAT(events, HasSubstr("straggler_tolerated"));
  EXPECT_THAT(events, HasSubstr("a morph costs"));
}

// Policy report: the event only (Varuna's behaviour).
TEST_F(StragglerControllerTest, ReportOnlyReports) {
  const std::string id = RunningJob("{policy: report, window_steps: 3}", 5000);
  Steps(id, 1, 6, "d", 4);
  EXPECT_FALSE(Job(id).morphing());
  EXPECT_THAT(Events(id), HasSubstr("policy report: no action"));
}

// A node a little slower than its peers (0.83x, above slow_below 0.7): nothing at all.
TEST_F(StragglerControllerTest, ALittleSlowIsNoStraggler) {
  const std::string id = RunningJob("{policy: auto, window_steps: 3}", 5000);
  Steps(id, 1, 6, "c", 1.2);
  EXPECT_FALSE(Job(id).morphing());
  EXPECT_THAT(Events(id), ::testing::Not(HasSubstr("straggler")));
}

}  // namespace
}  // namespace varuna

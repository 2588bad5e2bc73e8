// Note [Series from the start] in manager/state/manager_metrics.cc: a job's series exist at 0 from
// its submission, and values a peer made up cannot poison a histogram.

#include "manager/state/manager_metrics.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ManagerMetricsTest, AJobsCountersExistAtZeroFromItsStart) {
  MetricsRegistry registry;
  ManagerMetrics m(registry);
  m.AddJob("7");
  m.AddJob("7");  // idempotent
  const std::string text = registry.Text();
  EXPECT_THAT(text, HasSubstr("varuna_morphs_total{job=\"7\",reason=\"lost\"} 0"));
  EXPECT_THAT(text, HasSubstr("varuna_morphs_total{job=\"7\",reason=\"notice\"} 0"));
  EXPECT_THAT(text, HasSubstr("varuna_job_step_seconds_count{job=\"7\"} 0"));
  EXPECT_THAT(text, HasSubstr("varuna_morph_phase_seconds_count{job=\"7\",phase=\"save\"} 0"));
  v1::MorphRecord morph;
  morph.set_reason("node n1 lost");
  m.OnMorph("7", morph);
  EXPECT_THAT(registry.Text(), HasSubstr("varuna_morphs_total{job=\"7\",reason=\"lost\"} 1"));
  m.ForgetJob("7");
  EXPECT_THAT(registry.Text(), Not(HasSubstr("job=\"7\"")));
}

// Sharing: each job's slots and each user's sum; a user whose jobs ended drops to 0, and a
// forgotten job's series go.
TEST(ManagerMetricsTest, AllocationsByJobAndUser) {
  MetricsRegistry registry;
  ManagerMetrics m(registry);
  m.AddJob("7");
  m.SetAllocations({{"7", 4}, {"8", 2}}, {{"alice", 4}, {"", 2}});
  std::string text = registry.Text();
  EXPECT_THAT(text, HasSubstr("varuna_job_allocated_slots{job=\"7\"} 4"));
  EXPECT_THAT(text, HasSubstr("varuna_user_allocated_slots{user=\"alice\"} 4"));
  EXPECT_THAT(text, HasSubstr("varuna_user_allocated_slots{user=\"-\"} 2"));
  m.SetAllocations({{"7", 0}}, {});
  text = registry.Text();
  EXPECT_THAT(text, HasSubstr("varuna_user_allocated_slots{user=\"alice\"} 0"));
  EXPECT_THAT(text, HasSubstr("varuna_job_allocated_slots{job=\"7\"} 0"));
  v1::MorphRecord resize;
  resize.set_kind("resize");
  EXPECT_EQ(ManagerMetrics::ReasonKind(resize), "resize");
  m.ForgetJob("7");
  EXPECT_THAT(registry.Text(), Not(HasSubstr("job=\"7\"")));
}

// A record's kind is its label; a record from before kinds is labelled from its reason text.
TEST(ManagerMetricsTest, EveryTriggersReasonHasItsLabel) {
  const std::pair<const char*, const char*> cases[] = {
      {"node node2 lost (no heartbeat for 4s; it ran ranks 4,5)", "lost"},
      {"rank 1 on node node0 lost a peer: step 20 failed", "lost"},
      {"preemption notice for node node1 (varunactl) (gone in 29s)", "notice"},
      {"node node1 drained by request", "drain"},
      {"node(s) node2 joined: 6 slots available (running on 4)", "join"},
      {"rank 3 on node node1 was killed by SIGKILL", "failed"},
      {"rank 2 on node node1 is stopped (frozen)", "failed"},
      {"rank 0 on node node0 exited with code 1", "failed"},
  };
  for (const auto& [reason, label] : cases) {
    v1::MorphRecord morph;
    morph.set_reason(reason);
    EXPECT_EQ(ManagerMetrics::ReasonKind(morph), label) << reason;
  }
  v1::MorphRecord morph;
  morph.set_reason("node n1 at 0.25x its peers' speed: rebalance");
  morph.set_kind("straggler");
  EXPECT_EQ(ManagerMetrics::ReasonKind(morph), "straggler");
  morph.set_kind("recovered");
  EXPECT_EQ(ManagerMetrics::ReasonKind(morph), "recovered");
  morph.set_kind("no such kind");
  EXPECT_EQ(ManagerMetrics::ReasonKind(morph), "other");
}

TEST(ManagerMetricsTest, NodeSpeedsFollowTheJob) {
  MetricsRegistry registry;
  ManagerMetrics m(registry);
  m.AddJob("7");
  m.SetNodeSpeeds("7", {{"a", 1.0}, {"b", 0.25}});
  EXPECT_THAT(registry.Text(), HasSubstr("varuna_node_relative_speed{job=\"7\",node=\"b\"} 0.25"));
  m.SetNodeSpeeds("7", {{"a", 1.0}});  // b left the job
  EXPECT_THAT(registry.Text(), Not(HasSubstr("node=\"b\"")));
  m.ForgetJob("7");
  EXPECT_THAT(registry.Text(), Not(HasSubstr("varuna_node_relative_speed{")));
}

TEST(ManagerMetricsTest, AbsurdValuesDoNotPoisonHistograms) {
  MetricsRegistry registry;
  ManagerMetrics m(registry);
  m.AddJob("j");
  std::vector<v1::StepRecord> steps(4);
  const double bad[] = {std::nan(""), 1e300, -5, 0.5};
  for (int i = 0; i < 4; ++i) {
    steps[i].set_step(i + 1);
    steps[i].set_step_time_s(bad[i]);
  }
  m.OnSteps("j", steps);
  m.OnHeartbeat("n", std::numeric_limits<double>::infinity());
  m.OnHeartbeat("n", 0.002);
  v1::MorphRecord morph;
  morph.set_reason("drained");
  (*morph.mutable_phases())["save"] = std::nan("");
  (*morph.mutable_phases())["stop"] = 1.5;
  m.OnMorph("j", morph);
  const std::string text = registry.Text();
  EXPECT_THAT(text, HasSubstr("varuna_job_step_seconds_count{job=\"j\"} 1"));
  EXPECT_THAT(text, HasSubstr("varuna_job_step_seconds_sum{job=\"j\"} 0.5"));
  EXPECT_THAT(text, HasSubstr("varuna_heartbeat_latency_seconds_count{node=\"n\"} 1"));
  EXPECT_THAT(text, HasSubstr("varuna_morph_phase_seconds_count{job=\"j\",phase=\"save\"} 0"));
  EXPECT_THAT(text, HasSubstr("varuna_morph_phase_seconds_sum{job=\"j\",phase=\"stop\"} 1.5"));
  EXPECT_THAT(text, Not(HasSubstr("nan")));
  EXPECT_THAT(text, Not(HasSubstr("inf\n")));
}

TEST(ManagerMetricsTest, TheStepGaugeFollowsTheNewestGenerationNotLateReports) {
  MetricsRegistry registry;
  ManagerMetrics m(registry);
  m.AddJob("j");
  auto at = [](int generation, int step) {
    v1::StepRecord r;
    r.set_generation(generation);
    r.set_step(step);
    r.set_loss(step);
    return std::vector<v1::StepRecord>{r};
  };
  m.OnSteps("j", at(1, 29));
  EXPECT_THAT(registry.Text(), HasSubstr("varuna_job_step{job=\"j\"} 29"));
  m.OnSteps("j", at(2, 26));  // a morph rewound to 25: the re-run steps show
  EXPECT_THAT(registry.Text(), HasSubstr("varuna_job_step{job=\"j\"} 26"));
  m.OnSteps("j", at(2, 40));
  m.OnSteps("j", at(1, 30));  // an older generation's backlog, delivered late
  EXPECT_THAT(registry.Text(), HasSubstr("varuna_job_step{job=\"j\"} 40"));
  EXPECT_THAT(registry.Text(), HasSubstr("varuna_job_loss{job=\"j\"} 40"));
}

}  // namespace
}  // namespace varuna

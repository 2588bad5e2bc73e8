// Straggler detection (Note [Straggler detection] in manager/stragglers/straggler_detector.cc) on
// synthetic step times.

#include "manager/stragglers/straggler_detector.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/planner/profile.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

RankWork Rank(const std::string& node, int pipeline, int stage, int first, int end, double work) {
  RankWork w;
  w.node = node;
  w.pipeline = pipeline;
  w.stage = stage;
  w.first_segment = first;
  w.end_segment = end;
  w.work = work;
  return w;
}

// Three data-parallel replicas on three nodes: c computes at a quarter of the others' speed.
TEST(StragglerDetectorTest, FindsTheSlowReplicaAfterAWindow) {
  StragglerDetector d(
      {Rank("a", 0, 0, 0, 6, 1), Rank("b", 1, 0, 0, 6, 1), Rank("c", 2, 0, 0, 6, 1)}, 3);
  EXPECT_TRUE(d.Add(1, {1.0, 1.1, 4.0}, {3.0, 2.9, 0}));
  EXPECT_TRUE(d.Add(2, {1.0, 1.0, 4.2}, {3.2, 3.2, 0}));
  EXPECT_FALSE(d.full());
  EXPECT_TRUE(d.Add(3, {0.9, 1.0, 3.9}, {3.0, 2.9, 0}));
  ASSERT_TRUE(d.full());
  auto speeds = d.Speeds();
  EXPECT_NEAR(speeds["c"], 0.25, 0.02);
  EXPECT_NEAR(speeds["a"], 1.0, 0.15);  // its wait for c is not slowness
  EXPECT_NEAR(speeds["b"], 1.0, 0.15);
  EXPECT_THAT(d.SlowLinks(0.8), IsEmpty());  // a and b wait on c's compute: no neighbours
}

// One slow step is noise, not a straggler: the window's median ignores it.
TEST(StragglerDetectorTest, OneNoisyStepIsNotAStraggler) {
  StragglerDetector d(
      {Rank("a", 0, 0, 0, 6, 1), Rank("b", 1, 0, 0, 6, 1), Rank("c", 2, 0, 0, 6, 1)}, 5);
  for (int s = 1; s <= 5; ++s) {
    ASSERT_TRUE(d.Add(s, {1.0, 1.0, s == 3 ? 5.0 : 1.05}, {0, 0, 0}));
  }
  EXPECT_GT(d.Speeds()["c"], 0.9);
}

// A large slowdown is known from two steps, not half a window; one such step is still noise.
TEST(StragglerDetectorTest, TwoStepsAtALargeSlowdownAreEnough) {
  StragglerDetector d(
      {Rank("a", 0, 0, 0, 6, 1), Rank("b", 1, 0, 0, 6, 1), Rank("c", 2, 0, 0, 6, 1)}, 5);
  for (int s = 1; s <= 5; ++s) ASSERT_TRUE(d.Add(s, {1.0, 1.0, 1.0}, {0, 0, 0}));
  ASSERT_TRUE(d.Add(6, {1.0, 1.0, 10.0}, {9, 9, 0}));
  EXPECT_NEAR(d.Speeds(0.35)["c"], 1.0, 1e-9);  // one step: noise
  ASSERT_TRUE(d.Add(7, {1.0, 1.0, 8.0}, {7, 7, 0}));
  EXPECT_NEAR(d.Speeds(0.35)["c"], 0.125, 1e-9);  // the faster of the two
  EXPECT_NEAR(d.Speeds()["c"], 1.0, 1e-9);        // without the rule: still the median
  // A moderate slowdown (above severe_below) waits for the window's median.
  StragglerDetector m(
      {Rank("a", 0, 0, 0, 6, 1), Rank("b", 1, 0, 0, 6, 1), Rank("c", 2, 0, 0, 6, 1)}, 5);
  for (int s = 1; s <= 5; ++s) ASSERT_TRUE(m.Add(s, {1.0, 1.0, 1.0}, {0, 0, 0}));
  ASSERT_TRUE(m.Add(6, {1.0, 1.0, 2.0}, {1, 1, 0}));
  ASSERT_TRUE(m.Add(7, {1.0, 1.0, 2.0}, {1, 1, 0}));
  EXPECT_NEAR(m.Speeds(0.35)["c"], 1.0, 1e-9);
  ASSERT_TRUE(m.Add(8, {1.0, 1.0, 2.0}, {1, 1, 0}));
  EXPECT_NEAR(m.Speeds(0.35)["c"], 0.5, 1e-9);
}

// Ranks holding different layers are compared by their expected work: a stage with twice the
// work and twice the busy time is as fast as its peers.
TEST(StragglerDetectorTest, NormalisesByExpectedWork) {
  StragglerDetector d(
      {Rank("a", 0, 0, 0, 2, 1), Rank("b", 0, 1, 2, 6, 2), Rank("c", 0, 2, 6, 8, 1)}, 2);
  ASSERT_TRUE(d.Add(1, {1.0, 2.0, 1.0}, {0, 0.1, 0.2}));
  ASSERT_TRUE(d.Add(2, {1.0, 2.0, 1.0}, {0, 0.1, 0.2}));
  for (const auto& [node, speed] : d.Speeds()) EXPECT_NEAR(speed, 1.0, 1e-9) << node;
}

// (Note [Planned-slow references] in straggler_detector.cc) After a rebalance gave b a small share,
// b runs it in bursts and reads fast; compared with b, a (now fully busy) would read slow and be
// rebalanced in its turn. A planned-slow node is nobody's reference: a has no reading, b is
// measured against a.
TEST(StragglerDetectorTest, APlannedSlowNodeIsNobodysReference) {
  const std::vector<RankWork> ranks = {Rank("a", 0, 0, 0, 3, 11), Rank("a", 0, 1, 3, 6, 11),
                                       Rank("b", 1, 0, 0, 3, 1), Rank("b", 1, 1, 3, 6, 1)};
  StragglerDetector unaware(ranks, 2);
  StragglerDetector aware(ranks, 2, {"b"});
  for (int s = 1; s <= 2; ++s) {
    const std::vector<double> busy = {16.5, 16.5, 1.0, 1.0}, wait = {0.5, 0.5, 16, 16};
    ASSERT_TRUE(unaware.Add(s, busy, wait));
    ASSERT_TRUE(aware.Add(s, busy, wait));
  }
  EXPECT_NEAR(unaware.Speeds()["a"], 2.0 / 3, 1e-9);
  const auto speeds = aware.Speeds();
  EXPECT_EQ(speeds.count("a"), 0u);
  ASSERT_EQ(speeds.count("b"), 1u);
  EXPECT_NEAR(speeds.at("b"), 1.0, 1e-9);  // its recovery is still seen (with probation)
}

// A rank of normal speed that waits far longer than its same-layer peer for its neighbour on
// another node: a slow link, reported with the neighbour's node.
TEST(StragglerDetectorTest, ReportsASlowLink) {
  // Two pipelines of two stages: a->b and c->d; the link into d is slow.
  StragglerDetector d({Rank("a", 0, 0, 0, 3, 1), Rank("b", 0, 1, 3, 6, 1), Rank("c", 1, 0, 0, 3, 1),
                       Rank("d", 1, 1, 3, 6, 1)},
                      3);
  for (int s = 1; s <= 3; ++s) ASSERT_TRUE(d.Add(s, {1, 1, 1, 1}, {0.1, 0.2, 0.1, 1.5}));
  const std::vector<std::string> links = d.SlowLinks(0.8);
  ASSERT_EQ(links.size(), 1u);
  EXPECT_THAT(links[0], HasSubstr("rank 3 (node d)"));
  EXPECT_THAT(links[0], HasSubstr("on node c"));
  for (const auto& [node, speed] : d.Speeds()) EXPECT_NEAR(speed, 1.0, 1e-9) << node;
}

TEST(StragglerDetectorTest, RepeatedAndMalformedStepsAreIgnored) {
  StragglerDetector d({Rank("a", 0, 0, 0, 6, 1), Rank("b", 1, 0, 0, 6, 1)}, 2);
  EXPECT_TRUE(d.Add(5, {1, 1}, {0, 0}));
  EXPECT_FALSE(d.Add(5, {1, 9}, {0, 0}));     // seen (another node's report)
  EXPECT_FALSE(d.Add(4, {1, 9}, {0, 0}));     // older
  EXPECT_FALSE(d.Add(6, {1, 9, 1}, {0, 0}));  // another world
  EXPECT_FALSE(d.Add(7, {}, {}));             // a worker without per-rank times
  EXPECT_EQ(d.steps(), 1);
  EXPECT_TRUE(d.Add(8, {1, std::nan("")}, {0, 0}));  // a NaN is no measurement
  EXPECT_EQ(d.Speeds().size(), 2u);
}

// The ranks of a placed job: each rank's node and layers, work in proportion to its layers
// and micro-batches.
TEST(StragglerDetectorTest, RanksOfAPlacedJob) {
  JobSpec spec;
  spec.model.kind = "gpt";
  spec.model.layers = 4;
  spec.train.global_batch = 12;
  ASSERT_OK_AND_ASSIGN(v1::Profile profile, BuiltinProfile(spec));
  v1::JobInfo info;
  info.set_stages(1);
  info.set_replicas(3);
  info.set_micro_batch(2);
  info.set_schedule("varuna");
  info.set_pipelines("0,6:8;0,6:2;0,6:2");  // a rebalanced job
  for (int r = 0; r < 3; ++r) {
    v1::RankPlacement* p = info.add_placement();
    p->set_rank(r);
    p->set_node(std::string(1, static_cast<char>('a' + r)));
  }
  ASSERT_OK_AND_ASSIGN(std::vector<RankWork> ranks, RanksOf(info, profile, 12));
  ASSERT_EQ(ranks.size(), 3u);
  EXPECT_EQ(ranks[2].node, "c");
  EXPECT_EQ(ranks[0].end_segment, 6);
  EXPECT_NEAR(ranks[0].work / ranks[1].work, 4, 1e-9);
  info.clear_placement();
  EXPECT_THAT(RanksOf(info, profile, 12),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition, "not placed"));
}

}  // namespace
}  // namespace varuna

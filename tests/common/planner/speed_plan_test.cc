// Speed-aware plans (Note [Speed-aware plans] in common/planner/speed_plan.cc): the planner
// with nodes slower than their peers.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/pipeline/topology.h"
#include "common/planner/autoconfig.h"
#include "common/planner/profile.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

JobSpec Gpt(int layers, int64_t global_batch) {
  JobSpec spec;
  spec.model.kind = "gpt";
  spec.model.layers = layers;
  spec.train.global_batch = global_batch;
  spec.parallel.micro_batch = 1;
  spec.parallel.schedule = "1f1b";
  return spec;
}

// Every segment costs the same (1 ms forward, 2 ms backward per sample); links nearly free.
v1::Profile Even(const JobSpec& spec) {
  v1::Profile p = *BuiltinProfile(spec);
  for (auto& seg : *p.mutable_segments()) {
    seg.set_param_bytes(1000);
    seg.set_optimizer_s(1e-5);
    for (auto& c : *seg.mutable_costs()) {
      const double mb = c.micro_batch();
      c.set_forward_s(1e-3 * mb);
      c.set_forward_nograd_s(1e-3 * mb);
      c.set_recompute_s(1e-3 * mb);
      c.set_backward_s(2e-3 * mb);
      c.set_activation_bytes(100 * mb);
      c.set_graph_bytes(1000 * mb);
      c.set_peak_bytes(2000 * mb);
    }
  }
  p.set_tied_bytes(0);
  p.set_step_overhead_s(0);
  return p;
}

// Three one-slot nodes, data parallel: a node at a quarter of the speed sets the pace of a
// uniform split; the balanced plan gives it a smaller share, and beats leaving it out.
TEST(SpeedPlanTest, DataParallelGivesTheSlowNodeASmallerShare) {
  JobSpec spec = Gpt(4, 12);
  spec.parallel.stages = 1;
  const v1::Profile profile = Even(spec);
  PlanRequest even;
  even.slots_per_node = {1, 1, 1};
  ASSERT_OK_AND_ASSIGN(v1::PlanSet normal, PlanShapes(spec, profile, even));
  PlanRequest slow = even;
  slow.node_speed = {1, 1, 0.25};
  ASSERT_OK_AND_ASSIGN(v1::PlanSet uniform, PlanShapes(spec, profile, slow));  // no balancing
  ASSERT_GT(uniform.plans_size(), 0);
  EXPECT_FALSE(uniform.plans(0).heterogeneous());
  // 4 micro-batches each: the slow replica takes 4x as long.
  EXPECT_NEAR(uniform.plans(0).step_s() / normal.plans(0).step_s(), 4, 0.3);
  slow.heterogeneous = true;
  ASSERT_OK_AND_ASSIGN(v1::PlanSet balanced, PlanShapes(spec, profile, slow));
  const v1::Plan& best = balanced.plans(0);
  ASSERT_TRUE(best.heterogeneous()) << best.DebugString();
  ASSERT_OK_AND_ASSIGN(Topology topo, Topology::Parse(best.topology()));
  ASSERT_EQ(topo.num_pipelines(), 3);
  // 6, 5 and 1 samples: the fast ones end at 6 and 5 micro-batches, the slow one at 1 x 4.
  EXPECT_EQ(topo.pipeline(2).samples, 1) << best.topology();
  EXPECT_EQ(topo.pipeline(0).samples + topo.pipeline(1).samples, 11);
  EXPECT_LT(best.step_s(), uniform.plans(0).step_s() / 2);
  // Without the slow node: 6 micro-batches each on two nodes, slower than the balanced plan.
  PlanRequest two;
  two.slots_per_node = {1, 1};
  ASSERT_OK_AND_ASSIGN(v1::PlanSet without, PlanShapes(spec, profile, two));
  EXPECT_LE(best.step_s(), without.plans(0).step_s() * 1.01);
}

// One pipeline over three nodes, the middle one at half speed: its stage gets fewer layers.
TEST(SpeedPlanTest, PipelineGivesTheSlowStageFewerLayers) {
  JobSpec spec = Gpt(10, 8);  // 12 segments
  spec.parallel.stages = 3;
  spec.parallel.replicas = 1;
  const v1::Profile profile = Even(spec);
  PlanRequest req;
  req.slots_per_node = {1, 1, 1};
  req.node_speed = {1, 0.5, 1};
  req.heterogeneous = true;
  ASSERT_OK_AND_ASSIGN(v1::PlanSet set, PlanShapes(spec, profile, req));
  const v1::Plan& best = set.plans(0);
  ASSERT_TRUE(best.heterogeneous()) << best.DebugString();
  ASSERT_OK_AND_ASSIGN(Topology topo, Topology::Parse(best.topology()));
  const std::vector<int>& b = topo.pipeline(0).boundaries;
  ASSERT_EQ(b.size(), 4u);
  EXPECT_LT(b[2] - b[1], b[1] - b[0]) << best.topology();
  EXPECT_LT(b[2] - b[1], b[3] - b[2]) << best.topology();
  // It beats the even cut with the same speeds.
  double uniform = 0;
  for (const auto& p : set.plans()) {
    if (!p.heterogeneous()) uniform = p.step_s();
  }
  ASSERT_GT(uniform, 0);
  EXPECT_LT(best.step_s(), uniform * 0.9);
}

// SimulateTopology predicts a placed topology: the same as the planner's plan at speed 1,
// slower with a slow node, and bad placements are errors.
TEST(SpeedPlanTest, SimulateTopologyOfAPlacedJob) {
  JobSpec spec = Gpt(4, 12);
  spec.parallel.stages = 1;
  const v1::Profile profile = Even(spec);
  PlanRequest req;
  req.slots_per_node = {1, 1, 1};
  ASSERT_OK_AND_ASSIGN(v1::PlanSet set, PlanShapes(spec, profile, req));
  ASSERT_OK_AND_ASSIGN(Topology topo, Topology::Uniform(1, 3, 12));
  ASSERT_TRUE(topo.SetUniformBoundaries({0, profile.segments_size()}).ok());
  ASSERT_OK_AND_ASSIGN(v1::Plan now, SimulateTopology(spec, profile, topo, 1, SchedulePolicy::k1F1B,
                                                      {0, 1, 2}, req));
  EXPECT_NEAR(now.step_s(), set.plans(0).step_s(), 1e-9);
  req.node_speed = {1, 1, 0.5};
  ASSERT_OK_AND_ASSIGN(v1::Plan slow, SimulateTopology(spec, profile, topo, 1,
                                                       SchedulePolicy::k1F1B, {0, 1, 2}, req));
  EXPECT_NEAR(slow.step_s() / now.step_s(), 2, 0.1);
  EXPECT_THAT(SimulateTopology(spec, profile, topo, 1, SchedulePolicy::k1F1B, {0, 1}, req),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(SimulateTopology(spec, profile, topo, 1, SchedulePolicy::k1F1B, {0, 1, 7}, req),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ""));
}

}  // namespace
}  // namespace varuna

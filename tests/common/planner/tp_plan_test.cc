// AutoConfig for tensor-parallel jobs (Note [Tensor-parallel plans] in tp_plan.cc).

#include "common/planner/tp_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "common/planner/profile.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;
using ::varuna::testing::StatusIs;

JobSpec TpGpt(int tp) {
  JobSpec spec;
  spec.model.kind = "gpt";
  spec.model.layers = 4;
  spec.model.d_model = 128;
  spec.model.heads = 4;
  spec.train.global_batch = 16;
  spec.parallel.tp_size = tp;
  return spec;
}

TEST(TensorParallelProfileTest, BlocksSplitAndPayTheirAllReduces) {
  const JobSpec spec = TpGpt(2);
  ASSERT_OK_AND_ASSIGN(v1::Profile one, BuiltinProfile(spec));
  ASSERT_OK_AND_ASSIGN(v1::Profile two, TensorParallelProfile(one, spec.model, 2));
  ASSERT_EQ(two.segments_size(), one.segments_size());
  const CommModel comm(one);
  const int last = one.segments_size() - 1;
  for (int i = 0; i <= last; ++i) {
    const auto& a = one.segments(i);
    const auto& b = two.segments(i);
    const bool block = i > 0 && i < last;
    EXPECT_DOUBLE_EQ(b.param_bytes(), block ? a.param_bytes() / 2 : a.param_bytes()) << i;
    for (int c = 0; c < a.costs_size(); ++c) {
      const auto& x = a.costs(c);
      const auto& y = b.costs(c);
      // gpt: two all-reduces (attention, MLP) of the block's output per pass.
      const double ar = block ? 2 * comm.AllReduce(x.activation_bytes(), 2, false) : 0;
      const double div = block ? 2 : 1;
      EXPECT_DOUBLE_EQ(y.forward_s(), x.forward_s() / div + ar) << i;
      EXPECT_DOUBLE_EQ(y.recompute_s(), x.recompute_s() / div + ar) << i;
      EXPECT_DOUBLE_EQ(y.backward_s(), x.backward_s() / div + ar) << i;
      EXPECT_DOUBLE_EQ(y.weight_s(), x.weight_s() / div) << i;
      EXPECT_DOUBLE_EQ(y.graph_bytes(), x.graph_bytes()) << i;  // kept whole: an over-estimate
    }
  }
  // tp 1 is the profile itself; a size the model cannot split is refused with its numbers.
  ASSERT_OK_AND_ASSIGN(v1::Profile same, TensorParallelProfile(one, spec.model, 1));
  EXPECT_EQ(same.SerializeAsString(), one.SerializeAsString());
  EXPECT_THAT(TensorParallelProfile(one, spec.model, 3).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "parallel.tp_size = 3 does not divide model.heads = 4"));
}

TEST(TensorParallelProfileTest, MlpBlocksPayOneAllReduce) {
  JobSpec spec = TpGpt(2);
  spec.model.kind = "mlp";
  ASSERT_OK_AND_ASSIGN(v1::Profile one, BuiltinProfile(spec));
  ASSERT_OK_AND_ASSIGN(v1::Profile two, TensorParallelProfile(one, spec.model, 2));
  const auto& x = one.segments(1).costs(0);
  EXPECT_DOUBLE_EQ(two.segments(1).costs(0).forward_s(),
                   x.forward_s() / 2 + CommModel(one).AllReduce(x.activation_bytes(), 2, false));
}

TEST(TensorParallelPlanTest, PlansWholeGroupsOnOneNode) {
  const JobSpec spec = TpGpt(2);
  ASSERT_OK_AND_ASSIGN(v1::Profile p, BuiltinProfile(spec));
  EXPECT_EQ(TensorParallelUnits({4, 3, 1, 0}, 2), (std::vector<int>{2, 1, 0, 0}));
  // Nodes of 4, 3 and 1 free slots hold 2 + 1 groups of two.
  ASSERT_OK_AND_ASSIGN(v1::PlanSet set, PlanShapes(spec, p, {{4, 3, 1}}));
  ASSERT_GT(set.plans_size(), 0);
  for (const v1::Plan& plan : set.plans()) {
    EXPECT_EQ(plan.tp_size(), 2);
    EXPECT_LE(plan.stages() * plan.replicas(), 3);
    if (!plan.heterogeneous()) EXPECT_EQ(plan.slots(), plan.stages() * plan.replicas() * 2);
  }
  EXPECT_THAT(set.notes(), ::testing::Contains(HasSubstr("tensor parallel: 2 ranks")));
  // A group never spans nodes: eight single slots hold none.
  EXPECT_THAT(PlanShapes(spec, p, {{1, 1, 1, 1, 1, 1, 1, 1}}).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "parallel.tp_size = 2 needs 2 free slots on one node; the most free on "
                       "one node is 1"));
  // resources.min_slots counts processes: 8 slots are 4 groups, and 3 groups are too few.
  JobSpec big = spec;
  big.resources.min_slots = 8;
  EXPECT_THAT(PlanShapes(big, p, {{4, 2}}).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "parallel.tp_size = 2, slots counted in groups of 2"));
  ASSERT_OK_AND_ASSIGN(set, PlanShapes(big, p, {{4, 4}}));
  EXPECT_EQ(set.plans(0).slots(), 8);
}

TEST(TensorParallelPlanTest, SplittingABlockIsFasterThanOneRank) {
  // One group of two on one node against one rank: the blocks' compute halves and pays its
  // all-reduces, so with the built-in costs (and the default same-host link) tp 2 is faster,
  // but less than twice as fast (the embedding and head are not split).
  JobSpec one = TpGpt(1);
  one.parallel.stages = 1;
  one.parallel.replicas = 1;
  ASSERT_OK_AND_ASSIGN(v1::Profile p, BuiltinProfile(one));
  ASSERT_OK_AND_ASSIGN(v1::PlanSet single, PlanShapes(one, p, {{1}}));
  JobSpec two = one;
  two.parallel.tp_size = 2;
  ASSERT_OK_AND_ASSIGN(v1::PlanSet tp, PlanShapes(two, p, {{2}}));
  EXPECT_LT(tp.plans(0).step_s(), single.plans(0).step_s());
  EXPECT_GT(tp.plans(0).step_s(), single.plans(0).step_s() / 2);
}

TEST(TensorParallelPlanTest, AutoRanksEverySplitAndFollowsTheNodes) {
  // tp_size auto with one sample per step (no data parallelism) on a model wide enough for
  // compute to dominate: a 4-slot node holds tp 1, 2 and 4 (3 does not divide 4 heads), and
  // the best splits; on four 1-slot nodes only tp 1 fits, so a morph from one to the other
  // changes tp_size.
  JobSpec spec = TpGpt(0);
  spec.model.d_model = 1024;
  spec.model.seq_len = 512;
  spec.train.global_batch = 1;
  spec.parallel.micro_batch = 1;
  ASSERT_OK_AND_ASSIGN(v1::Profile p, BuiltinProfile(spec));
  ASSERT_OK_AND_ASSIGN(v1::PlanSet one_node, PlanShapes(spec, p, {{4}}));
  std::set<int> sizes;
  for (const v1::Plan& plan : one_node.plans()) {
    sizes.insert(plan.tp_size());
    if (!plan.lower_bound()) EXPECT_GE(plan.step_s(), one_node.plans(0).step_s());
  }
  EXPECT_EQ(sizes, (std::set<int>{1, 2, 4}));
  EXPECT_GT(one_node.plans(0).tp_size(), 1);
  EXPECT_THAT(one_node.notes(), ::testing::Contains(HasSubstr("tp_size auto")));
  ASSERT_OK_AND_ASSIGN(v1::PlanSet singles, PlanShapes(spec, p, {{1, 1, 1, 1}}));
  for (const v1::Plan& plan : singles.plans()) EXPECT_EQ(plan.tp_size(), 1);
  // Without slots it says so, as for a fixed size.
  EXPECT_THAT(PlanShapes(spec, p, {{}}).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "no free slots"));
}

}  // namespace
}  // namespace varuna

#include "manager/nodes/placement.h"

#include "common/planner/profile.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

JobSpec Spec(int stages, int replicas = 0, int64_t global_batch = 16, int layers = 8) {
  JobSpec s;
  s.model.layers = layers;
  s.parallel.stages = stages;
  s.parallel.replicas = replicas;
  s.train.global_batch = global_batch;
  return s;
}

TEST(PlacementTest, FixedStagesTakeAllReplicasThatFitAndPackPipelinesOntoNodes) {
  auto plan = PlanJob(Spec(2), {{"a", 2}, {"b", 2}});
  ASSERT_THAT(plan.status(), IsOk());
  EXPECT_EQ(plan->stages, 2);
  EXPECT_EQ(plan->replicas, 2);
  EXPECT_EQ(plan->stage_to_rank_map, "0,2;1,3;");
  EXPECT_EQ(plan->per_replica_batch, 8);
  EXPECT_EQ(plan->micro_batch, 1);  // auto: ceil(8 / (4*2))
  ASSERT_EQ(plan->ranks.size(), 4u);
  EXPECT_EQ(plan->ranks[0].node(), "a");
  EXPECT_EQ(plan->ranks[1].node(), "a");
  EXPECT_EQ(plan->ranks[2].node(), "b");
  EXPECT_EQ(plan->ranks[3].local_rank(), 1);
}

TEST(PlacementTest, FullestNodeFirst) {
  auto plan = PlanJob(Spec(3, 1), {{"small", 1}, {"big", 3}});
  ASSERT_THAT(plan.status(), IsOk());
  for (const auto& r : plan->ranks) EXPECT_EQ(r.node(), "big");
}

TEST(PlacementTest, AutoStagesUseOneNodesSlotsCappedByLayersAndDividingTheTotal) {
  auto plan = PlanJob(Spec(0), {{"a", 4}, {"b", 4}});
  ASSERT_THAT(plan.status(), IsOk());
  EXPECT_EQ(plan->stages, 4);
  EXPECT_EQ(plan->replicas, 2);
  auto shallow = PlanJob(Spec(0, 0, 16, /*layers=*/2), {{"a", 4}});
  ASSERT_THAT(shallow.status(), IsOk());
  EXPECT_EQ(shallow->stages, 2);
  EXPECT_EQ(shallow->replicas, 2);
  auto odd = PlanJob(Spec(0), {{"a", 3}, {"b", 3}});  // 6 slots: P=3, D=2
  ASSERT_THAT(odd.status(), IsOk());
  EXPECT_EQ(odd->stages * odd->replicas, 6);
}

TEST(PlacementTest, ReplicasDivideTheGlobalBatchAndRespectMaxSlots) {
  auto plan = PlanJob(Spec(1, 0, /*global_batch=*/12), {{"a", 8}});
  ASSERT_THAT(plan.status(), IsOk());
  EXPECT_EQ(plan->replicas, 6);  // 8 -> 7 -> 6 divides 12
  JobSpec capped = Spec(2);
  capped.resources.max_slots = 4;
  auto c = PlanJob(capped, {{"a", 8}});
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->stages * c->replicas, 4);
}

TEST(PlacementTest, NotEnoughSlotsNamesWhatIsMissing) {
  EXPECT_THAT(PlanJob(Spec(4), {{"a", 2}, {"b", 1}}),
              StatusIs(absl::StatusCode::kResourceExhausted, "needs 4 slots, 3 free"));
  JobSpec min = Spec(1);
  min.resources.min_slots = 4;
  EXPECT_THAT(PlanJob(min, {{"a", 2}}), StatusIs(absl::StatusCode::kResourceExhausted, "needs 4"));
  EXPECT_THAT(PlanJob(Spec(2, 3), {{"a", 4}}),
              StatusIs(absl::StatusCode::kResourceExhausted, "needs 6"));
  EXPECT_THAT(PlanJob(Spec(1, 3, 16), {{"a", 4}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "not divisible"));
}

}  // namespace
}  // namespace varuna

namespace varuna {
namespace {

TEST(PlanWithProfileTest, AutoConfigPicksWithAProfileAndTheRuleWithoutOne) {
  JobSpec spec = Spec(0, 0, 16, 8);
  spec.parallel.schedule = "auto";
  auto profile = BuiltinProfile(spec);
  ASSERT_TRUE(profile.ok());
  auto plan = PlanWithProfile(spec, {{"a", 4}, {"b", 4}}, &*profile);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(plan->predicted_step_s, 0);
  EXPECT_EQ(static_cast<int>(plan->boundaries.size()), plan->stages + 1);
  EXPECT_EQ(static_cast<int>(plan->ranks.size()), plan->stages * plan->replicas);
  EXPECT_NE(plan->schedule, "auto");
  EXPECT_THAT(plan->source, ::testing::HasSubstr("built-in"));

  // No profile, or one of another model: the placement rule, and status says why.
  auto rule = PlanWithProfile(spec, {{"a", 4}, {"b", 4}}, nullptr);
  ASSERT_TRUE(rule.ok());
  EXPECT_THAT(rule->source, ::testing::HasSubstr("placement rule (no profile of 'gpt layers=8"));
  EXPECT_EQ(rule->schedule, "varuna");
  JobSpec other = spec;
  other.model.layers = 4;
  auto foreign = PlanWithProfile(other, {{"a", 4}}, &*profile);
  ASSERT_TRUE(foreign.ok());
  EXPECT_THAT(foreign->source, ::testing::HasSubstr("profile is for model 'gpt layers=8"));

  // Too few slots for min_slots: wait (ResourceExhausted), as under the rule.
  spec.resources.min_slots = 16;
  EXPECT_EQ(PlanWithProfile(spec, {{"a", 4}}, &*profile).status().code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace varuna

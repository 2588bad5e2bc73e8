#include "manager/placement.h"

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

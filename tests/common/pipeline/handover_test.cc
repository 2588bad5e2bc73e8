#include "common/pipeline/handover.h"

#include <gtest/gtest.h>

namespace varuna {
namespace {

// 2 x 2 (stage 0: a, b; stage 1: c, d) after rank 1 died: old ranks 0, 2 hold stage 0 and
// old rank 3 stage 1, all at step 20 (19 restorable).
const std::vector<std::string> kStage0 = {"a", "b"}, kStage1 = {"c", "d"};
const std::vector<std::string> kAll = {"a", "b", "c", "d"};

TEST(HandoverTest, KeepsWhatEachRankHoldsAndMovesTheRest) {
  // New shape: 1 stage x 3 replicas, ranks = old 0, 2, 3.
  std::vector<RankHoldings> r = {
      {{20, 19}, kStage0, kAll}, {{20, 19}, kStage0, kAll}, {{20, 19}, kStage1, kAll}};
  auto h = PlanHandover(r, 18);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->step, 20);
  EXPECT_TRUE(h->reads.empty());
  // Ranks 0 and 1 get c and d from rank 2; rank 2 gets a and b spread over ranks 0 and 1.
  ASSERT_EQ(h->moves.size(), 6u);
  int from0 = 0, from1 = 0;
  for (const auto& m : h->moves) {
    if (m.dst == 2) (m.src == 0 ? from0 : from1)++;
    if (m.dst != 2) EXPECT_EQ(m.src, 2);
  }
  EXPECT_EQ(from0, 1);
  EXPECT_EQ(from1, 1);
}

TEST(HandoverTest, SplitCommitFallsBackToTheStepEveryLayerHas) {
  // Rank 1 (stage 1) never applied 20 (a split agreement): stage 1 is only at 19.
  std::vector<RankHoldings> r = {{{20, 19}, kStage0, kStage0}, {{19, 18}, kStage1, kStage1}};
  auto h = PlanHandover(r, std::nullopt);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->step, 19);
  EXPECT_TRUE(h->moves.empty());
  EXPECT_NE(h->reason.find("no rank holds c, d at step 20"), std::string::npos) << h->reason;
}

TEST(HandoverTest, AStageNobodyHoldsComesFromTheCheckpoint) {
  // Both holders of stage 1 died; the checkpoint of step 20 is complete (every_steps: 1).
  std::vector<RankHoldings> r = {{{20, 19}, kStage0, kStage0}, {{}, {}, kStage1}};
  auto h = PlanHandover(r, 20);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->step, 20);
  ASSERT_EQ(h->reads.size(), 2u);
  EXPECT_EQ(h->reads[0].layer, "c");
  EXPECT_EQ(h->reads[0].dst, 1);
  EXPECT_NE(h->reason.find("2 layer(s) from the checkpoint"), std::string::npos) << h->reason;
}

TEST(HandoverTest, ACheckpointOlderThanWhatSurvivorsCanGiveIsAllTheyGet) {
  // Stage 1 is lost and the newest checkpoint is step 10: survivors cannot go back to 10 in
  // memory, so every layer of step 10 comes from the checkpoint.
  std::vector<RankHoldings> r = {{{20, 19}, kStage0, kStage0}, {{}, {}, kStage1}};
  auto h = PlanHandover(r, 10);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->step, 10);
  EXPECT_EQ(h->reads.size(), 4u);
}

TEST(HandoverTest, NothingToContinueFromIsAnError) {
  std::vector<RankHoldings> r = {{{20}, kStage0, kStage0}, {{}, {}, kStage1}};
  auto h = PlanHandover(r, std::nullopt);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("nobody holds c, d"), std::string::npos) << h.status();
  EXPECT_FALSE(PlanHandover({{{}, {}, kAll}}, std::nullopt).ok());
}

}  // namespace
}  // namespace varuna

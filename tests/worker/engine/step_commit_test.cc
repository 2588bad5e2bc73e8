// What a rank knows of committed steps (worker/engine/step_commit.h; Note [Committed step] in
// worker/engine/varuna.cc).

#include "worker/engine/step_commit.h"

#include <gtest/gtest.h>

namespace varuna {
namespace {

StepCommit::PreUpdate Pre(int64_t step) {
  StepCommit::PreUpdate p;
  p.step = step;
  p.loss_scale = 1024;
  c10::Dict<std::string, at::Tensor> layer;
  layer.insert("weight", torch::ones({2}));
  p.layers.emplace_back("embed", layer);
  return p;
}

TEST(StepCommitTest, AStepIsCommittedOnceTheNextOnesAgreementCompleted) {
  StepCommit c;
  EXPECT_EQ(c.Committed(0, 4), 0);
  c.Agreed(1, {});  // every rank applied step 0 (nothing): step 1 not yet known committed
  EXPECT_EQ(c.Committed(1, 4), 0);
  c.Agreed(2, {});
  EXPECT_EQ(c.Committed(2, 4), 1);
  EXPECT_EQ(c.Committed(2, 1), 2);  // alone, every step it applied
}

TEST(StepCommitTest, AGenerationStartsCommittedAtTheStepEveryRankLoaded) {
  StepCommit c;
  c.Agreed(9, {});
  c.KeepPreUpdate(Pre(8));
  c.Start(20);
  EXPECT_EQ(c.start(), 20);
  EXPECT_EQ(c.Committed(20, 4), 20);
  EXPECT_EQ(c.PreUpdateAt(8), nullptr);  // a new generation keeps nothing of the old one
  c.Agreed(21, {});
  EXPECT_EQ(c.Committed(21, 4), 20);
}

// Note [Roll forward] in worker/engine/regroup.cc: a posted agreement stays pending until it
// completes here; the completed one's vector is kept for a peer that missed it.
TEST(StepCommitTest, APostedAgreementIsPendingUntilItCompletes) {
  StepCommit c;
  EXPECT_EQ(c.pending(), 0);
  c.Agreed(4, {1, 2, 3});
  c.Posted(5);
  EXPECT_EQ(c.pending(), 5);
  EXPECT_EQ(c.agreed(), 4);
  EXPECT_EQ(c.agreed_vector(), (std::vector<double>{1, 2, 3}));
  c.Agreed(5, {4, 5});
  EXPECT_EQ(c.pending(), 0);
  EXPECT_EQ(c.agreed(), 5);
  EXPECT_EQ(c.agreed_vector(), (std::vector<double>{4, 5}));
  c.Posted(6);
  c.Start(6);  // a new generation: nothing pending, nothing agreed
  EXPECT_EQ(c.pending(), 0);
  EXPECT_EQ(c.agreed(), 0);
  EXPECT_TRUE(c.agreed_vector().empty());
}

TEST(StepCommitTest, ThePreUpdateStateIsOfferedOnlyForItsOwnStep) {
  StepCommit c;
  EXPECT_EQ(c.PreUpdateAt(4), nullptr);
  c.KeepPreUpdate(Pre(4));
  ASSERT_NE(c.PreUpdateAt(4), nullptr);
  EXPECT_EQ(c.PreUpdateAt(4)->loss_scale, 1024);
  EXPECT_EQ(c.PreUpdateAt(5), nullptr);
  StepCommit::PreUpdate empty;  // no layers: nothing to offer
  empty.step = 6;
  c.KeepPreUpdate(empty);
  EXPECT_EQ(c.PreUpdateAt(6), nullptr);
  EXPECT_EQ(c.PreUpdateAt(-1), nullptr);
}

}  // namespace
}  // namespace varuna

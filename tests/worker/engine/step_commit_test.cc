// What a rank knows of committed steps (worker/engine/step_commit.h; Note [Committed step] in
// worker/engine/varuna.cc).

#include "worker/engine/step_commit.h"

#include <gtest/gtest.h>

namespace varuna {
namespace {

TEST(StepCommitTest, AStepIsCommittedOnceTheNextOnesAgreementCompleted) {
  StepCommit c;
  EXPECT_EQ(c.Committed(0, 4), 0);
  c.Agreed(1, {}, {});  // every rank applied step 0 (nothing): step 1 not yet known committed
  EXPECT_EQ(c.Committed(1, 4), 0);
  c.Agreed(2, {}, {});
  EXPECT_EQ(c.Committed(2, 4), 1);
  EXPECT_EQ(c.Committed(2, 1), 2);  // alone, every step it applied
}

TEST(StepCommitTest, AGenerationStartsCommittedAtTheStepEveryRankLoaded) {
  StepCommit c;
  c.Agreed(9, {}, {false, 2.5});
  c.Start(20);
  EXPECT_EQ(c.start(), 20);
  EXPECT_EQ(c.Committed(20, 4), 20);
  EXPECT_EQ(c.agreed_update().grad_norm, 0);  // a new generation keeps nothing of the old one
  c.Agreed(21, {}, {});
  EXPECT_EQ(c.Committed(21, 4), 20);
}

// Note [Roll forward] in worker/engine/regroup.cc: a posted agreement stays pending until it
// completes here; the completed one's vector is kept for a peer that missed it.
TEST(StepCommitTest, APostedAgreementIsPendingUntilItCompletes) {
  StepCommit c;
  EXPECT_EQ(c.pending(), 0);
  c.Agreed(4, {1, 2, 3}, {false, 0.5});
  c.Posted(5);
  EXPECT_EQ(c.pending(), 5);
  EXPECT_EQ(c.agreed(), 4);
  EXPECT_EQ(c.agreed_vector(), (std::vector<double>{1, 2, 3}));
  EXPECT_FALSE(c.agreed_update().skipped);
  EXPECT_EQ(c.agreed_update().grad_norm, 0.5);
  c.Agreed(5, {4, 5}, {true, 0});
  EXPECT_EQ(c.pending(), 0);
  EXPECT_EQ(c.agreed(), 5);
  EXPECT_EQ(c.agreed_vector(), (std::vector<double>{4, 5}));
  EXPECT_TRUE(c.agreed_update().skipped);  // an overflow's vote
  c.Posted(6);
  c.Start(6);  // a new generation: nothing pending, nothing agreed
  EXPECT_EQ(c.pending(), 0);
  EXPECT_EQ(c.agreed(), 0);
  EXPECT_TRUE(c.agreed_vector().empty());
}

}  // namespace
}  // namespace varuna

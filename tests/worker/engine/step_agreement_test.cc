// The step agreement (worker/engine/step_agreement.h): votes packed, summed as the
// all-reduce sums them, and read back.

#include "worker/engine/step_agreement.h"

#include <gtest/gtest.h>

#include <vector>

namespace varuna {
namespace {

TEST(StepAgreementTest, TheSumOfTheVotesIsWhatEveryRankDecides) {
  // A 2-stage pipeline 0 (ranks 0, 1) and its replica (ranks 2, 3).
  const int W = 4;
  std::vector<StepVote> votes(W);
  for (int r = 0; r < W; ++r) {
    votes[r].busy.assign(W, 0.0);
    votes[r].wait.assign(W, 0.0);
    votes[r].busy[r] = 1.0 + r;
    votes[r].wait[r] = 0.5 * r;
  }
  votes[0].norm_sq = 2.0;  // pipeline 0 alone contributes the norm and the parameters
  votes[1].norm_sq = 3.0;
  votes[0].params = 100;
  votes[1].params = 50;
  votes[1].loss = 1.25;  // each last stage its pipeline's share
  votes[3].loss = 0.75;
  votes[2].stop = true;  // one rank's stop request stops everyone
  std::vector<double> sum(StepAgreement::Size(W), 0.0);
  for (const StepVote& v : votes) {
    const std::vector<double> packed = v.Pack(W);
    ASSERT_EQ(packed.size(), sum.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += packed[i];
  }
  const StepAgreement a = StepAgreement::Unpack(sum.data(), W);
  EXPECT_FALSE(a.overflow);
  EXPECT_DOUBLE_EQ(a.norm_sq, 5.0);
  EXPECT_DOUBLE_EQ(a.loss, 2.0);
  EXPECT_TRUE(a.stop);
  EXPECT_EQ(a.params, 150);
  EXPECT_EQ(a.busy, (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(a.wait, (std::vector<double>{0, 0.5, 1, 1.5}));
}

TEST(StepAgreementTest, OneOverflowSkipsTheStepEverywhere) {
  StepVote quiet, loud;
  loud.overflow = true;
  std::vector<double> sum = quiet.Pack(2);
  const std::vector<double> l = loud.Pack(2);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += l[i];
  const StepAgreement a = StepAgreement::Unpack(sum.data(), 2);
  EXPECT_TRUE(a.overflow);
  EXPECT_FALSE(a.stop);
  EXPECT_EQ(a.busy, (std::vector<double>{0, 0}));  // votes without timings fill zeros
}

}  // namespace
}  // namespace varuna

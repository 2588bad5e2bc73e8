#include "worker/engine/lr_schedule.h"

#include <gtest/gtest.h>

namespace varuna {
namespace {

TEST(LrScheduleTest, WarmupThenCosine) {
  EXPECT_DOUBLE_EQ(LearningRate("cosine", 1.0, 0.1, 4, 104, 1), 0.25);
  EXPECT_DOUBLE_EQ(LearningRate("cosine", 1.0, 0.1, 4, 104, 4), 1.0);
  EXPECT_NEAR(LearningRate("cosine", 1.0, 0.1, 4, 104, 54), 0.55, 1e-12);
  EXPECT_NEAR(LearningRate("cosine", 1.0, 0.1, 4, 104, 104), 0.1, 1e-12);
  EXPECT_NEAR(LearningRate("cosine", 1.0, 0.1, 4, 104, 500), 0.1, 1e-12);
}

TEST(LrScheduleTest, LinearAndConstant) {
  EXPECT_NEAR(LearningRate("linear", 1.0, 0.0, 0, 100, 50), 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(LearningRate("constant", 0.3, 0.0, 0, 100, 77), 0.3);
  EXPECT_DOUBLE_EQ(LearningRate("constant", 0.3, 0.0, 10, 100, 5), 0.15);
}

}  // namespace
}  // namespace varuna

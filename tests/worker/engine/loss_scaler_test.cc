#include "worker/engine/loss_scaler.h"

#include <gtest/gtest.h>

namespace varuna {
namespace {

TEST(LossScalerTest, OverflowSkipsAndHalves) {
  DynamicLossScaler s(1024, 3);
  EXPECT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_FALSE(s.Update(false));
  EXPECT_EQ(s.scale(), 512);
}

TEST(LossScalerTest, GrowsAfterWindowOfCleanSteps) {
  DynamicLossScaler s(8, 3);
  EXPECT_FALSE(s.Update(false));
  EXPECT_FALSE(s.Update(false));
  EXPECT_EQ(s.scale(), 8);
  EXPECT_FALSE(s.Update(false));
  EXPECT_EQ(s.scale(), 16);
  // An overflow resets the window.
  s.Update(false);
  s.Update(true);
  EXPECT_EQ(s.scale(), 8);
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 8);
  s.Update(false);
  EXPECT_EQ(s.scale(), 16);
}

TEST(LossScalerTest, NeverBelowMinimum) {
  DynamicLossScaler s(2, 100, 1.0);
  s.Update(true);
  s.Update(true);
  s.Update(true);
  EXPECT_EQ(s.scale(), 1.0);
}

}  // namespace
}  // namespace varuna

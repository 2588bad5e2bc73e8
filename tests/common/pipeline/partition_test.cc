#include "common/pipeline/partition.h"

#include <algorithm>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::testing::ElementsAre;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

TEST(PartitionByCostTest, UniformCosts) {
  absl::StatusOr<std::vector<int>> b = PartitionByCost(std::vector<double>(8, 1.0), 4);
  ASSERT_THAT(b, IsOk());
  EXPECT_THAT(*b, ElementsAre(0, 2, 4, 6, 8));
}

TEST(PartitionByCostTest, SingleStageTakesEverything) {
  EXPECT_THAT(*PartitionByCost({3, 1, 4}, 1), ElementsAre(0, 3));
}

TEST(PartitionByCostTest, StagesEqualSegments) {
  EXPECT_THAT(*PartitionByCost({5, 1, 9, 2}, 4), ElementsAre(0, 1, 2, 3, 4));
}

TEST(PartitionByCostTest, SkewedCosts) {
  // One heavy segment gets a stage of its own.
  EXPECT_THAT(*PartitionByCost({1, 1, 1, 10, 1, 1}, 3), ElementsAre(0, 3, 4, 6));
  // A perfect split: {4,3,3} {2,8} {9,1}, each costing 10.
  EXPECT_THAT(*PartitionByCost({4, 3, 3, 2, 8, 9, 1}, 3), ElementsAre(0, 3, 5, 7));
  // A heavy tail.
  EXPECT_THAT(*PartitionByCost({1, 1, 1, 1, 1, 1, 6}, 2), ElementsAre(0, 6, 7));
}

TEST(PartitionByCostTest, TiesGoToEarliestBoundaries) {
  // {1} {1,1} and {1,1} {1} both have max cost 2.
  EXPECT_THAT(*PartitionByCost({1, 1, 1}, 2), ElementsAre(0, 1, 3));
  // Zero-cost segments: the first stage stays as short as possible.
  EXPECT_THAT(*PartitionByCost({5, 0, 0, 5}, 2), ElementsAre(0, 1, 4));
  EXPECT_THAT(*PartitionByCost({0, 0, 5, 5}, 2), ElementsAre(0, 3, 4));
  EXPECT_THAT(*PartitionByCost({0, 0, 0, 0}, 2), ElementsAre(0, 1, 4));
}

// Brute force over all boundary vectors in lexicographic order: the first with the minimal max
// cost must be the result.
TEST(PartitionByCostTest, MatchesBruteForce) {
  const std::vector<double> costs = {3, 1, 4, 1, 5, 9, 2, 6, 5};
  const int n = static_cast<int>(costs.size());
  for (int stages = 1; stages <= n; ++stages) {
    std::vector<int> best;
    double best_cost = 1e300;
    // Enumerate boundaries in lexicographic order via an increasing index vector.
    std::vector<int> b(stages + 1);
    for (int s = 0; s <= stages; ++s) b[s] = s;
    b[stages] = n;
    while (true) {
      double worst = 0;
      for (int s = 0; s < stages; ++s) {
        double c = 0;
        for (int i = b[s]; i < b[s + 1]; ++i) c += costs[i];
        worst = std::max(worst, c);
      }
      if (worst < best_cost) {
        best_cost = worst;
        best = b;
      }
      int s = stages - 1;  // advance the last movable inner boundary
      while (s >= 1 && b[s] == n - (stages - s)) --s;
      if (s < 1) break;
      ++b[s];
      for (int t = s + 1; t < stages; ++t) b[t] = b[t - 1] + 1;
    }
    absl::StatusOr<std::vector<int>> got = PartitionByCost(costs, stages);
    ASSERT_THAT(got, IsOk());
    EXPECT_EQ(*got, best) << "stages=" << stages;
  }
}

TEST(PartitionByCostTest, Errors) {
  EXPECT_THAT(PartitionByCost({1, 2, 3}, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, "cannot split 3 segments into 4"));
  EXPECT_THAT(PartitionByCost({}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "cannot split 0 segments into 1"));
  EXPECT_THAT(PartitionByCost({1, 2, 3}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, "stages must be >= 1, got 0"));
  EXPECT_THAT(PartitionByCost({1, 2, 3}, -1),
              StatusIs(absl::StatusCode::kInvalidArgument, "got -1"));
  EXPECT_THAT(PartitionByCost({1, -2, 3}, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "cost[1] = -2"));
}

}  // namespace
}  // namespace varuna

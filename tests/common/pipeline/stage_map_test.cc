#include "common/pipeline/stage_map.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::testing::ElementsAre;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

TEST(StageMapTest, MakeAndToString) {
  EXPECT_EQ(StageMap::Make(4, 2).ToString(), "0,4;1,5;2,6;3,7;");
  EXPECT_EQ(StageMap::Make(2, 2).ToString(), "0,2;1,3;");
  EXPECT_EQ(StageMap::Make(1, 3).ToString(), "0,1,2;");
  EXPECT_EQ(StageMap::Make(3, 1).ToString(), "0;1;2;");
}

TEST(StageMapTest, RoundTrip) {
  for (int p = 1; p <= 5; ++p) {
    for (int d = 1; d <= 4; ++d) {
      const StageMap made = StageMap::Make(p, d);
      absl::StatusOr<StageMap> parsed = StageMap::Parse(made.ToString());
      ASSERT_THAT(parsed, IsOk()) << made.ToString();
      EXPECT_EQ(parsed->ToString(), made.ToString());
      EXPECT_EQ(parsed->stages(), p);
      EXPECT_EQ(parsed->replicas(), d);
      EXPECT_EQ(parsed->world_size(), p * d);
    }
  }
}

TEST(StageMapTest, Accessors) {
  absl::StatusOr<StageMap> map = StageMap::Parse("0,4;1,5;2,6;3,7;");
  ASSERT_THAT(map, IsOk());
  EXPECT_EQ(map->stages(), 4);
  EXPECT_EQ(map->replicas(), 2);
  EXPECT_EQ(map->world_size(), 8);
  EXPECT_EQ(map->StageOf(5), 1);
  EXPECT_EQ(map->ReplicaOf(5), 1);
  EXPECT_EQ(map->StageOf(3), 3);
  EXPECT_EQ(map->ReplicaOf(3), 0);
  EXPECT_EQ(map->RankOf(2, 1), 6);
  EXPECT_EQ(map->RankOf(0, 0), 0);
  EXPECT_THAT(map->StageRanks(3), ElementsAre(3, 7));
  EXPECT_THAT(map->ReplicaRanks(0), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(map->ReplicaRanks(1), ElementsAre(4, 5, 6, 7));
  for (int r = 0; r < map->world_size(); ++r) {
    EXPECT_EQ(map->RankOf(map->StageOf(r), map->ReplicaOf(r)), r);
  }
}

TEST(StageMapTest, TrimsWhitespace) {
  absl::StatusOr<StageMap> map = StageMap::Parse(" 0, 2; 1 ,3;\n");
  ASSERT_THAT(map, IsOk());
  EXPECT_EQ(map->ToString(), "0,2;1,3;");
}

TEST(StageMapTest, ValidateWorldSize) {
  const StageMap map = StageMap::Make(2, 2);
  EXPECT_THAT(map.ValidateWorldSize(4), IsOk());
  EXPECT_THAT(map.ValidateWorldSize(2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "stage_to_rank_map \"0,2;1,3;\" has 4 ranks but WORLD_SIZE is 2"));
}

struct BadMap {
  std::string text;
  std::string message;
};

class StageMapParseErrorTest : public ::testing::TestWithParam<BadMap> {};

TEST_P(StageMapParseErrorTest, Rejects) {
  const BadMap& bad = GetParam();
  absl::StatusOr<StageMap> map = StageMap::Parse(bad.text);
  EXPECT_THAT(map, StatusIs(absl::StatusCode::kInvalidArgument, bad.message));
  EXPECT_THAT(map, StatusIs(absl::StatusCode::kInvalidArgument, "\"" + bad.text + "\""));
}

INSTANTIATE_TEST_SUITE_P(
    Errors, StageMapParseErrorTest,
    ::testing::Values(BadMap{"", "is empty"}, BadMap{"  ", "is empty"},
                      BadMap{"0,1;2,3", "must end with ';'"}, BadMap{"0,2;;1,3;", "empty"},
                      BadMap{";", "empty"},
                      BadMap{"0,a;1,3;", "\"a\" of stage 0 is not an integer"},
                      BadMap{"0,,2;1,3;", "is not an integer"},
                      BadMap{"0,1.5;", "\"1.5\" of stage 0 is not an integer"},
                      BadMap{"0,-2;1,3;", "rank -2 of stage 0 is negative"},
                      BadMap{"0,2;0,3;", "rank 0 is listed twice"},
                      BadMap{"0,2;1;", "same replica count"}, BadMap{"0,2;1,4;", "0..3"},
                      BadMap{"0,2;1,2000000000;", "0..3"},
                      BadMap{"2,0;1,3;", "rank 2 is placed at stage 0 replica 0"},
                      BadMap{"0,1;2,3;", "rank 1 is placed at stage 0 replica 1"}));

}  // namespace
}  // namespace varuna

// VARUNA_FAULT's grammar (Note [Faults] in worker/engine/fault.cc): what parses, what is refused
// with the entry named, and which entries a rank keeps.

#include "worker/engine/fault.h"

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;

TEST(FaultTest, ParsesEveryPointAndAction) {
  auto f = ParseFaults("agreement@7:1:split, update@3:0:kill:2,first_step@1:2:freeze");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->size(), 3u);
  EXPECT_EQ((*f)[0].point, FaultPoint::kAgreement);
  EXPECT_EQ((*f)[0].step, 7);
  EXPECT_EQ((*f)[0].rank, 1);
  EXPECT_EQ((*f)[0].action, FaultAction::kSplit);
  EXPECT_EQ((*f)[0].generation, 1);
  EXPECT_EQ((*f)[1].generation, 2);
  EXPECT_EQ((*f)[2].action, FaultAction::kFreeze);
  for (const char* p :
       {"forward", "pipeline", "backward", "dp_allreduce", "agreement", "after_agreement", "update",
        "checkpoint_write", "rescue_save", "first_step"}) {
    EXPECT_TRUE(ParseFaults(std::string(p) + "@1:0:kill").ok()) << p;
  }
  EXPECT_TRUE(ParseFaults("").ok());
}

TEST(FaultTest, RefusesWhatItCannotDoNamingTheEntry) {
  const std::pair<const char*, const char*> bad[] = {
      {"agreement", "no '@'"},          {"nowhere@1:0:kill", "unknown point"},
      {"update@0:0:kill", "STEP"},      {"update@1:-1:kill", "RANK"},
      {"update@1:0:explode", "ACTION"}, {"update@1:0:split", "agreement point only"},
      {"update@1:0:kill:0", "GEN"},     {"update@1:0", "STEP:RANK:ACTION"},
  };
  for (const auto& [text, why] : bad) {
    auto f = ParseFaults(text);
    EXPECT_FALSE(f.ok()) << text;
    EXPECT_THAT(std::string(f.status().message()), HasSubstr(why)) << text;
    EXPECT_THAT(std::string(f.status().message()), HasSubstr(text)) << text;
  }
}

TEST(FaultTest, ARankKeepsOnlyItsOwnFaultsOfItsGeneration) {
  auto f = ParseFaults("agreement@5:1:split,agreement@6:0:split,agreement@7:1:split:2");
  ASSERT_TRUE(f.ok());
  FaultInjector rank1(*f, /*rank=*/1, /*generation=*/1);
  EXPECT_TRUE(rank1.Hit(FaultPoint::kAgreement, 5));   // a split returns to act it out
  EXPECT_FALSE(rank1.Hit(FaultPoint::kAgreement, 6));  // rank 0's
  EXPECT_FALSE(rank1.Hit(FaultPoint::kAgreement, 7));  // generation 2's
  EXPECT_FALSE(rank1.Hit(FaultPoint::kUpdate, 5));
  FaultInjector gen2(*f, 1, 2);
  EXPECT_TRUE(gen2.Hit(FaultPoint::kAgreement, 7));
  EXPECT_TRUE(FaultInjector().empty());
  // first_step: the generation's first step, wherever it resumed, if at least STEP.
  auto first = ParseFaults("first_step@10:0:split");
  ASSERT_FALSE(first.ok());  // split is for the agreement only
}

TEST(FaultTest, FirstStepFiresFromItsStepOn) {
  // A kill or freeze would end the test process: check the matching through Hit's absence.
  auto f = ParseFaults("first_step@10:0:kill:2");
  ASSERT_TRUE(f.ok());
  FaultInjector gen1(*f, 0, 1);
  EXPECT_FALSE(gen1.Hit(FaultPoint::kFirstStep, 12));  // generation 1: not this one's
  FaultInjector gen2(*f, 0, 2);
  EXPECT_FALSE(gen2.Hit(FaultPoint::kFirstStep, 5));  // before STEP: nothing
}

// VARUNA_STEP_MIN_MS: unset or empty is 0; whole milliseconds up to a minute; anything else a
// start-up error naming the variable and the value.
TEST(FaultTest, StepMinMsIsWholeMillisecondsOrAnErrorNamingIt) {
  unsetenv("VARUNA_STEP_MIN_MS");
  EXPECT_EQ(*StepMinMsFromEnvironment(), 0);
  setenv("VARUNA_STEP_MIN_MS", "", 1);
  EXPECT_EQ(*StepMinMsFromEnvironment(), 0);
  setenv("VARUNA_STEP_MIN_MS", "40", 1);
  EXPECT_EQ(*StepMinMsFromEnvironment(), 40);
  for (const char* bad : {"-1", "4.5", "fast", "60001"}) {
    setenv("VARUNA_STEP_MIN_MS", bad, 1);
    auto got = StepMinMsFromEnvironment();
    ASSERT_FALSE(got.ok()) << bad;
    EXPECT_THAT(
        std::string(got.status().message()),
        ::testing::AllOf(::testing::HasSubstr("VARUNA_STEP_MIN_MS"), ::testing::HasSubstr(bad)));
  }
  unsetenv("VARUNA_STEP_MIN_MS");
}

}  // namespace
}  // namespace varuna

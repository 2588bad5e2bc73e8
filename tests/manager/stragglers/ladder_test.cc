// The straggler ladder's decision as a table (manager/stragglers/ladder.h): each row the
// predictions and the budget, and what the ladder does.

#include "manager/stragglers/ladder.h"

#include <limits>

#include "gtest/gtest.h"

namespace varuna {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

LadderInput Base() {
  LadderInput in;
  in.now_s = 1.0;
  in.rebalanced_s = 0.8;
  in.evicted_s = 0.7;
  in.measured_s = 2.0;  // the predictions are half the measured times
  in.steps_left = 1000;
  in.recent_morphs = 0;
  in.max_morphs = 20;
  in.min_gain = 0.05;
  in.morph_cost_s = 30;
  return in;
}

TEST(LadderTest, DecidesByTheTable) {
  struct Row {
    const char* what;
    void (*change)(LadderInput&);
    LadderAction want;
    const char* why_not;  // a part of the reason when tolerated
  } rows[] = {
      {"eviction is fastest", [](LadderInput&) {}, LadderAction::kEvict, ""},
      {"rebalancing is fastest", [](LadderInput& in) { in.rebalanced_s = 0.6; },
       LadderAction::kRebalance, ""},
      {"a tie goes to eviction", [](LadderInput& in) { in.rebalanced_s = 0.7; },
       LadderAction::kEvict, ""},
      {"no eviction possible", [](LadderInput& in) { in.evicted_s = kInf; },
       LadderAction::kRebalance, ""},
      {"neither possible", [](LadderInput& in) { in.evicted_s = in.rebalanced_s = kInf; },
       LadderAction::kTolerate, "neither is 5% faster"},
      {"below min_gain", [](LadderInput& in) { in.rebalanced_s = in.evicted_s = 0.97; },
       LadderAction::kTolerate, "neither is 5% faster"},
      {"half the budget spent", [](LadderInput& in) { in.recent_morphs = 10; },
       LadderAction::kTolerate, "10 morphs within morph_window_s"},
      {"one short of half the budget", [](LadderInput& in) { in.recent_morphs = 9; },
       LadderAction::kEvict, ""},
      // 0.3 s predicted x 2 (measured scale) x 40 steps = 24 s < a 30 s morph.
      {"too few steps left to pay", [](LadderInput& in) { in.steps_left = 40; },
       LadderAction::kTolerate, "saves 24.0 s over the 40 steps left"},
      // Without a measurement the predictions stand: 0.3 s x 100 = 30 s, not less than 30.
      {"pays exactly",
       [](LadderInput& in) {
         in.measured_s = 0;
         in.steps_left = 100;
       },
       LadderAction::kEvict, ""},
  };
  for (const Row& row : rows) {
    LadderInput in = Base();
    row.change(in);
    const LadderDecision d = DecideLadder(in);
    EXPECT_EQ(d.action, row.want) << row.what << ": " << d.why_not;
    if (row.want == LadderAction::kTolerate) {
      EXPECT_NE(d.why_not.find(row.why_not), std::string::npos) << row.what << ": " << d.why_not;
    } else {
      EXPECT_EQ(d.why_not, "") << row.what;
    }
  }
}

TEST(LadderTest, SavingIsScaledToTheMeasuredSteps) {
  LadderInput in = Base();
  EXPECT_DOUBLE_EQ(DecideLadder(in).saving_s, (1.0 - 0.7) * 2.0 * 1000);
}

}  // namespace
}  // namespace varuna

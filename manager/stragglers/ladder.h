#pragma once

// The straggler ladder's decision (docs/stragglers.md), a pure function of the predictions:
// tolerate the slow nodes, rebalance the stages around them, or evict them. The controller
// (straggler_controller.cc) gathers the predictions and acts; this decides.

#include <cstdint>
#include <string>

namespace varuna {

struct LadderInput {
  double now_s = 0;         // predicted step of the running plan at the measured speeds
  double rebalanced_s = 0;  // predicted step rebalanced around them (infinity: no option)
  double evicted_s = 0;     // predicted step without them (infinity: no option)
  double measured_s = 0;    // the median measured step (0: none yet; predictions as they are)
  int64_t steps_left = 0;
  int recent_morphs = 0;    // morphs within morph_window
  int max_morphs = 0;       // the job's morph budget within morph_window
  double min_gain = 0;      // stragglers.min_gain: the fraction faster an option must be
  double morph_cost_s = 0;  // what a morph is expected to cost
};

enum class LadderAction { kTolerate, kRebalance, kEvict };

struct LadderDecision {
  LadderAction action = LadderAction::kTolerate;
  std::string why_not;  // kTolerate: why neither option is taken
  double saving_s = 0;  // what the better option saves over the steps left
};

// Morphs for stragglers never spend the half of the budget that keeps a job alive through
// failures; an option must be min_gain faster and save more than a morph costs; eviction wins
// a tie with rebalancing.
LadderDecision DecideLadder(const LadderInput& in);

}  // namespace varuna

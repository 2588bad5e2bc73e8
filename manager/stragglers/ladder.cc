#include "manager/stragglers/ladder.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace varuna {

LadderDecision DecideLadder(const LadderInput& in) {
  LadderDecision d;
  const double best = std::min(in.rebalanced_s, in.evicted_s);
  // The predictions' scale to the measured steps (a model's absolute times are rarely right).
  const double scale = in.now_s > 0 && in.measured_s > 0 ? in.measured_s / in.now_s : 1;
  d.saving_s = (in.now_s - best) * scale * static_cast<double>(in.steps_left);
  if (2 * in.recent_morphs >= in.max_morphs) {
    d.why_not = absl::StrCat(in.recent_morphs, " morphs within morph_window_s already (max_morphs ",
                             in.max_morphs, "): the rest is kept for failures");
  } else if (!(best < in.now_s * (1 - in.min_gain))) {
    d.why_not =
        absl::StrFormat("neither is %.0f%% faster (stragglers.min_gain)", 100 * in.min_gain);
  } else if (d.saving_s < in.morph_cost_s) {
    d.why_not = absl::StrFormat("saves %.1f s over the %d steps left, a morph costs %.1f s",
                                d.saving_s, in.steps_left, in.morph_cost_s);
  }
  if (!d.why_not.empty()) return d;
  d.action = in.evicted_s <= in.rebalanced_s ? LadderAction::kEvict : LadderAction::kRebalance;
  return d;
}

}  // namespace varuna

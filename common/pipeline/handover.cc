#include "common/pipeline/handover.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace varuna {
namespace {

bool Has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

bool HoldsAt(const RankHoldings& r, const std::string& layer, int64_t step) {
  return std::find(r.steps.begin(), r.steps.end(), step) != r.steps.end() && Has(r.layers, layer);
}

}  // namespace

// Note [Handover]: after a morph in place every rank of the new topology must start from the
// same step S, with each layer of its new stage as it was after S. A survivor can give the
// newest step it applied, and the one before while that one is not committed (Note [Committed
// step] in worker/engine/varuna.cc); a joiner gives nothing; the checkpoint directory gives its
// newest complete step. S is the newest step at which every needed layer has a source, so
// the choice matches the relaunch path's (Note [Saved steps] in
// manager/morph/morph_controller.cc) and loses at most the step in flight. Layers are sent by
// the holder with the fewest sends so far, so a stage held by several replicas spreads its
// load over them. Every rank computes this from the same inputs, so all agree with no
// further message.
absl::StatusOr<Handover> PlanHandover(const std::vector<RankHoldings>& ranks,
                                      std::optional<int64_t> checkpoint_step) {
  std::set<int64_t, std::greater<>> candidates;
  for (const auto& r : ranks) candidates.insert(r.steps.begin(), r.steps.end());
  if (checkpoint_step) candidates.insert(*checkpoint_step);
  std::vector<std::string> missing_at_newest;
  for (int64_t step : candidates) {
    std::vector<std::string> missing;
    for (const auto& r : ranks) {
      for (const auto& layer : r.needs) {
        if (checkpoint_step && *checkpoint_step == step) continue;
        bool held = false;
        for (const auto& h : ranks) held = held || HoldsAt(h, layer, step);
        if (!held && !Has(missing, layer)) missing.push_back(layer);
      }
    }
    if (missing_at_newest.empty() && step == *candidates.begin()) missing_at_newest = missing;
    if (!missing.empty()) continue;
    Handover out;
    out.step = step;
    std::vector<int> sends(ranks.size(), 0);
    for (size_t dst = 0; dst < ranks.size(); ++dst) {
      for (const auto& layer : ranks[dst].needs) {
        if (HoldsAt(ranks[dst], layer, step)) continue;  // kept in place
        int best = -1;
        for (size_t src = 0; src < ranks.size(); ++src) {
          if (src == dst || !HoldsAt(ranks[src], layer, step)) continue;
          if (best < 0 || sends[src] < sends[best]) best = static_cast<int>(src);
        }
        if (best < 0) {
          out.reads.push_back({layer, static_cast<int>(dst)});
        } else {
          ++sends[best];
          out.moves.push_back({layer, best, static_cast<int>(dst)});
        }
      }
    }
    if (step == *candidates.begin()) {
      out.reason = absl::StrCat("step ", step, ": the newest step any rank holds");
    } else {
      out.reason =
          absl::StrCat("step ", step, ": no rank holds ", absl::StrJoin(missing_at_newest, ", "),
                       " at step ", *candidates.begin());
    }
    if (!out.reads.empty())
      absl::StrAppend(&out.reason, "; ", out.reads.size(), " layer(s) from the checkpoint");
    return out;
  }
  if (candidates.empty()) {
    return absl::FailedPreconditionError(
        "no rank holds any state and there is no complete checkpoint: nothing to continue from");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "no step has every layer on a live rank or in a complete checkpoint (at step ",
      *candidates.begin(), " nobody holds ", absl::StrJoin(missing_at_newest, ", "), ")"));
}

}  // namespace varuna

#pragma once

// Which state each rank of a morph in place takes, and from where (Note [Handover] in
// handover.cc): the step every rank continues after, the layers that move between live ranks,
// and the layers that only the checkpoint still has.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace varuna {

// What one rank of the new topology brings, by its new rank.
struct RankHoldings {
  // The steps whose state it can hand over (newest first); empty for a joiner.
  std::vector<int64_t> steps;
  std::vector<std::string> layers;  // the layers it holds (its old stage)
  std::vector<std::string> needs;   // the layers its new stage holds
};

struct Handover {
  int64_t step = 0;  // every rank continues after this step
  struct Move {
    std::string layer;
    int src = 0;  // new ranks
    int dst = 0;
  };
  std::vector<Move> moves;  // in a fixed order every rank computes alike
  struct Read {
    std::string layer;
    int dst = 0;
  };
  std::vector<Read> reads;  // from the checkpoint of `step`
  std::string reason;       // one line: why this step
};

// Chooses the newest step at which every layer some rank needs is held by a live rank or is
// in the complete checkpoint `checkpoint_step`; then, for each (rank, layer) it does not hold
// at that step, the holder sending the fewest layers so far (ties: the lower rank), or the
// checkpoint when no rank holds it. FailedPrecondition when no step serves every layer.
absl::StatusOr<Handover> PlanHandover(const std::vector<RankHoldings>& ranks,
                                      std::optional<int64_t> checkpoint_step);

}  // namespace varuna

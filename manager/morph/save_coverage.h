#pragma once

// What the survivors of a stopped generation saved (Note [Saved steps] in
// manager/morph/morph_controller.cc): a pure function of the job's exit records, so the
// relaunch's resume step is decided the same way for every shape (table-tested).

#include <cstdint>
#include <vector>

#include "manager/jobs/job.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

struct SaveCoverage {
  std::vector<int> missing;          // stages of pipeline 0 no saver covers
  int64_t common_step = -1;          // the newest step every stage's savers cover; -1 = none
  int64_t newest_saved = 0;          // the newest step any saver saved
  int64_t committed = 0;             // the newest committed step a survivor reported
  std::vector<v1::SavedStep> saved;  // (rank, step) of each saver
};

// A saver is a rank that exited rescued (kExitRescued) or, after a stop on request, cleanly;
// a rescue may also have written pending layers for the next step, which count where another
// saver saved that step (Note [Rolled rescue] in common/checkpoint/checkpoint_store.cc).
// Heterogeneous pipelines count by segment: a stage is covered by a step when every one of
// its segments is.
SaveCoverage CoverageOf(const Job& job);

}  // namespace varuna

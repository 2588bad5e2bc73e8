#pragma once

// Morph in place, the worker's half (Note [Morph in place] in regroup.cc): a survivor keeps
// its process and state, joins the new generation's rendezvous, and takes the layers of its
// new stage from live ranks (or the checkpoint when no live rank holds them).

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/process_group.h"
#include "worker/varuna.h"

namespace varuna {

struct HandoverStats {
  int64_t step = 0;                   // every rank continues after it
  int64_t moved_bytes = 0;            // received from live ranks
  int64_t checkpoint_bytes_read = 0;  // read from the checkpoint of `step`
  std::string reason;                 // Handover::reason
  double agree_s = 0;                 // offers exchanged, plan made
  double transfer_s = 0;              // layers moved and read, state adopted
};

// Collective over the new world (`groups`, `rank`): every rank offers what `old_engine` (null
// for a joiner) can restore, all agree on the plan (PlanHandover), layers move over
// groups.world, and `engine` (the new stage, optimizer set) adopts the agreed step.
// `ckpt_dir` may be empty (no checkpoint: every layer must be on a live rank).
absl::StatusOr<HandoverStats> HandOver(const Varuna* old_engine, Varuna& engine,
                                       const ProcessGroups& groups, int rank,
                                       const std::string& ckpt_dir);

// Keeps `groups` alive until the process ends: an aborted gloo collective may still run on
// their threads until its own timeout, and destroying them would wait for it (Note [Aborting
// waits] in process_group.h).
void RetireGroups(ProcessGroups groups);

}  // namespace varuna

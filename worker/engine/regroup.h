#pragma once

// Morph in place, the worker's half (Note [Morph in place] in regroup.cc): a survivor keeps
// its process and state, joins the new generation's rendezvous, and takes the layers of its
// new stage from live ranks (or the checkpoint when no live rank holds them).

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "varuna/v1/worker.pb.h"
#include "worker/dist/process_group.h"
#include "worker/engine/varuna.h"

namespace varuna {

// What the agent tells a worker running --in_place about a regroup, posted from the thread
// that reads its commands and taken by the training thread. Thread-safe.
class RegroupMailbox {
 public:
  void Start(bool in_place, int generation);
  bool in_place() const { return in_place_.load(); }
  // A graceful morph (StopCommand.park): after the stop's checkpoint, park, don't exit.
  void ParkOnStop() { park_on_stop_.store(true); }
  bool park_on_stop() const { return park_on_stop_.load(); }
  // The current groups' abort: a posted reconfigure aborts every wait on them at once, so a
  // step blocked on a dead peer returns instead of waiting out timeout_s.
  void SetCurrentAbort(std::shared_ptr<AbortSignal> abort);
  // Takes `r` unless it is for this generation or an older one, and aborts the current waits.
  void Post(const v1::ReconfigureCommand& r);
  bool Pending() const;
  // The posted reconfigure, waiting up to `timeout_s`; nullopt on timeout or once `give_up`.
  std::optional<v1::ReconfigureCommand> Wait(double timeout_s,
                                             const std::atomic<bool>& give_up) const;
  // The regroup into `generation` is done: later commands are for it. One for a later
  // generation posted meanwhile (during the hand-over) stays posted and aborts the current
  // groups, which SetCurrentAbort must already name: the worker regroups again at once.
  void Done(int generation);
  // This process's generation: Start's, then each Done's.
  int generation() const;

 private:
  std::atomic<bool> in_place_{false};
  std::atomic<bool> park_on_stop_{false};
  mutable std::mutex mu_;
  std::optional<v1::ReconfigureCommand> posted_;  // guarded by mu_
  std::shared_ptr<AbortSignal> abort_;            // guarded by mu_
  int generation_ = 0;                            // this process's; guarded by mu_
};

struct HandoverStats {
  int64_t step = 0;                   // every rank continues after it
  int64_t moved_bytes = 0;            // received from live ranks
  int64_t checkpoint_bytes_read = 0;  // read from the checkpoint of `step`
  std::string reason;                 // Handover::reason
  double agree_s = 0;                 // offers exchanged, plan made
  double transfer_s = 0;              // layers moved and read, state adopted
};

// Collective over the new world (`groups`, `rank`): a survivor that missed the newest
// agreement rolls `old_engine` forward with a peer's (Note [Roll forward] in regroup.cc), every
// rank offers what `old_engine` (null for a joiner) can restore, all agree on the plan
// (PlanHandover), layers move over groups.control, and `engine` (the new stage, optimizer set)
// adopts the agreed step.
// `ckpt_dir` may be empty (no checkpoint: every layer must be on a live rank).
absl::StatusOr<HandoverStats> HandOver(Varuna* old_engine, Varuna& engine,
                                       const ProcessGroups& groups, int rank,
                                       const std::string& ckpt_dir);

// Aborts `groups` and destroys them once nothing runs on them (Note [Retired groups] in
// regroup.cc): an aborted gloo collective may still run on their threads until its own
// timeout, and destroying them would wait for it.
void RetireGroups(ProcessGroups groups);
// The retired generations still waiting for an operation (those done are destroyed first).
int RetiredGroupsAlive();

}  // namespace varuna

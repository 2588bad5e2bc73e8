#pragma once

// Fault injection for the commit protocol's tests (Note [Faults] in fault.cc): a worker
// started with VARUNA_FAULT kills, freezes or splits itself at a named point of a named step.
// Production never sets the variable; without it every check is one branch on an empty list.
// No LibTorch: the engine calls Hit() at its points.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace varuna {

enum class FaultPoint {
  kForward,          // before the step's first forward
  kPipeline,         // mid-pipeline: after the first micro-batch's forward
  kBackward,         // before the last backward (the data-parallel buckets are armed)
  kDpAllreduce,      // before the data-parallel gradient all-reduce completes
  kAgreement,        // at the step's agreement all-reduce
  kAfterAgreement,   // the agreement done, the update not begun
  kUpdate,           // inside the optimizer update
  kCheckpointWrite,  // in a periodic checkpoint's write
  kRescueSave,       // in a rescue save
  kFirstStep,        // before the first step of a generation
};

enum class FaultAction {
  kKill,    // SIGKILL itself
  kFreeze,  // SIGSTOP itself: no reset reaches its peers
  kSplit,   // agreement only: the collective completes for the others, this rank acts as if
            // it had failed (Note [Faults])
};

struct Fault {
  FaultPoint point;
  int64_t step = 0;  // the step being taken (1-based); first_step: at least this step
  int rank = 0;
  FaultAction action = FaultAction::kKill;
  int generation = 1;
};

// Parses "POINT@STEP:RANK:ACTION[:GEN][,...]"; InvalidArgument names the bad entry.
absl::StatusOr<std::vector<Fault>> ParseFaults(absl::string_view text);
const char* FaultPointName(FaultPoint p);

// VARUNA_STEP_MIN_MS: every step of this worker lasts at least this many milliseconds (it
// sleeps out the rest). Tests set it in a job's env so that a job outlasts the events they
// stage at any machine speed, while using little CPU. 0 without; InvalidArgument names a bad
// value.
absl::StatusOr<int64_t> StepMinMsFromEnvironment();

class FaultInjector {
 public:
  FaultInjector() = default;
  FaultInjector(std::vector<Fault> faults, int rank, int generation);
  // From VARUNA_FAULT and VARUNA_GENERATION (the agent sets it; 1 without).
  static absl::StatusOr<FaultInjector> FromEnvironment(int rank);

  bool empty() const { return faults_.empty(); }
  // Kills or freezes this process if a fault names this point, step and rank (it does not
  // return then). Returns true for a split at this point (the caller acts it out).
  bool Hit(FaultPoint point, int64_t step) const;

  // Ranks as threads (tests/worker/engine/fault_matrix_test.cc): a kill or a freeze is acted out by
  // `actor` instead of a signal to the whole process. A kill's actor must not return (it
  // throws); a freeze's blocks as long as the test wants and then acts as a kill.
  using Actor = std::function<void(const Fault&)>;
  void set_actor(Actor actor) { actor_ = std::move(actor); }

 private:
  std::vector<Fault> faults_;  // only this rank's, of this generation
  Actor actor_;
};

}  // namespace varuna

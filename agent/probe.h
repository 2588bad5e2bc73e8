#pragma once

// The speed probe (Note [Speed probe] in probe.cc): how fast this machine computes now,
// measured by the agent for the straggler ladder's re-admission
// (manager/stragglers/straggler_controller.h).

#include "absl/time/time.h"

namespace varuna {

// Runs the probe kernel on the calling thread for about `duration` (capped at 5 s; one probe
// at a time per process, a second waits) and returns work units per second of wall clock
// (> 0). Comparable between runs on one machine only.
double RunSpeedProbe(absl::Duration duration);

}  // namespace varuna

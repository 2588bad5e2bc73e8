#pragma once

// A warm standby worker (Note [Standby workers] in standby.cc): `varuna-worker --standby`
// loads LibTorch, then waits on its control pipe for the agent's StartCommand and becomes the
// worker the start file describes, in the same process.

#include "absl/status/status.h"

namespace varuna {

// Waits for the start command (VARUNA_CONTROL_FD), takes the environment, directory and
// log of the launch it stands in for, and runs RunWorker with its arguments.
absl::Status RunStandby();

}  // namespace varuna

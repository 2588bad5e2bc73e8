#pragma once

// The varuna-worker program, as a library function so tests can drive it.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/spec/job_spec.h"
#include "varuna/v1/worker.pb.h"

namespace varuna {

// Runs the worker with `argv` (argv[0] is the program name) and the process environment.
// Returns OK after the last step; any error is a status whose message is one clear line.
absl::Status RunWorker(const std::vector<std::string>& argv);

// Reports `event` to the agent (AppendWorkerEvent, common/launch/worker_channel.h), logging
// a failure: the report is best effort, training goes on without it.
void ReportToAgent(v1::WorkerEvent event);

}  // namespace varuna

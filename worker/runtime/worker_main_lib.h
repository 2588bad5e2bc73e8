#pragma once

// The varuna-worker program, as a library function so tests can drive it.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/launch/launch_args.h"
#include "common/spec/job_spec.h"
#include "worker/dist/process_group.h"
#include "worker/engine/data.h"
#include "worker/models/model.h"
#include "worker/runtime/events.h"

namespace varuna {

// Runs the worker with `argv` (argv[0] is the program name) and the process environment
// (WorkerRun). Returns OK after the last step; any error is a status whose message is one
// clear line.
absl::Status RunWorker(const std::vector<std::string>& argv);

// --profile_out (docs/autoconfig.md "Profiling"): profiles `model` on this rank and the
// links between ranks; rank 0 writes the profile to `out` and reports it.
absl::Status RunProfiler(const JobSpec& spec, int64_t global_batch, Model model, TokenDataset& data,
                         const WorkerTopology& topo, const ProcessGroups& groups,
                         const std::string& out, std::chrono::milliseconds timeout,
                         torch::Device device);

}  // namespace varuna

#pragma once

// The varuna-worker program, as a library function so tests can drive it.

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/spec/job_spec.h"

namespace varuna {

// Runs the worker with `argv` (argv[0] is the program name) and the process environment.
// Returns OK after the last step; any error is a status whose message is one clear line.
absl::Status RunWorker(const std::vector<std::string>& argv);

// `s` as the inside of a JSON string: quotes and backslashes escaped, control characters
// replaced by spaces.
std::string JsonEscape(const std::string& s);

// Appends one line to the progress file the agent reads (VARUNA_PROGRESS_FILE; Note [Progress]).
void AppendProgress(const std::string& line);

// The job's optimizer over `named_params`: AdamW or SGD, weight decay on matrices only.
std::shared_ptr<torch::optim::Optimizer> MakeOptimizer(
    const TrainSpec& train, const std::vector<std::pair<std::string, torch::Tensor>>& named_params);

}  // namespace varuna

#pragma once

// The topology a job spec asks for: the model's ordered modules and the heterogeneous
// pipelines of parallel.pipelines, checked with common/pipeline/pipeline_template.h. Shared by
// varunactl and the manager (at submit) and the worker (worker/engine/heterogeneous.h). No
// LibTorch.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/pipeline/topology.h"
#include "common/spec/job_spec.h"

namespace varuna {

// The ordered module names of a built-in model (ModelLayout flattened: the worker's layer
// names). TorchScript models: Unimplemented here (the worker reads the files).
absl::StatusOr<std::vector<std::string>> BuiltinModules(const ModelSpec& model);
// The segment of each of BuiltinModules (empty for TorchScript).
std::vector<int> BuiltinSegmentOf(const ModelSpec& model);

// The ordered modules of any model kind with `num_segments` segments: BuiltinModules, or
// segment_0 .. segment_{n-1} for TorchScript (one module per segment file).
absl::StatusOr<std::vector<std::string>> ModulesOf(const ModelSpec& model, int num_segments);

// One label per segment: its modules, comma-joined ("model.norm,lm_head"); segment_<i> for
// TorchScript. For stage maps, which are cut in segments.
absl::StatusOr<std::vector<std::string>> SegmentLabels(const ModelSpec& model, int num_segments);

// The topology of spec.parallel.pipelines on `modules` (the model's, see BuiltinModules):
// each entry's template checked, `count` copies laid out in entry order, each reading
// microbatches x parallel.micro_batch samples. With `world_size` > 0 the ranks must match:
// "Number of ranks in pipeline templates (N) does not match world size (W)."
absl::StatusOr<Topology> TopologyFromSpec(const JobSpec& spec,
                                          const std::vector<std::string>& modules,
                                          int world_size = 0,
                                          const std::vector<int>& segment_of = {});

// Ranks the pipelines of spec.parallel.pipelines need (sum of stages x count).
int PipelineRanks(const ParallelSpec& parallel);

}  // namespace varuna

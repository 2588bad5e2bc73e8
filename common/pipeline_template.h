#pragma once

// Pipeline templates (seed 004, Oobleck): a template names the model's modules each stage
// runs, in order. These are the checks a template and a job's parallel.pipelines must pass,
// shared by varunactl/manager (at submit) and the worker (worker/heterogeneous.h), with the
// seed's error texts. No LibTorch.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "common/topology.h"

namespace varuna {

// Model names templates support (ModelSpec::kind).
const std::vector<std::string>& SupportedTemplateModels();
// "Auto policy for NAME is not implemented\n. Supported models are [gpt, mlp, torchscript]"
// (Unimplemented) unless `model_name` is supported.
absl::Status CheckTemplateModel(const std::string& model_name);

// The ordered module names of a built-in model: embed, blocks.0 .. blocks.{n-1}, head (the
// worker's layer names). TorchScript models: Unimplemented here (the worker reads the files).
absl::StatusOr<std::vector<std::string>> BuiltinModules(const ModelSpec& model);

// The ordered modules of any model kind with `num_segments` segments: BuiltinModules, or
// segment_0 .. segment_{n-1} for TorchScript (one module per segment file).
absl::StatusOr<std::vector<std::string>> ModulesOf(const ModelSpec& model, int num_segments);

// Checks `modules_per_stage` against the model's ordered `modules` and returns the stage
// boundaries as segment indices. `segment_of[i]` is the segment of module i (empty: module i
// is segment i); a stage may only end where a segment ends. Errors (InvalidArgument):
//   "Modules in the pipeline template do not match the modules in the model." (+ which)
//   "The first stage must contain the embedding module 'embed'." /
//   "The last stage must contain the head module 'head'."
//   a stage that is empty, or that ends inside a segment.
absl::StatusOr<std::vector<int>> TemplateBoundaries(
    const std::string& model_name, const std::vector<std::string>& modules,
    const std::vector<std::vector<std::string>>& modules_per_stage,
    const std::vector<int>& segment_of = {});

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

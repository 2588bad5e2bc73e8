#pragma once

// Pipeline templates (the Python Varuna API's PipelineTemplate, after Oobleck): a template
// names the model's modules each stage runs, in order. These are the checks a template must
// pass, with that API's error texts; they know nothing of the job spec (common/spec/job_topology.h
// applies them to parallel.pipelines). No LibTorch.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/pipeline/topology.h"

namespace varuna {

// Model names templates support (ModelSpec::kind).
const std::vector<std::string>& SupportedTemplateModels();
// "Auto policy for NAME is not implemented\n. Supported models are [gpt, mlp, torchscript]"
// (Unimplemented) unless `model_name` is supported.
absl::Status CheckTemplateModel(const std::string& model_name);

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

}  // namespace varuna

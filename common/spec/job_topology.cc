#include "common/spec/job_topology.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/pipeline/pipeline_template.h"

namespace varuna {

absl::StatusOr<std::vector<std::string>> BuiltinModules(const ModelSpec& model) {
  RETURN_IF_ERROR(CheckTemplateModel(model.kind));
  ASSIGN_OR_RETURN(auto layout, ModelLayout(model));
  std::vector<std::string> modules;
  for (const auto& segment : layout) modules.insert(modules.end(), segment.begin(), segment.end());
  return modules;
}

std::vector<int> BuiltinSegmentOf(const ModelSpec& model) {
  std::vector<int> segment_of;
  auto layout = ModelLayout(model);
  if (!layout.ok()) return segment_of;
  for (size_t s = 0; s < layout->size(); ++s) {
    segment_of.insert(segment_of.end(), (*layout)[s].size(), static_cast<int>(s));
  }
  return segment_of;
}

absl::StatusOr<std::vector<std::string>> ModulesOf(const ModelSpec& model, int num_segments) {
  if (model.kind != "torchscript") return BuiltinModules(model);
  std::vector<std::string> modules;
  for (int i = 0; i < num_segments; ++i) modules.push_back(absl::StrCat("segment_", i));
  return modules;
}

absl::StatusOr<std::vector<std::string>> SegmentLabels(const ModelSpec& model, int num_segments) {
  if (model.kind == "torchscript") return ModulesOf(model, num_segments);
  ASSIGN_OR_RETURN(auto layout, ModelLayout(model));
  std::vector<std::string> labels;
  for (const auto& segment : layout) labels.push_back(absl::StrJoin(segment, ","));
  return labels;
}

int PipelineRanks(const ParallelSpec& parallel) {
  int64_t n = 0;
  for (const PipelineEntrySpec& e : parallel.pipelines) {
    n += static_cast<int64_t>(e.stages.size()) * e.count;
  }
  return static_cast<int>(std::min<int64_t>(n, kMaxSlots + 1));
}

absl::StatusOr<Topology> TopologyFromSpec(const JobSpec& spec,
                                          const std::vector<std::string>& modules, int world_size,
                                          const std::vector<int>& segment_of) {
  const ParallelSpec& par = spec.parallel;
  if (par.pipelines.empty()) return absl::InvalidArgumentError("parallel.pipelines is empty");
  const int ranks = PipelineRanks(par);
  if (world_size > 0 && ranks != world_size) {
    return absl::InvalidArgumentError(absl::StrCat("Number of ranks in pipeline templates (", ranks,
                                                   ") does not match world size (", world_size,
                                                   ")."));
  }
  // A built-in model's modules group into segments by its layout (gpt2's transformer.wte and
  // transformer.wpe are one segment); the caller's segment_of wins.
  std::vector<int> segments = segment_of;
  if (segments.empty() && spec.model.kind != "torchscript" &&
      modules.size() == BuiltinSegmentOf(spec.model).size()) {
    segments = BuiltinSegmentOf(spec.model);
  }
  std::vector<PipelineLayout> layouts;
  for (size_t i = 0; i < par.pipelines.size(); ++i) {
    const PipelineEntrySpec& e = par.pipelines[i];
    auto bounds = TemplateBoundaries(spec.model.kind, modules, e.stages, segments);
    if (!bounds.ok()) {
      return absl::Status(bounds.status().code(),
                          absl::StrCat("parallel.pipelines[", i, "]: ", bounds.status().message()));
    }
    for (int c = 0; c < e.count; ++c) {
      PipelineLayout p;
      p.boundaries = *bounds;
      p.samples = static_cast<int64_t>(e.microbatches) * par.micro_batch;
      layouts.push_back(std::move(p));
    }
  }
  return Topology::Make(std::move(layouts));
}

}  // namespace varuna

#pragma once

// AutoConfig for tensor-parallel jobs (Note [Tensor-parallel plans] in tp_plan.cc): a node's
// slots in whole tp groups, and a profile measured at tp_size 1 turned into the costs of a
// tp group. No LibTorch.

#include <vector>

#include "absl/status/statusor.h"
#include "common/planner/autoconfig.h"
#include "common/spec/job_spec.h"
#include "varuna/v1/plan.pb.h"

namespace varuna {

// The costs of one tp group of `tp_size` ranks running `profile`'s segments: the blocks'
// compute and parameters divided by tp_size, plus their all-reduces at that group size on one
// host. `model` must be a built-in kind that splits (CheckTensorParallel).
absl::StatusOr<v1::Profile> TensorParallelProfile(const v1::Profile& profile,
                                                  const ModelSpec& model, int tp_size);

// The spec as a job of tp groups: tp_size 1, and resources.min_slots / max_slots (which count
// processes) as groups, ceil(min / T) and floor(max / T).
JobSpec TensorParallelGroupSpec(const JobSpec& spec);

// `status` (when not OK) with its message prefixed by "parallel.tp_size = T, slots counted in
// groups of T on one node: ": a plan of groups explains itself in the job's terms.
absl::Status InTensorParallelGroups(const absl::Status& status, int tp_size);

// Each node's whole tp groups: floor(free slots / tp_size).
std::vector<int> TensorParallelUnits(const std::vector<int>& slots_per_node, int tp_size);

// PlanShapes for spec.parallel.tp_size > 1: the shapes of tp groups, each plan's `slots`
// counting processes (stages x replicas x tp_size) and `tp_size` set.
absl::StatusOr<v1::PlanSet> PlanTensorParallel(const JobSpec& spec, const v1::Profile& profile,
                                               const PlanRequest& request);

// PlanShapes for parallel.tp_size auto (0): every tp_size from 1 up to the most free slots on
// one node that the model splits into (CheckTensorParallel), planned as above and ranked
// together (ties: the smaller tp_size).
absl::StatusOr<v1::PlanSet> PlanTensorParallelSizes(const JobSpec& spec, const v1::Profile& profile,
                                                    const PlanRequest& request);

}  // namespace varuna
